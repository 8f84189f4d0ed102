//! Takes a lock COUNT times and, while holding it, writes to a value in Redis through
//! the fencing check (`dlm_redis::fenced_set`). Run several at once, as separate
//! processes: if any holder ever had a token older than an earlier holder's, its write
//! would be refused and this program would exit with status 1.
//!
//! ```text
//! fenced_writer --redis URL[,URL...] [--count N (20)] [--name NAME] [--key KEY]
//! ```
//! Prints one line per acquisition: `token <t>`.

use std::process::ExitCode;
use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_examples::Args;
use dlm_redis::{FencedWriteError, redis};

fn main() -> ExitCode {
    let mut args = Args::from_env(
        "fenced_writer",
        "--redis URL[,URL...] [--count N (20)] [--name NAME] [--key KEY]",
    );
    let Some(first_url) = args
        .peek("--redis")
        .and_then(|u| u.split(',').next().map(str::to_owned))
    else {
        args.fail("--redis is required");
    };
    let backend = args.backend();
    let count: u32 = args.parsed("--count", 20);
    let name = args
        .value("--name")
        .unwrap_or_else(|| "fenced-writer".into());
    let key = args
        .value("--key")
        .unwrap_or_else(|| "fenced-writer:value".into());
    args.finish();
    let mut con = match redis::Client::open(first_url.as_str()).and_then(|c| c.get_connection()) {
        Ok(con) => con,
        Err(e) => args.fail(&format!("cannot connect to {first_url}: {e}")),
    };
    let lock = LockClient::new(backend)
        .get_lock(&name)
        .expect("valid name");
    for _ in 0..count {
        let guard = match lock.try_lock_timeout(Duration::from_secs(30)) {
            Ok(Some(g)) => g,
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
        let value = format!("pid {} token {token}", std::process::id());
        match dlm_redis::fenced_set(&mut con, &key, token, value.as_bytes()) {
            Ok(()) => println!("token {token}"),
            Err(FencedWriteError::Stale(e)) => {
                println!("REFUSED: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("write failed: {e}");
                return ExitCode::from(2);
            }
        }
        if let Err(e) = guard.unlock() {
            eprintln!("unlock failed: {e}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
