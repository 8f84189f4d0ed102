//! The IDGenerator test of the blog post dlm started from, as a program.
//!
//! T threads (each its own client, like separate processes) draw IDs from a shared,
//! unsynchronised counter (read, yield, write) for S seconds under the lock. Any ID drawn
//! twice means the lock failed. With `--no-lock` the lock is skipped: duplicates appear,
//! which shows the test can fail.
//!
//! The last line is exactly `ids=<n> duplicates=<d>`; the exit status is 1 if d > 0.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_examples::{Args, seconds};

fn main() -> ExitCode {
    let mut args = Args::from_env(
        "id_generator",
        "[--threads T (2)] [--seconds S (5)] [--no-lock] [--redis URL[,URL...]] [--name NAME]",
    );
    let threads: usize = args.parsed("--threads", 2);
    let run_for = seconds(args.parsed("--seconds", 5.0));
    let no_lock = args.switch("--no-lock");
    let backend = args.backend();
    let name = args
        .value("--name")
        .unwrap_or_else(|| format!("id-generator-{}", std::process::id()));
    args.finish();
    if threads == 0 {
        args.fail("--threads must be at least 1");
    }

    let counter = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run_for;
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let lock = LockClient::builder(backend.clone())
                .build()
                .unwrap()
                .get_lock(&name)
                .expect("valid lock name");
            let counter = counter.clone();
            thread::spawn(move || -> Result<Vec<u64>, dlm_core::Error> {
                let mut ids = Vec::new();
                while Instant::now() < end {
                    let guard = if no_lock {
                        None
                    } else {
                        match lock.try_lock_timeout(Duration::from_secs(3))? {
                            Some(guard) => Some(guard),
                            None => continue,
                        }
                    };
                    // Not an atomic increment: a read, a pause, a write.
                    let id = counter.load(Ordering::SeqCst);
                    thread::yield_now();
                    counter.store(id + 1, Ordering::SeqCst);
                    if let Some(guard) = guard {
                        guard.unlock()?;
                    }
                    ids.push(id);
                }
                Ok(ids)
            })
        })
        .collect();

    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut duplicates = 0u64;
    for (i, w) in workers.into_iter().enumerate() {
        let ids = match w.join().expect("worker panicked") {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("worker {i} failed: {e}");
                return ExitCode::from(2);
            }
        };
        println!("thread {i}: {} ids", ids.len());
        for id in ids {
            total += 1;
            if !seen.insert(id) {
                duplicates += 1;
            }
        }
    }
    println!("ids={total} duplicates={duplicates}");
    if duplicates > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
