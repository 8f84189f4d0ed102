//! Takes, uses and releases a lock.
//!
//! ```text
//! cargo run -p dlm-examples --bin quickstart
//! ```

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_examples::Args;

fn main() -> Result<(), dlm_core::Error> {
    let mut args = Args::from_env("quickstart", "[--redis URL[,URL...]] [--name NAME]");
    let backend = args.backend();
    let name = args.value("--name").unwrap_or_else(|| "quickstart".into());
    args.finish();
    println!("backend: {backend:?}");

    // One client per process: it owns the random owner id of this process's locks.
    let client = LockClient::builder(backend)
        .lease(Duration::from_secs(10))
        .build()?;
    let lock = client.get_lock(&name)?;

    // Wait at most 5 s for the lock; the guard releases it when dropped.
    let Some(guard) = lock.try_lock_timeout(Duration::from_secs(5))? else {
        println!("{name} is busy, try again later");
        return Ok(());
    };
    println!(
        "acquired {:?}: fencing token {:?}, valid for {:?}",
        guard.name(),
        guard.fencing_token().ok().map(|t| t.get()),
        guard
            .valid_until()
            .saturating_duration_since(std::time::Instant::now()),
    );

    // The critical section: check that the lock is still ours before each step.
    for step in 1..=3 {
        guard.ensure_held()?;
        println!("step {step} of the critical section");
    }

    guard.unlock()?;
    println!("released; locked now: {}", lock.is_locked()?);
    Ok(())
}
