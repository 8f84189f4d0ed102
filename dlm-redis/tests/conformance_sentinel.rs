//! The shared conformance suite against a Redis Sentinel deployment the testkit starts (a
//! master, two replicas, three sentinels): the backend finds the master through the
//! sentinels. Every case shares one deployment (`dlm_testkit::Shared`), with a key
//! prefix of its own (so that it can count its keys while other cases run); one
//! deployment per case made the suite 50-57 s.
mod common;

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::Shared;
use dlm_testkit::sentinel::SentinelTopology;

struct Sentinel(Arc<SentinelTopology>, String);

static SHARED: Shared<SentinelTopology> = Shared::new();

impl Sentinel {
    fn new() -> Self {
        common::require();
        let prefix = format!("dlm-{:08x}", rand::random::<u32>());
        Sentinel(SHARED.get(SentinelTopology::spawn), prefix)
    }
}

impl dlm_testkit::Fixture for Sentinel {
    fn fencing_keys(&self) -> Option<usize> {
        Some(common::keys_on(
            self.0.data_nodes(),
            &format!("{}:fence:*", self.1),
        ))
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(common::keys_without_expiry_on(
            self.0.data_nodes(),
            &format!("{}:*", self.1),
        ))
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::sentinel_builder(self.0.master_name(), &self.0.sentinel_urls())
                .prefix(&self.1)
                .build()
                .unwrap(),
        )
    }
}

dlm_testkit::conformance_tests!(Sentinel::new());
