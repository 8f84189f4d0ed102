//! Helpers of the bad-input and Redis-error tests (`redis_errors.rs`, `server_faults.rs`,
//! `names_and_keys.rs`).

use dlm_core::backend::BackendErrorKind;
use dlm_core::{Error, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::{RedisServer, RedisServerBuilder};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Tests that pause servers or assert on timing run one at a time: on a loaded 2-core
/// machine, several blocked or busy servers at once would skew every timing margin.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// "Promptly": a non-transient error must not be retried, so it comes back after one
/// attempt (plus the clean-up release), far below any wait or the 10 s error timeout.
pub const PROMPT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

pub fn spawn(builder: RedisServerBuilder) -> RedisServer {
    dlm_testkit::redis_server::require_redis_server();
    builder.spawn()
}

/// A backend with the calm timeouts of the other Redis tests.
pub fn backend(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .io_timeout(super::CALM)
        .connect_timeout(super::CALM)
        .build()
        .expect("a valid URL and settings")
}

pub fn client(url: &str) -> LockClient {
    LockClient::new(backend(url))
}

/// The lock key of `name` with the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("dlm:{{{name}}}")
}

/// The fencing stream of `name`'s slot, with the default prefix.
pub fn fence_key(name: &str) -> String {
    RedisBackend::new("redis://127.0.0.1:1/")
        .unwrap()
        .keys(name)
        .unwrap()
        .fencing_stream
}

pub fn kind(e: &Error) -> Option<BackendErrorKind> {
    e.backend_kind()
}

/// Asserts that `r` is a backend error of `expected` kind and returns the error.
#[track_caller]
pub fn expect_kind<T: std::fmt::Debug>(
    r: dlm_core::Result<T>,
    expected: BackendErrorKind,
    what: &str,
) -> Error {
    match r {
        Ok(v) => panic!("{what}: expected a {expected:?} error, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(
                kind(&e),
                Some(expected),
                "{what}: wrong error kind; error: {e} / {e:?}"
            );
            e
        }
    }
}

/// Asserts that `r` is `Error::InvalidArgument` naming `argument`.
#[track_caller]
pub fn expect_invalid<T: std::fmt::Debug>(r: dlm_core::Result<T>, argument: &str, what: &str) {
    match r {
        Err(Error::InvalidArgument(a)) => {
            assert_eq!(a.argument(), argument, "{what}: {a}");
        }
        other => panic!("{what}: expected InvalidArgument({argument}), got {other:?}"),
    }
}

/// The text of an error and of its whole `source()` chain, in Display and Debug form.
pub fn error_texts(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("{e}\n{e:?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    out
}

pub fn query<T: redis::FromRedisValue>(con: &mut redis::Connection, cmd: &mut redis::Cmd) -> T {
    cmd.query(con)
        .unwrap_or_else(|e| panic!("admin command failed: {e}"))
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    query(con, redis::cmd("PTTL").arg(key))
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    query::<i64>(con, redis::cmd("EXISTS").arg(key)) == 1
}

/// A field of an `INFO` section.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
}

/// `calls` of one command in `INFO commandstats`.
pub fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = query(con, redis::cmd("INFO").arg("commandstats"));
    let Some(stats) = info_field(&info, &format!("cmdstat_{command}")) else {
        return 0;
    };
    stats
        .split(',')
        .find_map(|kv| kv.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Collects failed expectations so that one run reports every one of them, then fails.
#[derive(Default)]
pub struct Checks(pub Vec<String>);

impl Checks {
    pub fn check(&mut self, ok: bool, failure: String) {
        if !ok {
            self.0.push(failure);
        }
    }

    /// Expects a backend error of `expected` kind.
    pub fn kind<T: std::fmt::Debug>(
        &mut self,
        r: dlm_core::Result<T>,
        expected: BackendErrorKind,
        what: &str,
    ) {
        match r {
            Ok(v) => self
                .0
                .push(format!("{what}: expected {expected:?}, got Ok({v:?})")),
            Err(e) if kind(&e) != Some(expected) => self.0.push(format!(
                "{what}: expected {expected:?}, got {:?}: {e}",
                kind(&e)
            )),
            Err(_) => {}
        }
    }

    /// Expects `start` to be less than [`PROMPT`] ago.
    pub fn prompt(&mut self, start: Instant, what: &str) {
        let elapsed = start.elapsed();
        self.check(elapsed < PROMPT, format!("{what}: took {elapsed:?}"));
    }

    #[track_caller]
    pub fn finish(self) {
        assert!(
            self.0.is_empty(),
            "{} failed expectation(s):\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}
