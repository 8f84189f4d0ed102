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

/// One member, shared by every case of the test binary (`dlm_testkit::Shared`: every
/// case uses names of its own; the member ends with the process).
pub struct Single {
    pub server: Arc<EtcdServer>,
}

static SINGLE: dlm_testkit::Shared<EtcdServer> = dlm_testkit::Shared::new();

impl Single {
    pub fn new() -> Self {
        Single {
            server: SINGLE.get(EtcdServer::spawn),
        }
    }
}

impl dlm_testkit::Fixture for Single {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(backend(&[self.server.url()]))
    }
}

/// A cluster of `n` members, shared by every case of the test binary; each backend is
/// given every member's URL. (An etcd cluster takes about a second to form: one per case
/// made the 3-member suite 75-78 s.)
pub struct Cluster {
    pub cluster: Arc<EtcdCluster>,
}

static CLUSTER: dlm_testkit::Shared<EtcdCluster> = dlm_testkit::Shared::new();

impl Cluster {
    /// The binary's shared cluster of `n` members (the first call's `n` makes it).
    pub fn new(n: usize) -> Self {
        let cluster = CLUSTER.get(|| EtcdCluster::spawn(n));
        assert_eq!(cluster.len(), n, "one shared cluster per test binary");
        Cluster { cluster }
    }
}

impl dlm_testkit::Fixture for Cluster {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(backend(&self.cluster.urls()))
    }
}
