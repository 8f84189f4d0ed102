//! The shared conformance suite against a Redis Cluster the testkit starts (three
//! masters, each with a replica): the backend is given two seeds and finds the rest.
//! Every case shares one cluster (`dlm_testkit::Shared`; every case uses names and a key
//! prefix of its own). A cluster takes about 2 s to form: one per case made the suite
//! 66 s, one per set of cases running together 57-80 s (the timing-sensitive cases run
//! alone, so 23 clusters were still started).
mod common;

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::Shared;
use dlm_testkit::cluster::RedisCluster;

/// The shared cluster, and a key prefix of the case's own (so that it can count its
/// fencing streams while other cases run).
struct Cluster(Arc<RedisCluster>, String);

static SHARED: Shared<RedisCluster> = Shared::new();

impl Cluster {
    fn new() -> Self {
        common::require();
        let prefix = format!("dlm-{:08x}", rand::random::<u32>());
        Cluster(SHARED.get(RedisCluster::spawn), prefix)
    }
}

impl dlm_testkit::Fixture for Cluster {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::cluster_builder(&self.0.seed_urls()[..2])
                .prefix(&self.1)
                .build()
                .unwrap(),
        )
    }

    /// Counted on every node (a replica holds copies of its master's streams: the count
    /// only has to stay put, or grow on a read).
    /// Counted on every node (a replica holds copies of its master's streams: the count
    /// only has to stay put, or grow on a read).
    fn fencing_keys(&self) -> Option<usize> {
        Some(common::keys_on(
            self.0.nodes(),
            &format!("{}:fence:*", self.1),
        ))
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(common::keys_without_expiry_on(
            self.0.nodes().iter(),
            &format!("{}:*", self.1),
        ))
    }
}

dlm_testkit::conformance_tests!(Cluster::new());
