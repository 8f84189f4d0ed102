//! The shared conformance suite against a Redis Cluster the testkit starts for each case
//! (three masters, each with a replica): the backend is given two seeds and finds the
//! rest.
mod common;

use std::sync::Arc;

use dlm_core::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::cluster::RedisCluster;

struct Cluster(RedisCluster);

impl Cluster {
    fn new() -> Self {
        common::require();
        Cluster(RedisCluster::spawn())
    }
}

impl dlm_testkit::Fixture for Cluster {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::cluster(&self.0.seed_urls()[..2])
                .build()
                .unwrap(),
        )
    }
}

dlm_testkit::conformance_tests!(Cluster::new());
