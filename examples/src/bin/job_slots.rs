//! "At most N of these jobs at once": workers (threads here, processes or machines in
//! real life, each its own client) take a permit of a semaphore before each job, and a
//! read-write lock guards the configuration they read while an operator rewrites it.
//! Prints the most jobs seen running at once (never more than the permits) and exits
//! non-zero if the semaphore ever let more in.
//!
//! ```text
//! cargo run -p dlm-examples --bin job_slots -- [--permits N] [--workers N] [--redis URL]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlm_core::LockClient;
use dlm_examples::Args;

fn main() -> Result<(), dlm_core::Error> {
    let mut args = Args::from_env(
        "job_slots",
        "[--redis URL] [--permits N] [--workers N] [--jobs N]",
    );
    let backend = args.backend();
    let permits: u32 = args.parsed("--permits", 2);
    let workers: usize = args.parsed("--workers", 6);
    let jobs: usize = args.parsed("--jobs", 5);
    args.finish();
    let name = format!("job-slots-{}", std::process::id());
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));

    std::thread::scope(|s| -> Result<(), dlm_core::Error> {
        let mut handles = Vec::new();
        for w in 0..workers {
            // One client per worker: each is its own owner, as separate processes are.
            let client = LockClient::new(backend.clone());
            let (slots, config) = (
                client.get_semaphore(&name, permits)?,
                client.get_rw_lock(&format!("{name}-config"))?,
            );
            let (running, most) = (running.clone(), most.clone());
            handles.push(s.spawn(move || -> Result<(), dlm_core::Error> {
                for job in 0..jobs {
                    let settings = config.with_read(|_| format!("settings v{job}"))?;
                    slots.with_permit(|permit| {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        let token = permit.fencing_token().ok().map(|t| t.get());
                        println!("worker {w} job {job} ({settings}), permit token {token:?}");
                        std::thread::sleep(Duration::from_millis(5)); // the job
                        running.fetch_sub(1, Ordering::SeqCst);
                    })?;
                }
                Ok(())
            }));
        }
        // An operator rewrites the configuration: new readers wait behind it.
        let operator = LockClient::new(backend.clone()).get_rw_lock(&format!("{name}-config"))?;
        operator.with_write(|_| println!("operator: configuration rewritten"))?;
        for h in handles {
            h.join().expect("a worker panicked")?;
        }
        Ok(())
    })?;

    let most = most.load(Ordering::SeqCst);
    println!("most jobs at once: {most} (permits: {permits})");
    if most > permits as usize {
        eprintln!("the semaphore let {most} jobs in at once");
        std::process::exit(1);
    }
    Ok(())
}
