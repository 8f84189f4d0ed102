//! Uncontended lock+unlock on the memory backend, one thread: cycles per second and
//! latency percentiles. `cargo bench -p dlm-memory` (add `-- --quick` for a smoke run).

use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let run_for = if quick {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(3)
    };
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.get_lock("bench").unwrap();
    // Warm-up.
    for _ in 0..10_000 {
        lock.lock().unwrap().unlock().unwrap();
    }
    let mut samples = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let mut cycles: u64 = 0;
    while start.elapsed() < run_for {
        // Batches of 64 keep the timer's own cost out of the per-cycle figure.
        let t = Instant::now();
        for _ in 0..64 {
            let guard = lock.try_lock().unwrap().expect("uncontended");
            guard.unlock().unwrap();
        }
        samples.push(t.elapsed() / 64);
        cycles += 64;
    }
    let elapsed = start.elapsed();
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    println!(
        "memory uncontended lock+unlock, 1 thread: {:.0} cycles/s, p50 {:?}, p99 {:?} ({cycles} cycles in {elapsed:?})",
        cycles as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99),
    );
}
