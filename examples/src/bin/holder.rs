//! Takes one lock and holds it, renewed by the watchdog, until told otherwise on stdin: a
//! process to crash, stop or starve in tests and demonstrations of what a lock does when
//! its holder misbehaves.
//!
//! ```text
//! holder --redis URL[,URL...] --name NAME [--watchdog SECS (30)] [--key KEY]
//! holder --etcd URL[,URL...] --name NAME [--watchdog SECS (30)]
//! holder --postgres URL --name NAME [--watchdog SECS (30)]
//! ```
//! With `--elect VALUE`, it campaigns in the election NAME (publishing VALUE) instead of
//! taking the lock NAME, and holds the lead the same way (its token is the term).
//! Prints `held <token>` once the lock is taken, then answers each line of stdin:
//! - `check`: `held` or `lost` (`LockGuard::ensure_held`: local knowledge, no I/O);
//! - `write VALUE`: writes VALUE to the Redis hash KEY through the fencing check
//!   (`dlm_redis::fenced_set`) with the lock's token, whether or not the lock is still
//!   held (as a holder that does not check would): `written` or `refused` (with
//!   `--redis` only; with `--etcd` or `--postgres` the test writes through its own
//!   fencing check);
//! - `unlock`: releases the lock, prints `unlocked` or `unlock failed: ...`, and exits.
//!
//! End of input releases the lock and exits too.

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_examples::{Args, seconds};
use dlm_redis::{FencedWriteError, redis};

fn main() -> ExitCode {
    let mut args = Args::from_env(
        "holder",
        "(--redis URL[,URL...] | --etcd URL[,URL...] | --postgres URL) --name NAME [--watchdog SECS (30)] [--key KEY] [--elect VALUE]",
    );
    let first_url = args
        .peek("--redis")
        .and_then(|u| u.split(',').next().map(str::to_owned));
    if first_url.is_none() && args.peek("--etcd").is_none() && args.peek("--postgres").is_none() {
        args.fail("--redis, --etcd or --postgres is required");
    }
    let backend = args.backend();
    let Some(name) = args.value("--name") else {
        args.fail("--name is required");
    };
    let watchdog = seconds(args.parsed("--watchdog", 30.0));
    let key = args
        .value("--key")
        .unwrap_or_else(|| format!("{name}:value"));
    let elect = args.value("--elect");
    args.finish();
    let client = match LockClient::builder(backend)
        .watchdog_timeout(watchdog)
        .build()
    {
        Ok(client) => client,
        Err(e) => args.fail(&format!("--watchdog: {e}")),
    };
    let wait = Duration::from_secs(30);
    let taken = match &elect {
        Some(value) => client.get_election(&name).and_then(|e| {
            e.try_campaign_timeout(value, wait)
                .map(|lead| lead.map(dlm_core::Leadership::into_guard))
        }),
        None => client
            .get_lock(&name)
            .and_then(|l| l.try_lock_timeout(wait)),
    };
    let guard = match taken {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            eprintln!("timed out waiting for the lock");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("lock failed: {e}");
            return ExitCode::from(2);
        }
    };
    let token = guard.fencing_token().expect("fencing is on");
    println!("held {token}");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (command, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match command {
            "check" => println!("{}", if guard.is_held() { "held" } else { "lost" }),
            "write" => {
                let Some(first_url) = &first_url else {
                    println!("write failed: needs --redis");
                    continue;
                };
                let written = redis::Client::open(first_url.as_str())
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())
                    .and_then(|mut con| {
                        match dlm_redis::fenced_set(&mut con, &key, token, rest.as_bytes()) {
                            Ok(()) => Ok("written"),
                            Err(FencedWriteError::Stale(_)) => Ok("refused"),
                            Err(e) => Err(e.to_string()),
                        }
                    });
                match written {
                    Ok(outcome) => println!("{outcome}"),
                    Err(e) => println!("write failed: {e}"),
                }
            }
            "unlock" => break,
            other => println!("unknown command {other:?}"),
        }
    }
    match guard.unlock() {
        Ok(()) => println!("unlocked"),
        Err(e) => println!("unlock failed: {e}"),
    }
    ExitCode::SUCCESS
}
