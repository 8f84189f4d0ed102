//! Bad input and Redis errors against real `redis-server` processes: every failure comes
//! back as the right typed error, promptly, without leaking secrets, and the backend
//! recovers once the fault is gone (see `shared/RELIABILITY.md`, "Bad input and misuse").
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_core::{Error, Lock, LockClient, RetryPolicy};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::{RedisServer, RedisServerBuilder};
use dlm_testkit::unique_name;

/// Tests that pause servers or assert on timing run one at a time: on a loaded 2-core
/// machine, several blocked or busy servers at once would skew every timing margin.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// "Promptly": a non-transient error must not be retried, so it comes back after one
/// attempt (plus the clean-up release), far below any wait or the 10 s error timeout.
const PROMPT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn spawn(builder: RedisServerBuilder) -> RedisServer {
    dlm_testkit::redis_server::require_redis_server();
    builder.spawn()
}

/// A backend with the calm timeouts of the other Redis tests.
fn backend(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .expect("a valid URL and settings")
}

fn client(url: &str) -> LockClient {
    LockClient::new(backend(url))
}

/// The lock key of `name` with the default prefix.
fn lock_key(name: &str) -> String {
    format!("dlm:{{{name}}}")
}

/// The fencing stream of `name`'s slot, with the default prefix.
fn fence_key(name: &str) -> String {
    RedisBackend::new("redis://127.0.0.1:1/")
        .unwrap()
        .keys(name)
        .unwrap()
        .fencing_stream
}

fn kind(e: &Error) -> Option<BackendErrorKind> {
    e.backend_kind()
}

/// Asserts that `r` is a backend error of `expected` kind and returns the error.
#[track_caller]
fn expect_kind<T: std::fmt::Debug>(
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
fn expect_invalid<T: std::fmt::Debug>(r: dlm_core::Result<T>, argument: &str, what: &str) {
    match r {
        Err(Error::InvalidArgument(a)) => {
            assert_eq!(a.argument(), argument, "{what}: {a}");
        }
        other => panic!("{what}: expected InvalidArgument({argument}), got {other:?}"),
    }
}

/// The text of an error and of its whole `source()` chain, in Display and Debug form.
fn error_texts(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("{e}\n{e:?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    out
}

fn query<T: redis::FromRedisValue>(con: &mut redis::Connection, cmd: &mut redis::Cmd) -> T {
    cmd.query(con)
        .unwrap_or_else(|e| panic!("admin command failed: {e}"))
}

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    query(con, redis::cmd("PTTL").arg(key))
}

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    query::<i64>(con, redis::cmd("EXISTS").arg(key)) == 1
}

/// A field of an `INFO` section.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
}

/// `calls` of one command in `INFO commandstats`.
fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
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
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, failure: String) {
        if !ok {
            self.0.push(failure);
        }
    }

    /// Expects a backend error of `expected` kind.
    fn kind<T: std::fmt::Debug>(
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
    fn prompt(&mut self, start: Instant, what: &str) {
        let elapsed = start.elapsed();
        self.check(elapsed < PROMPT, format!("{what}: took {elapsed:?}"));
    }

    #[track_caller]
    fn finish(self) {
        assert!(
            self.0.is_empty(),
            "{} failed expectation(s):\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. Bad URLs and settings: InvalidArgument, before any I/O
// ---------------------------------------------------------------------------------------

#[test]
fn malformed_urls_and_bad_settings_are_invalid_arguments_without_io() {
    let start = Instant::now();
    for url in [
        "not a url",
        "http://x",
        "",
        "redis://:s3cret@127.0.0.1:notaport/",
    ] {
        let r = RedisBackend::new(url);
        expect_invalid(r, "url", &format!("RedisBackend::new({url:?})"));
        let r = RedisBackend::builder(url).build();
        expect_invalid(r, "url", &format!("RedisBackend::builder({url:?})"));
        let r = Redlock::builder(&[url]).verify_distinct(false).build();
        expect_invalid(r, "url", &format!("Redlock::builder([{url:?}])"));
        let r = Redlock::new(&[url]);
        expect_invalid(r, "url", &format!("Redlock::new([{url:?}])"));
    }
    // The rejection of a URL with a password never echoes the URL.
    let e = RedisBackend::new("redis://:s3cret@127.0.0.1:notaport/").unwrap_err();
    let text = error_texts(&e);
    assert!(!text.contains("s3cret"), "password in the error: {text}");
    expect_invalid(Redlock::new::<&str>(&[]), "urls", "Redlock over no nodes");

    // Port 1: nothing listens there. Any I/O would fail with a backend error (after the
    // connect timeout), not InvalidArgument, and would take time.
    let url = "redis://127.0.0.1:1/";
    let b = || RedisBackend::builder(url);
    let r = || Redlock::builder(&[url]).verify_distinct(false);
    let long_prefix = "p".repeat(65);
    for prefix in ["", "a{b", "a}b", "a\nb", long_prefix.as_str()] {
        expect_invalid(b().prefix(prefix).build(), "prefix", &format!("{prefix:?}"));
        expect_invalid(r().prefix(prefix).build(), "prefix", &format!("{prefix:?}"));
    }
    expect_invalid(b().pool_size(0).build(), "pool_size", "pool_size 0");
    expect_invalid(r().pool_size(0).build(), "pool_size", "pool_size 0");
    for factor in [0.5, -0.1, 1.0, f64::NAN, f64::INFINITY] {
        let what = format!("drift_factor {factor}");
        expect_invalid(b().drift_factor(factor).build(), "drift_factor", &what);
        expect_invalid(r().drift_factor(factor).build(), "drift_factor", &what);
    }
    let zero = Duration::ZERO;
    expect_invalid(b().connect_timeout(zero).build(), "timeout", "zero connect");
    expect_invalid(b().io_timeout(zero).build(), "timeout", "zero io");
    expect_invalid(r().connect_timeout(zero).build(), "timeout", "zero connect");
    expect_invalid(r().io_timeout(zero).build(), "timeout", "zero io");

    // The limits themselves are accepted (and still need no server).
    let ok = b()
        .prefix(&"p".repeat(64))
        .pool_size(1)
        .drift_factor(0.0)
        .connect_timeout(Duration::from_millis(1))
        .io_timeout(Duration::from_millis(1))
        .build();
    assert!(ok.is_ok(), "limits rejected: {ok:?}");
    assert!(b().drift_factor(0.49).build().is_ok());

    // Bad lock names are rejected before any I/O too.
    let client = LockClient::new(RedisBackend::new(url).unwrap());
    expect_invalid(client.get_lock(""), "name", "empty name");
    expect_invalid(client.get_lock(&"n".repeat(513)), "name", "513-byte name");
    expect_invalid(client.get_lock("a\0b"), "name", "NUL in name");
    expect_invalid(client.get_lock("a\nb"), "name", "newline in name");

    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "validation took {elapsed:?}: it must not do I/O"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Passwords never leak
// ---------------------------------------------------------------------------------------

#[test]
fn passwords_never_appear_in_errors_debug_output_or_logs() {
    let mark = dlm_testkit::logs::capture();
    const RIGHT: &str = "s3ntinel-pw-XYZ";
    const WRONG: &str = "wrong-s3ntinel";
    let mut checks = Checks::default();
    let server = spawn(RedisServer::builder().password(RIGHT));
    let port = server.port();
    let wrong_url = format!("redis://:{WRONG}@127.0.0.1:{port}/");
    let no_secret = |checks: &mut Checks, what: &str, text: &str| {
        checks.check(
            !text.contains(WRONG) && !text.contains(RIGHT),
            format!("a password in {what}: {text}"),
        );
    };

    let builder = RedisBackend::builder(&wrong_url).io_timeout(common::CALM);
    no_secret(&mut checks, "the builder's Debug", &format!("{builder:?}"));
    let wrong = builder.build().unwrap();
    no_secret(&mut checks, "the backend's Debug", &format!("{wrong:?}"));
    let client = LockClient::new(wrong);
    no_secret(&mut checks, "the client's Debug", &format!("{client:?}"));

    let lock = client.get_lock(&unique_name("pw")).unwrap();
    let r = lock.try_lock();
    if let Err(e) = &r {
        no_secret(&mut checks, "the try_lock error", &error_texts(e));
    }
    checks.kind(r, BackendErrorKind::Auth, "try_lock with a wrong password");
    let r = lock.is_locked();
    if let Err(e) = &r {
        no_secret(&mut checks, "the is_locked error", &error_texts(e));
    }
    checks.kind(r, BackendErrorKind::Auth, "is_locked with a wrong password");

    // Redlock builder, build and errors (one node) do not show it either.
    let rl_builder = Redlock::builder(&[wrong_url.as_str()]);
    no_secret(
        &mut checks,
        "the Redlock builder's Debug",
        &format!("{rl_builder:?}"),
    );
    match rl_builder.build() {
        Ok(rl) => {
            no_secret(&mut checks, "the Redlock's Debug", &format!("{rl:?}"));
            let c = LockClient::new(rl);
            let r = c.get_lock(&unique_name("pw")).unwrap().try_lock();
            if let Err(e) = &r {
                no_secret(&mut checks, "the Redlock error", &error_texts(e));
            }
            checks.kind(
                r,
                BackendErrorKind::Auth,
                "Redlock try_lock, wrong password",
            );
        }
        Err(e) => no_secret(&mut checks, "the Redlock build error", &error_texts(&e)),
    }

    // With the right password everything works, and nothing shows it.
    let right_url = server.url();
    assert!(
        right_url.contains(RIGHT),
        "the fixture URL carries the password"
    );
    let good = backend(&right_url);
    let d = format!("{good:?} {:?}", RedisBackend::builder(&right_url));
    no_secret(&mut checks, "Debug output", &d);
    let client = LockClient::new(good);
    no_secret(&mut checks, "the client's Debug", &format!("{client:?}"));
    let lock = client.get_lock(&unique_name("pw")).unwrap();
    let guard = lock.try_lock().unwrap().expect("a free lock");
    assert!(lock.is_locked().unwrap());
    no_secret(&mut checks, "Debug output", &format!("{guard:?} {lock:?}"));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());

    let logs = mark.lines();
    // The capture works: this test's server and its failed connections were logged.
    assert!(
        logs.iter().any(|l| l.contains(&port.to_string())),
        "nothing about port {port} in {} captured log lines",
        logs.len()
    );
    for line in &logs {
        no_secret(&mut checks, "the log", line);
    }
    checks.finish();
}

// ---------------------------------------------------------------------------------------
// 3. Authentication failures are not retried
// ---------------------------------------------------------------------------------------

#[test]
fn auth_errors_are_returned_at_once_not_retried_for_the_error_timeout() {
    let _serial = serial();
    let mut checks = Checks::default();
    let server = spawn(RedisServer::builder().password("right-pw"));
    let wrong = format!("redis://:wrong-pw@127.0.0.1:{}/", server.port());
    // No password at all (the server requires one): NOAUTH, also Auth.
    let none = format!("redis://127.0.0.1:{}/", server.port());
    for (url, what) in [(wrong, "wrong password"), (none, "no password")] {
        let client = LockClient::new(backend(&url));
        let lock = client.get_lock(&unique_name("auth")).unwrap();
        let start = Instant::now();
        let r = lock.lock();
        let elapsed = start.elapsed();
        checks.kind(r, BackendErrorKind::Auth, &format!("lock() with {what}"));
        checks.check(
            elapsed < Duration::from_secs(3),
            format!(
                "lock() with {what} took {elapsed:?}: an auth failure must not be retried \
                 (error timeout 10 s)"
            ),
        );
    }
    checks.finish();
}

// ---------------------------------------------------------------------------------------
// 4. Foreign keys at the lock name
// ---------------------------------------------------------------------------------------

#[test]
fn foreign_keys_at_the_lock_name_are_reported_not_waited_on() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    // With fencing the single instance acquires with the script; without, with a plain
    // SET ... NX GET: both must spot foreign keys.
    for fencing in [true, false] {
        let client = LockClient::new(
            RedisBackend::builder(&server.url())
                .fencing(fencing)
                .io_timeout(common::CALM)
                .connect_timeout(common::CALM)
                .build()
                .unwrap(),
        );
        foreign_keys_are_reported(&client, &mut admin);
    }
}

fn foreign_keys_are_reported(client: &LockClient, admin: &mut redis::Connection) {
    // A list.
    let list = unique_name("list");
    let _: i64 = query(admin, redis::cmd("LPUSH").arg(lock_key(&list)).arg("x"));
    let lock = client.get_lock(&list).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::UnexpectedKey, "list at the lock name");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::UnexpectedKey,
        "is_locked",
    );
    let r = lock.remaining_lease();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "remaining_lease");
    let r = lock.force_unlock();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "force_unlock on a list");
    let len: i64 = query(admin, redis::cmd("LLEN").arg(lock_key(&list)));
    assert_eq!(len, 1, "the foreign list was modified");
    assert_eq!(pttl(admin, &lock_key(&list)), -1);
    // (The counter next to it may have counted the refused attempts: it is dlm's own key,
    // and no token was handed out.)

    // A string without expiry (not written by dlm).
    let plain = unique_name("plain");
    let _: () = query(admin, redis::cmd("SET").arg(lock_key(&plain)).arg("v"));
    let lock = client.get_lock(&plain).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::UnexpectedKey, "string without TTL");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::UnexpectedKey,
        "is_locked",
    );
    let r = lock.remaining_lease();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "remaining_lease");
    let value: String = query(admin, redis::cmd("GET").arg(lock_key(&plain)));
    assert_eq!(value, "v", "the foreign value was modified");
    assert_eq!(pttl(admin, &lock_key(&plain)), -1, "an expiry was set");

    // A blocking lock() is not stuck on it either (not transient: no retries).
    let start = Instant::now();
    expect_kind(lock.lock(), BackendErrorKind::UnexpectedKey, "lock()");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());

    // A hash too.
    let hash = unique_name("hash");
    let _: i64 = query(
        admin,
        redis::cmd("HSET").arg(lock_key(&hash)).arg("f").arg("v"),
    );
    let lock = client.get_lock(&hash).unwrap();
    expect_kind(lock.try_lock(), BackendErrorKind::UnexpectedKey, "hash");
    let r = lock.force_unlock();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "force_unlock on a hash");
    assert!(exists(admin, &lock_key(&hash)));
}

// ---------------------------------------------------------------------------------------
// 5. OOM
// ---------------------------------------------------------------------------------------

#[test]
fn out_of_memory_is_reported_as_out_of_memory() {
    let _serial = serial();
    let server = spawn(
        RedisServer::builder()
            .arg("--maxmemory-policy")
            .arg("noeviction"),
    );
    let mut admin = server.connection();
    let client = client(&server.url());
    let name = unique_name("oom");
    let lock = client.get_lock(&name).unwrap();
    // Warm up: the connection exists before memory runs out.
    let warm = lock.try_lock().unwrap().expect("free");
    let first = warm.fencing_token().expect("fenced");
    warm.unlock().unwrap();

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1"),
    );
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    let e = expect_kind(r, BackendErrorKind::OutOfMemory, "acquire at maxmemory 1");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert!(!e.is_transient());
    assert!(
        !exists(&mut admin, &lock_key(&name)),
        "a lock key was written"
    );
    // A name in another slot as well (its fencing stream does not exist yet).
    let fresh = client.get_lock(&unique_name("oom")).unwrap();
    expect_kind(
        fresh.try_lock(),
        BackendErrorKind::OutOfMemory,
        "fresh name",
    );

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"),
    );
    let guard = lock.try_lock().unwrap().expect("free again after the OOM");
    assert!(
        guard.fencing_token() > Some(first),
        "tokens go on increasing"
    );
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 6. READONLY
// ---------------------------------------------------------------------------------------

#[test]
fn a_read_only_replica_is_reported_as_read_only() {
    let _serial = serial();
    let master = spawn(RedisServer::builder());
    let replica = spawn(RedisServer::builder());
    let mut admin = replica.connection();
    let _: () = query(
        &mut admin,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master.port()),
    );
    common::wait_until(Duration::from_secs(10), "replica link up", || {
        let info: String = query(&mut admin, redis::cmd("INFO").arg("replication"));
        info_field(&info, "master_link_status").as_deref() == Some("up")
    });

    let client = client(&replica.url());
    let lock = client.get_lock(&unique_name("ro")).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::ReadOnly, "acquire on a replica");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    // Reads still work on a replica.
    assert!(!lock.is_locked().unwrap());

    // The master takes locks, and the replica then sees them.
    let on_master = self::client(&master.url());
    let name = unique_name("ro");
    let guard = on_master
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .unwrap();
    let on_replica = client.get_lock(&name).unwrap();
    common::wait_until(Duration::from_secs(5), "replicated lock", || {
        on_replica.is_locked().unwrap()
    });
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 7. NOPERM
// ---------------------------------------------------------------------------------------

#[test]
fn acl_denials_are_reported_as_permission_errors() {
    let _serial = serial();
    let mut checks = Checks::default();
    let server = spawn(
        RedisServer::builder()
            .acl_user("noeval", "on >pw1 ~* &* +@all -evalsha -eval")
            .acl_user("otherkeys", "on >pw2 ~other:* &* +@all")
            .acl_user("noload", "on >pw3 ~* &* +@all -script")
            .acl_user("noget", "on >pw4 ~* &* +@all -get")
            .acl_user("noset", "on >pw5 ~* &* +@all -set")
            .acl_user("noxadd", "on >pw6 ~* &* +@all -xadd")
            .credentials("noeval", "pw1"),
    );
    let port = server.port();
    let url = |user: &str, pw: &str| format!("redis://{user}:{pw}@127.0.0.1:{port}/");
    assert_eq!(server.url(), url("noeval", "pw1"));
    let mut admin = server.connection();

    // Scripts denied (not loaded yet and the NOSCRIPT fallback, SCRIPT LOAD, denied; or
    // EVALSHA and EVAL denied, checked by the server before the script runs): a fenced
    // acquisition is the acquire script, so it is refused at once and leaves no key.
    for (user, pw, what) in [
        ("noload", "pw3", "SCRIPT LOAD denied"),
        ("noeval", "pw1", "EVALSHA denied"),
    ] {
        let name = unique_name("perm");
        let lock = client(&url(user, pw)).get_lock(&name).unwrap();
        let start = Instant::now();
        checks.kind(
            lock.try_lock_timeout(Duration::from_secs(5)),
            BackendErrorKind::Permission,
            &format!("a fenced acquisition, {what}"),
        );
        checks.prompt(start, &format!("a fenced acquisition, {what}"));
        checks.check(
            !exists(&mut admin, &lock_key(&name)),
            format!("{what}: a denied acquisition left a lock key"),
        );
    }
    // Scripts or GET denied without fencing, and GET denied with it (the scripts read
    // the holder with GET). Taking a free lock needs neither (the plain SET NX; with
    // fencing, the acquire script finds the lock free and never reads it), so it
    // succeeds; the denial shows at the first call that needs one (inspect, release): it
    // is reported at once, and the key keeps its lease, so nothing is left behind for
    // good.
    for (user, pw, what, fencing) in [
        ("noload", "pw3", "SCRIPT LOAD denied", false),
        ("noeval", "pw1", "EVALSHA denied", false),
        ("noget", "pw4", "GET denied", false),
        ("noget", "pw4", "GET denied, fenced", true),
    ] {
        let name = unique_name("perm");
        let c = LockClient::new(
            RedisBackend::builder(&url(user, pw))
                .io_timeout(common::CALM)
                .fencing(fencing)
                .build()
                .unwrap(),
        );
        let lock = c
            .get_lock(&name)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap();
        match lock.try_lock_timeout(Duration::from_secs(5)) {
            Ok(Some(guard)) => {
                checks.check(
                    guard.fencing_token().is_some() == fencing,
                    format!("{what}: fencing token {:?}", guard.fencing_token()),
                );
                checks.kind(
                    lock.is_locked(),
                    BackendErrorKind::Permission,
                    &format!("is_locked, {what}"),
                );
                let start = Instant::now();
                checks.kind(
                    guard.unlock(),
                    BackendErrorKind::Permission,
                    &format!("unlock, {what}"),
                );
                checks.prompt(start, &format!("unlock, {what}"));
                let ttl: i64 = query(&mut admin, redis::cmd("PTTL").arg(lock_key(&name)));
                checks.check(
                    (1..=30_000).contains(&ttl),
                    format!("{what}: the unreleasable key must keep its lease, PTTL {ttl}"),
                );
                let _: i64 = query(&mut admin, redis::cmd("DEL").arg(lock_key(&name)));
            }
            other => checks.0.push(format!("{what}: a free lock: got {other:?}")),
        }
    }

    // Keys outside the user's patterns (checked against KEYS before the script runs).
    let c = client(&url("otherkeys", "pw2"));
    let lock = c.get_lock(&unique_name("perm")).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    checks.kind(r, BackendErrorKind::Permission, "key pattern denied");
    checks.prompt(start, "key pattern denied");
    checks.kind(
        lock.is_locked(),
        BackendErrorKind::Permission,
        "is_locked, keys denied",
    );
    let r = lock.force_unlock();
    checks.kind(r, BackendErrorKind::Permission, "force_unlock, keys denied");

    // SET or XADD denied: refused inside the acquire script; a SET that ran is undone.
    let name = unique_name("perm");
    for (user, pw, what) in [
        ("noset", "pw5", "SET denied"),
        ("noxadd", "pw6", "XADD denied"),
    ] {
        let c = client(&url(user, pw));
        let lock = c.get_lock(&name).unwrap();
        let start = Instant::now();
        let r = lock.try_lock_timeout(Duration::from_secs(5));
        checks.kind(r, BackendErrorKind::Permission, what);
        checks.prompt(start, what);
        checks.check(
            !exists(&mut admin, &lock_key(&name)),
            format!("{what}: a denied acquisition left a lock key"),
        );
    }
    checks.finish();
}

/// dlm-redis/src/lib.rs, "Minimal ACL", with the default prefix.
const MINIMAL_ACL: &str = "+eval +evalsha +script|load +ping +info +get +set +pexpire +pttl +xadd +append +del +publish +psubscribe ~dlm:* &dlm:*";

/// Locks and unlocks one name four times as a user with `rules`, another client trying
/// each time; returns the tokens.
fn lock_as_user_with(rules: &str) -> Vec<u64> {
    let server = spawn(
        RedisServer::builder()
            .acl_user("user", &format!("on >pw {rules}"))
            .credentials("user", "pw"),
    );
    let url = server.url();
    let (c1, c2) = (client(&url), client(&url));
    let name = unique_name("perm");
    let lock = c1.get_lock(&name).unwrap();
    let mut tokens = Vec::new();
    for round in 0..4 {
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{rules}: must be enough to lock: {e}"))
            .expect("free");
        tokens.push(guard.fencing_token().expect("fenced").get());
        assert!(lock.is_locked().unwrap());
        assert!(
            c2.get_lock(&name).unwrap().try_lock().unwrap().is_none(),
            "round {round}: two holders"
        );
        guard.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must increase: {tokens:?}"
    );
    let mut admin = server.connection();
    assert!(!exists(&mut admin, &lock_key(&name)));
    tokens
}

#[test]
fn the_documented_minimal_acl_is_enough_to_lock() {
    let tokens = lock_as_user_with(MINIMAL_ACL);
    assert_eq!(tokens.len(), 4);
}

// ---------------------------------------------------------------------------------------
// 8. BUSY
// ---------------------------------------------------------------------------------------

#[test]
fn a_server_busy_with_a_long_script_is_reported_as_busy_and_recovers() {
    let _serial = serial();
    let server = spawn(
        RedisServer::builder()
            .arg("--busy-reply-threshold")
            .arg("100"),
    );
    let client = client(&server.url());
    let name = unique_name("busy");
    let lock = client.get_lock(&name).unwrap();
    // Warm up the pool, and open the admin and probe connections before the server blocks.
    let warm = lock.try_lock().unwrap().expect("free");
    let first = warm.fencing_token().expect("fenced");
    warm.unlock().unwrap();
    let mut admin = server.connection();
    let mut probe = server.connection();
    let mut looper = server.connection();

    let script = thread::spawn(move || {
        redis::cmd("EVAL")
            .arg("local i = 0 while true do i = i + 1 end")
            .arg(0)
            .query::<()>(&mut looper)
    });
    common::wait_until(Duration::from_secs(10), "PING answered BUSY", || {
        let reply = redis::cmd("PING").query::<String>(&mut probe);
        reply.is_err_and(|e| e.code() == Some("BUSY"))
    });

    let start = Instant::now();
    let e = expect_kind(
        lock.try_lock(),
        BackendErrorKind::Busy,
        "try_lock while BUSY",
    );
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert!(e.is_transient(), "Busy is transient");
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::Busy,
        "is_locked while BUSY",
    );

    let _: () = query(&mut admin, redis::cmd("SCRIPT").arg("KILL"));
    let outcome = script.join().expect("the script thread");
    assert!(outcome.is_err(), "the killed script must end with an error");
    common::wait_until(Duration::from_secs(5), "PONG after SCRIPT KILL", || {
        redis::cmd("PING").query::<String>(&mut probe).is_ok()
    });

    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free after the script was killed");
    assert!(guard.fencing_token() > Some(first));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

// ---------------------------------------------------------------------------------------
// 9. Max clients
// ---------------------------------------------------------------------------------------

#[test]
fn max_clients_reached_is_reported_as_unavailable_and_recovers() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxclients").arg("1"),
    );
    let client = client(&server.url());
    let lock = client.get_lock(&unique_name("maxc")).unwrap();
    let start = Instant::now();
    let e = expect_kind(
        lock.try_lock(),
        BackendErrorKind::Unavailable,
        "max clients",
    );
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert!(e.is_transient());

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxclients").arg("100"),
    );
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free once clients are allowed again");
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 10. Paused server
// ---------------------------------------------------------------------------------------

#[test]
fn a_paused_server_fails_calls_within_the_deadline_and_recovers_cleanly() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    // One pooled connection: a timed-out connection that went back into the pool would be
    // the one the next call uses, and would read the late reply of the earlier command.
    let backend: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::builder(&server.url())
            .pool_size(1)
            .io_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(3))
        .retry(RetryPolicy::new().error_timeout(Duration::from_millis(500)))
        .build()
        .unwrap();
    let name = unique_name("pause");
    let lock = client.get_lock(&name).unwrap();
    let guard = lock.try_lock().unwrap().expect("free");
    let mut last_token = guard.fencing_token().unwrap().get();
    guard.unlock().unwrap();

    server.pause();
    let start = Instant::now();
    let r = lock.try_lock();
    let elapsed = start.elapsed();
    let e = r.expect_err("a paused server cannot grant a lock");
    assert!(
        matches!(
            kind(&e),
            Some(BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "expected Timeout or Unavailable, got {e:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "try_lock took {elapsed:?}"
    );
    // A blocking lock() gives up after the error timeout instead of hanging.
    let start = Instant::now();
    let e = lock
        .lock()
        .expect_err("a paused server cannot grant a lock");
    let elapsed = start.elapsed();
    assert!(
        matches!(
            kind(&e),
            Some(BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "expected Timeout or Unavailable, got {e:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "lock() took {elapsed:?}");
    let start = Instant::now();
    assert!(lock.is_locked().is_err(), "inspect on a paused server");
    assert!(start.elapsed() < Duration::from_secs(2));
    server.resume();

    // The same client and name: whatever the requests queued during the pause did, the
    // lock is ours or free, and every cycle works.
    for i in 0..5 {
        let guard = lock
            .try_lock_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cycle {i} after resume: {e:?}"))
            .unwrap_or_else(|| panic!("cycle {i} after resume: not acquired"));
        let token = guard.fencing_token().unwrap().get();
        assert!(
            token >= last_token,
            "cycle {i}: token {token} after {last_token}"
        );
        assert!(
            i == 0 || token > last_token,
            "cycle {i}: token {token} repeated"
        );
        last_token = token;
        assert!(lock.is_locked().unwrap());
        guard.unlock().unwrap();
    }
    // A fresh name through the same single pooled connection: exact answers, so a stale
    // reply (an array for an integer, another name's token) would show.
    let other = LockClient::builder(backend).build().unwrap();
    let fresh = other.get_lock(&unique_name("pause")).unwrap();
    // Tokens are ordered per name (this one may be in another slot, with another stream).
    let mut last_token = 0;
    for _ in 0..5 {
        assert!(!fresh.is_locked().unwrap());
        assert_eq!(fresh.remaining_lease().unwrap(), None);
        let guard = fresh.try_lock().unwrap().expect("free");
        let token = guard.fencing_token().unwrap().get();
        assert!(token > last_token, "token {token} after {last_token}");
        last_token = token;
        let remaining = fresh.remaining_lease().unwrap().expect("held");
        assert!(remaining <= Duration::from_secs(30) && remaining > Duration::from_secs(20));
        guard.unlock().unwrap();
    }
    assert!(!fresh.is_locked().unwrap());
}

// ---------------------------------------------------------------------------------------
// 11. Server down at construction
// ---------------------------------------------------------------------------------------

#[test]
fn a_server_down_at_construction_fails_calls_not_construction() {
    let _serial = serial();
    let mut server = spawn(RedisServer::builder());
    let url = server.url();
    server.kill();

    let start = Instant::now();
    let backend = RedisBackend::builder(&url)
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .build()
        .expect("construction does no I/O");
    assert!(start.elapsed() < Duration::from_millis(500));
    let client = LockClient::new(backend);
    let lock = client.get_lock(&unique_name("down")).unwrap();
    let start = Instant::now();
    expect_kind(
        lock.try_lock(),
        BackendErrorKind::Unavailable,
        "server down",
    );
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    expect_kind(lock.is_locked(), BackendErrorKind::Unavailable, "is_locked");

    // Redlock: unreachable nodes are not checked at build; calls report no quorum.
    let rl = Redlock::builder(&[url.as_str()])
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .build()
        .expect("unreachable nodes do not fail construction");
    let rl_client = LockClient::new(rl);
    let rl_lock = rl_client.get_lock(&unique_name("down")).unwrap();
    let start = Instant::now();
    expect_kind(
        rl_lock.try_lock(),
        BackendErrorKind::NoQuorum,
        "Redlock down",
    );
    assert!(start.elapsed() < Duration::from_secs(3));

    // Once the server is up, the same backend works.
    server.restart();
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free once the server is up");
    assert!(guard.fencing_token().is_some());
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 12. Pool exhaustion
// ---------------------------------------------------------------------------------------

#[test]
fn waiters_hold_no_pooled_connection_so_the_holder_can_release() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let backend: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::builder(&server.url())
            .pool_size(1)
            .connect_timeout(Duration::from_secs(1))
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let a = LockClient::builder(backend.clone()).build().unwrap();
    let b = LockClient::builder(backend.clone()).build().unwrap();
    let name = unique_name("pool");
    let guard = a
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");

    let mut admin = server.connection();
    let before = command_calls(&mut admin, "evalsha");
    let unlocked = Arc::new(AtomicBool::new(false));
    let waiter = {
        let lock = b.get_lock(&name).unwrap();
        let unlocked = unlocked.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let r = lock.try_lock_timeout(Duration::from_secs(3));
            let saw_unlock = unlocked.load(Ordering::SeqCst);
            let token = match &r {
                Ok(Some(g)) => g.fencing_token().map(|t| t.get()),
                _ => None,
            };
            (r.map(|g| g.is_some()), start.elapsed(), saw_unlock, token)
        })
    };
    // B has tried at least twice: it found the lock held and is in its wait loop.
    common::wait_until(Duration::from_secs(2), "B's attempts", || {
        command_calls(&mut admin, "evalsha") >= before + 2
    });
    let start = Instant::now();
    unlocked.store(true, Ordering::SeqCst);
    let r = guard.unlock();
    let unlock_took = start.elapsed();
    assert!(
        r.is_ok(),
        "the holder could not release while B waited: {r:?}"
    );
    assert!(
        unlock_took < Duration::from_secs(1),
        "unlock took {unlock_took:?}"
    );

    let (acquired, waited, saw_unlock, token) = waiter.join().unwrap();
    assert!(acquired.unwrap(), "B did not get the lock within 3 s");
    assert!(saw_unlock, "B acquired before A released");
    // A had 1; B's refused attempts counted too.
    assert!(token.is_some_and(|t| t >= 2), "B's token {token:?}");
    assert!(waited < Duration::from_secs(3), "B waited {waited:?}");
}

// ---------------------------------------------------------------------------------------
// 13. Odd names
// ---------------------------------------------------------------------------------------

#[test]
fn odd_names_lock_unlock_and_never_collide() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let _: () = query(&mut admin, redis::cmd("SET").arg("canary").arg("alive"));
    let url = server.url();
    let c1 = client(&url);
    let c2 = client(&url);

    let tag = unique_name("n");
    let long_ascii = format!("{tag}-{}", "L".repeat(512 - tag.len() - 1));
    let long_utf8 = "é".repeat(256);
    let names = [
        "x:fence".to_owned(),
        "x:released".to_owned(),
        "}{".to_owned(),
        "{".to_owned(),
        "}".to_owned(),
        "{x}".to_owned(),
        "return redis.call('FLUSHALL')".to_owned(),
        "'; redis.call('FLUSHALL') --".to_owned(),
        "dlm:{x}".to_owned(),
        "*".to_owned(),
        "a b c".to_owned(),
        "ключ-🔒-名前".to_owned(),
        long_ascii,
        long_utf8,
    ];
    for name in &names {
        assert!(name.len() <= 512, "{name:?}");
        let lock = c1.get_lock(name).unwrap();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{name:?}: {e:?}"))
            .unwrap_or_else(|| panic!("{name:?}: not acquired"));
        let first = guard.fencing_token().expect("fenced");
        let key = lock_key(name);
        let ttl = pttl(&mut admin, &key);
        assert!(ttl > 0, "{name:?}: key {key:?} has PTTL {ttl}");
        assert!(lock.is_locked().unwrap(), "{name:?}");
        // Another owner is excluded.
        let other = c2.get_lock(name).unwrap();
        assert!(other.try_lock().unwrap().is_none(), "{name:?}: two holders");
        guard.unlock().unwrap_or_else(|e| panic!("{name:?}: {e:?}"));
        assert!(!exists(&mut admin, &key), "{name:?}: key left behind");
        assert!(!lock.is_locked().unwrap(), "{name:?}");
        let g = other.try_lock().unwrap().expect("free after unlock");
        let next = g.fencing_token().expect("fenced");
        assert!(next.get() > first.get(), "{name:?}: {next} after {first}");
        g.unlock().unwrap();
    }
    let canary: Option<String> = query(&mut admin, redis::cmd("GET").arg("canary"));
    assert_eq!(canary.as_deref(), Some("alive"), "a name ran as code");

    // Names that look like another lock's internal keys are independent locks.
    let base = unique_name("a");
    let lookalikes = [
        base.clone(),
        format!("{base}:fence"),
        format!("{base}}}:fence"),
        format!("{base}:released"),
        format!("{base}}}:released"),
        format!("{base}}}"),
        format!("{{{base}"),
    ];
    let clients: Vec<LockClient> = lookalikes.iter().map(|_| client(&url)).collect();
    let guards: Vec<_> = lookalikes
        .iter()
        .zip(&clients)
        .map(|(name, c)| {
            c.get_lock(name)
                .unwrap()
                .try_lock()
                .unwrap_or_else(|e| panic!("{name:?}: {e:?}"))
                .unwrap_or_else(|| panic!("{name:?} collided with another name"))
        })
        .collect();
    for (name, c) in lookalikes.iter().zip(&clients) {
        assert!(c.get_lock(name).unwrap().is_locked().unwrap(), "{name:?}");
        let key = lock_key(name);
        assert!(pttl(&mut admin, &key) > 0, "{key:?}");
        assert!(pttl(&mut admin, &fence_key(name)) > 0, "{name:?}");
    }
    for g in guards {
        g.unlock().unwrap();
    }
    for name in &lookalikes {
        assert!(!exists(&mut admin, &lock_key(name)), "{name:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 14. Key layout, TTLs and fencing tokens
// ---------------------------------------------------------------------------------------

#[test]
fn every_key_has_a_ttl_and_tokens_increase() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let url = server.url();
    let c1 = client(&url);
    let c2 = client(&url);
    let name = unique_name("job");
    let key = lock_key(&name);
    let fence = fence_key(&name);
    assert_eq!(
        backend(&url).keys(&name).unwrap(),
        dlm_redis::Redlock::new(&[url.as_str()])
            .unwrap()
            .keys(&name)
            .unwrap(),
        "one layout for both backends"
    );

    let guard = c1.get_lock(&name).unwrap().lock().unwrap();
    let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&key));
    assert_eq!(kind, "string");
    let ttl = pttl(&mut admin, &key);
    assert!(ttl > 0 && ttl <= 30_000, "{key}: PTTL {ttl}");
    let value: String = query(&mut admin, redis::cmd("GET").arg(&key));
    assert!(!value.is_empty());
    assert!(!value.contains(&name), "the owner token is not the name");
    let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&fence));
    assert_eq!(kind, "stream");
    let fence_ttl = pttl(&mut admin, &fence);
    assert!(
        fence_ttl > 23 * 3600 * 1000 && fence_ttl <= 24 * 3600 * 1000,
        "the fencing stream keeps the default fence TTL of 24 h: PTTL {fence_ttl}"
    );
    let first = guard.fencing_token().unwrap().get();
    guard.unlock().unwrap();
    assert!(
        !exists(&mut admin, &key),
        "the lock key outlived the unlock"
    );

    let mut tokens = vec![first];
    for c in [&c2, &c1, &c2] {
        let g = c.get_lock(&name).unwrap().lock().unwrap();
        tokens.push(g.fencing_token().unwrap().get());
        assert!(pttl(&mut admin, &key) > 0);
        g.unlock().unwrap();
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let keys: Vec<String> = query(&mut admin, redis::cmd("KEYS").arg("dlm:*"));
    assert_eq!(
        keys,
        std::slice::from_ref(&fence),
        "only the fencing stream stays"
    );

    // Re-entry reuses the acquisition: same token, no new draw.
    let lock = c1.get_lock(&name).unwrap();
    let g1 = lock.lock().unwrap();
    let g2 = lock.lock().unwrap();
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    assert!(g1.fencing_token().unwrap().get() > tokens[3]);
    drop(g2);
    assert!(exists(&mut admin, &key));
    drop(g1);
    assert!(!exists(&mut admin, &key));

    // Fencing off: no stream, no tokens.
    let _: i64 = query(&mut admin, redis::cmd("DEL").arg(&fence));
    let unfenced = LockClient::new(
        RedisBackend::builder(&url)
            .fencing(false)
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let g = unfenced.get_lock(&name).unwrap().lock().unwrap();
    assert_eq!(g.fencing_token(), None);
    assert!(pttl(&mut admin, &key) > 0);
    assert!(!exists(&mut admin, &fence));
    g.unlock().unwrap();
    assert!(!exists(&mut admin, &key));
}

#[test]
fn a_fencing_stream_of_another_type_is_reported_and_no_lock_is_kept() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let c = client(&server.url());
    for what in ["a string", "a list"] {
        let name = unique_name("badfence");
        let fence = fence_key(&name);
        let _: redis::Value = match what {
            "a string" => query(&mut admin, redis::cmd("SET").arg(&fence).arg("x")),
            _ => query(&mut admin, redis::cmd("RPUSH").arg(&fence).arg("x")),
        };
        let lock = c.get_lock(&name).unwrap();
        let start = Instant::now();
        expect_kind(
            lock.try_lock_timeout(Duration::from_secs(5)),
            BackendErrorKind::UnexpectedKey,
            what,
        );
        assert!(
            start.elapsed() < PROMPT,
            "{what}: took {:?}",
            start.elapsed()
        );
        assert!(
            !exists(&mut admin, &lock_key(&name)),
            "{what}: a lock without a token was kept"
        );
        let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&fence));
        assert_ne!(kind, "stream", "{what}: the foreign key was replaced");
        let _: i64 = query(&mut admin, redis::cmd("DEL").arg(&fence));
    }
}

// ---------------------------------------------------------------------------------------
// 15. A leftover key with a TTL only delays
// ---------------------------------------------------------------------------------------

#[test]
fn a_leftover_key_with_a_ttl_only_delays_the_acquisition() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let client = client(&server.url());
    let name = unique_name("left");
    let lock = client.get_lock(&name).unwrap();
    // Warm up on another name so that the measured wait is the key's, not a connect.
    let warm = client.get_lock(&unique_name("warm")).unwrap();
    warm.try_lock().unwrap().unwrap().unlock().unwrap();

    let start = Instant::now();
    let _: () = query(
        &mut admin,
        redis::cmd("SET")
            .arg(lock_key(&name))
            .arg("other")
            .arg("PX")
            .arg(300),
    );
    assert!(lock.is_locked().unwrap());
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("acquired once the leftover key expired");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "acquired after {waited:?}, before the leftover key expired"
    );
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    let value: String = query(&mut admin, redis::cmd("GET").arg(lock_key(&name)));
    assert_ne!(value, "other");
    // The token is the stream's latest ID.
    assert_eq!(
        guard.fencing_token().map(|t| t.get()),
        Some(common::last_fence_token(&server, &fence_key(&name)))
    );
    guard.unlock().unwrap();
    assert!(!exists(&mut admin, &lock_key(&name)));
}
