//! The backend of the guide (`dlm_testkit::guide`, the same file) passes the conformance
//! suite: what the guide promises a backend author.

include!("guide/map_backend.rs");

struct Map(MapBackend);

impl dlm_testkit::Fixture for Map {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.0.clone())
    }

    // No release hints: waiters poll with backoff, never past the holder's lease end
    // (`retry_after`).
    fn watch(&self) -> bool {
        false
    }
}

dlm_testkit::conformance_tests!(
    mutex_only = "the guide's map backend keeps only the mutex",
    Map(MapBackend::default())
);

/// Outside the suite: expired entries of names nobody asks for again are swept out, so
/// the map does not grow with every name ever used.
#[test]
fn expired_entries_are_swept() {
    let backend = MapBackend::default();
    let owner = OwnerToken::random_for_tests(1);
    let take = |i: usize, ttl| {
        let name = LockName::new(&format!("sweep-{i}")).unwrap();
        assert!(matches!(
            backend.try_acquire(&name, &owner, ttl).unwrap(),
            Acquire::Acquired(_)
        ));
    };
    for i in 0..1000 {
        take(i, Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(5));
    // Enough new names to pass the sweep threshold (at most 2 x 1000 + 64).
    for i in 1000..4000 {
        take(i, Duration::from_secs(60));
    }
    let state = backend.state.lock().unwrap();
    assert_eq!(state.locks.len(), 3000, "expired entries left in the map");
}
