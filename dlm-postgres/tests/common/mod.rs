//! Fixtures shared by the PostgreSQL integration tests: real servers from dlm-testkit.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_postgres::PostgresBackend;
use dlm_testkit::postgres::PostgresServer;

/// Generous timeouts for tests that are not about timeouts: a loaded 2-core CI machine
/// must not turn a healthy server into a spurious failure.
pub const CALM: Duration = Duration::from_millis(2000);

/// A backend on `url` with calm timeouts: one per `backend()` call (another process).
pub fn backend(url: &str) -> PostgresBackend {
    PostgresBackend::builder(url)
        .io_timeout(CALM)
        .connect_timeout(CALM)
        .build()
        .unwrap()
}

/// One server, shared by every case of the test binary (every case uses names of its
/// own; the server ends with the process).
pub struct Single {
    pub server: Arc<PostgresServer>,
}

static SINGLE: dlm_testkit::Shared<PostgresServer> = dlm_testkit::Shared::new();

impl Single {
    pub fn new() -> Self {
        Single {
            server: SINGLE.get(PostgresServer::spawn),
        }
    }
}

impl dlm_testkit::Fixture for Single {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(backend(&self.server.url()))
    }
}
