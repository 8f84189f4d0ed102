//! Nothing is left behind: threads return to their baseline when backends are dropped.
//! (The only test in its binary, so no other test's threads disturb the count.)
mod common;

use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (bounded) for the thread count to fall to `baseline`: exiting threads leave
/// /proc/self/task shortly after they are joined.
fn assert_threads_back_to(baseline: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads() > baseline {
        assert!(
            Instant::now() < deadline,
            "{} threads, baseline {baseline}",
            threads()
        );
        std::thread::yield_now();
    }
}

#[test]
fn redlock_and_single_backends_leave_no_threads_behind() {
    let cluster = common::Cluster::new(3);
    let single = common::Single::new();
    let baseline = threads();
    {
        let redlock = cluster.redlock();
        let client = LockClient::new(redlock);
        let lock = client.get_lock("threads").unwrap();
        for _ in 0..10 {
            lock.lock().unwrap().unlock().unwrap();
        }
        // A contended wait starts the release-hint listeners too.
        let other = LockClient::new(cluster.redlock());
        let held = lock.lock().unwrap();
        let waited = other
            .get_lock("threads")
            .unwrap()
            .try_lock_timeout(std::time::Duration::from_millis(100))
            .unwrap();
        assert!(waited.is_none());
        // Threads did start (the watchdog's, the listeners'; a server's pool thread only
        // once its first connection is not enough), and must all go.
        assert!(threads() > baseline, "no thread started");
        drop(held);
        let single_client = LockClient::builder(dlm_testkit::Fixture::backend(&single))
            .build()
            .unwrap();
        single_client
            .get_lock("threads")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    }
    assert_threads_back_to(baseline);
}
