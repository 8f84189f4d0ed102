//! Fixtures shared by the etcd integration tests: real etcd processes from dlm-testkit.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::{EtcdCluster, EtcdServer};

/// Generous I/O timeouts for tests that are not about timeouts: a loaded 2-core CI
/// machine must not turn a healthy member into a spurious failure.
pub const CALM: Duration = Duration::from_millis(1000);

/// A backend on `urls` with calm timeouts: one per `backend()` call (another process).
pub fn backend(urls: &[String]) -> EtcdBackend {
    EtcdBackend::builder(urls)
        .io_timeout(CALM)
        .connect_timeout(CALM)
        .build()
        .unwrap()
}

/// One member.
pub struct Single {
    pub server: EtcdServer,
}

impl Single {
    pub fn new() -> Self {
        Single {
            server: EtcdServer::spawn(),
        }
    }
}

impl dlm_testkit::Fixture for Single {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(backend(&[self.server.url()]))
    }
}

/// A cluster of `n` members; each backend is given every member's URL.
pub struct Cluster {
    pub cluster: EtcdCluster,
}

impl Cluster {
    pub fn new(n: usize) -> Self {
        Cluster {
            cluster: EtcdCluster::spawn(n),
        }
    }
}

impl dlm_testkit::Fixture for Cluster {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(backend(&self.cluster.urls()))
    }
}
