//! The shared conformance suite on the file backend: every process of the suite's
//! clients shares one directory, as processes of one machine would.

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_file::FileBackend;

struct Files {
    backend: FileBackend,
    _dir: Arc<tempfile::TempDir>,
}

impl Files {
    fn new() -> Files {
        let dir = Arc::new(tempfile::tempdir().expect("a temporary directory"));
        let backend = FileBackend::new(dir.path().join("locks")).expect("the lock directory");
        Files { backend, _dir: dir }
    }
}

impl dlm_testkit::Fixture for Files {
    // Each case's clients get backends of their own over one directory, as separate
    // processes would (their locks exclude each other through the kernel).
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(FileBackend::new(self.backend.dir()).expect("the lock directory"))
    }
}

dlm_testkit::conformance_tests!(Files::new());
