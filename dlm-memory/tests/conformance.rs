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
