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
