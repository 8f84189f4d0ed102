//! The backend of the guide (`dlm_testkit::guide`, the same file) passes the conformance
//! suite: what the guide promises a backend author.

include!("guide/map_backend.rs");

struct Map(MapBackend);

impl dlm_testkit::Fixture for Map {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.0.clone())
    }

    // No release hints: waiters sleep until the holder's lease ends (`retry_after`).
    fn watch(&self) -> bool {
        false
    }
}

dlm_testkit::conformance_tests!(Map(MapBackend::default()));
