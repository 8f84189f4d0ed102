//! Soak (the reliability plan's memory case): two clients x four threads on four hot locks,
//! until 200,000 holds or 10 s, every hold recorded and checked for overlaps and token
//! order, every update counted, and the threads back to the baseline afterwards. (The
//! only test in its binary: no other test's threads disturb the count.) The number of
//! holds is what the machine gives: at least 20,000 are needed for the check to mean
//! something (a run beside two busy loops made 67,517 in 10 s; alone, 200,000 in under
//! 10 s), so a lock that stalls still fails it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;
use dlm_testkit::history::History;

const CLIENTS: usize = 2;
const THREADS_PER_CLIENT: usize = 4;
const LOCKS: usize = 4;
const TARGET: u64 = 200_000;
/// The fewest holds for a meaningful run.
const ENOUGH: u64 = 20_000;
const TIME_LIMIT: Duration = Duration::from_secs(10);

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn eight_threads_on_four_hot_locks_keep_exclusion_and_token_order() {
    let baseline = threads();
    let backend = MemoryBackend::new();
    let history = Arc::new(History::new());
    // Per lock: a counter updated with a separate read and write (a lost update shows
    // without exclusion), and the holds counted.
    let counters: Arc<Vec<AtomicU64>> = Arc::new((0..LOCKS).map(|_| AtomicU64::new(0)).collect());
    let total = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut workers = Vec::new();
    for c in 0..CLIENTS {
        // The default client: watchdog-renewed leases, so renewals run throughout.
        let client = LockClient::new(backend.clone());
        for t in 0..THREADS_PER_CLIENT {
            let (client, history, counters, total, stop) = (
                client.clone(),
                history.clone(),
                counters.clone(),
                total.clone(),
                stop.clone(),
            );
            workers.push(thread::spawn(move || {
                let mut mine = 0u64;
                let mut i = 0usize;
                // xorshift64: each thread its own sequence of locks.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((c * THREADS_PER_CLIENT + t) as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % LOCKS as u64) as usize;
                    let lock = client.get_lock(&format!("hot-{k}")).unwrap();
                    // Mostly waits, some single attempts.
                    let guard = if i.is_multiple_of(4) {
                        lock.try_lock().unwrap()
                    } else {
                        lock.try_lock_timeout(Duration::from_secs(5)).unwrap()
                    };
                    let Some(guard) = guard else { continue };
                    let hold = history.begin(format!("client {c} thread {t}"), &guard);
                    let v = counters[k].load(Ordering::SeqCst);
                    if i.is_multiple_of(16) {
                        thread::yield_now();
                    }
                    counters[k].store(v + 1, Ordering::SeqCst);
                    history.end(hold, &guard);
                    guard.unlock().unwrap();
                    mine += 1;
                    if total.fetch_add(1, Ordering::Relaxed) + 1 >= TARGET
                        || started.elapsed() >= TIME_LIMIT
                    {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                mine
            }));
        }
    }
    let per_thread: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();

    let report = history.check();
    let holds = total.load(Ordering::SeqCst);
    eprintln!("{holds} holds in {:?}", started.elapsed());
    assert!(
        holds >= ENOUGH,
        "only {holds} holds in {:?}: the soak needs {ENOUGH}",
        started.elapsed()
    );
    assert_eq!(report.holds as u64, holds);
    assert_eq!(report.names, LOCKS);
    report.assert_clean();
    let updates: u64 = counters.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert_eq!(updates, holds, "lost updates: mutual exclusion failed");
    assert!(
        per_thread.iter().all(|n| *n > 0),
        "a thread never got a lock: {per_thread:?}"
    );

    // Every renewal thread and worker is gone once the clients are.
    drop(backend);
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads() > baseline {
        assert!(
            Instant::now() < deadline,
            "{} threads left over the baseline {baseline}",
            threads() - baseline
        );
        thread::yield_now();
    }
}
