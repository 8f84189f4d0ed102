//! The watchdog is one thread per client, started by the first renewed lock, and gone
//! when the client and its locks are. (The only test in its binary: no other test's
//! threads disturb the count.)

use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn one_renewal_thread_per_client_gone_with_the_client() {
    let baseline = threads();
    let backend = MemoryBackend::new();
    {
        let client = LockClient::builder(std::sync::Arc::new(backend.clone()))
            .watchdog_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let fixed = client
            .get_lock("fixed")
            .unwrap()
            .with_lease(Duration::from_secs(5))
            .unwrap();
        drop(fixed.lock().unwrap());
        assert_eq!(threads(), baseline, "a fixed lease started a thread");
        let guards: Vec<_> = (0..10)
            .map(|i| client.get_lock(&format!("l{i}")).unwrap().lock().unwrap())
            .collect();
        assert_eq!(threads(), baseline + 1, "not exactly one renewal thread");
        drop(guards);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads() > baseline {
        assert!(
            Instant::now() < deadline,
            "the renewal thread outlived its client"
        );
        std::thread::yield_now();
    }
}
