//! The shared conformance suite on the memory backend.

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_memory::MemoryBackend;

struct Memory(MemoryBackend);

impl dlm_testkit::Fixture for Memory {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.0.clone())
    }
}

dlm_testkit::conformance_tests!(Memory(MemoryBackend::new()));

/// Two clients taking the multi-locks {a, b} and {b, a} in a loop for 10 s: both make
/// progress, none waits out its 10 s timeout (no deadlock), no overlap.
#[test]
fn multi_locks_in_opposite_orders_for_ten_seconds() {
    let done = dlm_testkit::conformance::multi_locks_in_opposite_orders_for(
        &Memory(MemoryBackend::new()),
        std::time::Duration::from_secs(10),
    );
    eprintln!("sets taken by each side in 10 s: {done:?}");
}

/// With fencing off there is no term: elections are refused (a typed error, no I/O).
#[test]
fn elections_need_fencing() {
    dlm_testkit::conformance::elections_unsupported_are_refused_at_the_call(&Memory(
        MemoryBackend::builder().fencing(false).build(),
    ));
    let client = dlm_core::LockClient::new(MemoryBackend::builder().fencing(false).build());
    let e = client.get_election("x").unwrap_err();
    assert_eq!(
        e.backend_kind(),
        Some(dlm_core::BackendErrorKind::Unsupported),
        "{e}"
    );
}

/// Locks taken one by one outside a `MultiLock`'s order can deadlock (the negative
/// control of the multi-lock's order): A holds a and waits for b while B holds b and waits
/// for a; both wait out their timeout.
#[test]
fn locks_taken_in_opposite_orders_outside_a_multi_lock_deadlock() {
    use dlm_core::Lock;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;
    let backend = MemoryBackend::new();
    let both_hold = Arc::new(Barrier::new(2));
    // Each keeps its first lock until both attempts are over: an attempt that ends first
    // must not let the other in by releasing.
    let both_tried = Arc::new(Barrier::new(2));
    let sides: Vec<_> = [("a", "b"), ("b", "a")]
        .into_iter()
        .map(|(first, second)| {
            let client = dlm_core::LockClient::new(backend.clone());
            let (both_hold, both_tried) = (both_hold.clone(), both_tried.clone());
            std::thread::spawn(move || {
                let held = client.get_lock(first).unwrap().lock().unwrap();
                both_hold.wait();
                let timed_out = client
                    .get_lock(second)
                    .unwrap()
                    .try_lock_timeout(Duration::from_millis(300))
                    .unwrap()
                    .is_none();
                both_tried.wait();
                drop(held);
                timed_out
            })
        })
        .collect();
    let timed_out: Vec<bool> = sides.into_iter().map(|s| s.join().unwrap()).collect();
    assert_eq!(
        timed_out,
        [true, true],
        "the opposite orders did not deadlock"
    );
}
