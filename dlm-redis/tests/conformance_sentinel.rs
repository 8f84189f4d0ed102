//! The shared conformance suite against a Redis Sentinel deployment the testkit starts
//! for each case (a master, two replicas, three sentinels): the backend finds the master
//! through the sentinels.
mod common;

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::sentinel::SentinelTopology;

struct Sentinel(SentinelTopology);

impl Sentinel {
    fn new() -> Self {
        common::require();
        Sentinel(SentinelTopology::spawn())
    }
}

impl dlm_testkit::Fixture for Sentinel {
    fn fencing_keys(&self) -> Option<usize> {
        Some(common::fence_keys_on(self.0.data_nodes()))
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(common::keys_without_expiry_on(self.0.data_nodes(), "dlm:*"))
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::sentinel_builder(self.0.master_name(), &self.0.sentinel_urls())
                .build()
                .unwrap(),
        )
    }
}

dlm_testkit::conformance_tests!(Sentinel::new());
