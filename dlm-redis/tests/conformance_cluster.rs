//! The shared conformance suite against a Redis Cluster the testkit starts (three
//! masters, each with a replica): the backend is given two seeds and finds the rest.
//! Cases that run at the same time share one cluster (every case uses names of its own),
//! and the last one to finish stops it (a cluster takes about 2 s to form; sharing cut
//! the suite from 66 s to 57 s: the timing-sensitive cases run alone, so 23 clusters are
//! still started).
mod common;

use std::sync::{Arc, Mutex, Weak};

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::cluster::RedisCluster;

/// The shared cluster, and a key prefix of the case's own (so that it can count its
/// fencing streams while other cases run).
struct Cluster(Arc<RedisCluster>, String);

/// The cluster of the cases running now, if any.
static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

impl Cluster {
    fn new() -> Self {
        common::require();
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        let prefix = format!("dlm-{:08x}", rand::random::<u32>());
        if let Some(cluster) = shared.upgrade() {
            return Cluster(cluster, prefix);
        }
        let cluster = Arc::new(RedisCluster::spawn());
        *shared = Arc::downgrade(&cluster);
        Cluster(cluster, prefix)
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
    fn fencing_keys(&self) -> Option<usize> {
        let pattern = format!("{}:fence:*", self.1);
        Some(
            self.0
                .nodes()
                .iter()
                .map(|n| {
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(&pattern)
                        .query(&mut n.connection())
                        .unwrap();
                    keys.len()
                })
                .sum(),
        )
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(common::keys_without_expiry_on(
            self.0.nodes().iter(),
            &format!("{}:*", self.1),
        ))
    }
}

dlm_testkit::conformance_tests!(Cluster::new());
