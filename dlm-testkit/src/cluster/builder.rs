//! [`RedisClusterBuilder`]: the cluster's shape and settings, and the start-up (nodes
//! spawned at once, slots assigned, nodes met, replicas attached).

use std::ops::RangeInclusive;
use std::thread;
use std::time::{Duration, Instant};

use super::{READY_TIMEOUT, RedisCluster, SLOTS};
use crate::redis_server::{RedisServer, RedisServerBuilder};

/// Builds a [`RedisCluster`] of another shape or configuration.
#[derive(Debug, Clone)]
pub struct RedisClusterBuilder {
    masters: usize,
    replicas: usize,
    password: Option<String>,
    node_timeout: Duration,
    args: Vec<String>,
}

impl Default for RedisClusterBuilder {
    fn default() -> Self {
        RedisClusterBuilder {
            masters: 3,
            replicas: 1,
            password: None,
            node_timeout: Duration::from_millis(2000),
            args: Vec::new(),
        }
    }
}

impl RedisClusterBuilder {
    /// How many masters share the slots (3 by default). Failover needs the votes of a
    /// majority of the masters, so tests of failover want at least 3.
    pub fn masters(mut self, n: usize) -> Self {
        self.masters = n;
        self
    }

    /// How many replicas each master has (1 by default).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Sets `requirepass` on every node, and `masterauth` so that replicas can sync.
    /// [`RedisCluster::seed_urls`] and the nodes' [`RedisServer::url`] carry it.
    pub fn password(mut self, pw: &str) -> Self {
        self.password = Some(pw.to_owned());
        self
    }

    /// `cluster-node-timeout` (2 s by default): how long a node may be unreachable before
    /// it is suspected, and so roughly how long an automatic failover takes. Keep it
    /// small for quick failovers, but not so small that a loaded machine trips it.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Appends a raw command-line argument for every node (see
    /// [`RedisServerBuilder::arg`]).
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_owned());
        self
    }

    /// Starts the nodes, builds the cluster, and returns once it is ready (see
    /// [`RedisCluster::wait_stable`]).
    ///
    /// # Panics
    /// When a node does not start, or the cluster is not ready within 30 s (the message
    /// says what was missing and quotes every node's log).
    pub fn spawn(self) -> RedisCluster {
        assert!(
            (1..=usize::from(SLOTS)).contains(&self.masters),
            "a cluster needs 1 to {SLOTS} masters, not {}",
            self.masters
        );
        let started = Instant::now();
        let n = self.masters * (1 + self.replicas);
        let node_timeout = self.node_timeout.as_millis().max(1).to_string();
        let node_builder = || {
            let mut b = RedisServer::builder()
                .cluster_port(true)
                .arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-config-file")
                .arg("nodes.conf")
                .arg("--cluster-node-timeout")
                .arg(&node_timeout)
                // Replicas sync at once (Redis 7 waits 5 s for more replicas by default).
                .arg("--repl-diskless-sync-delay")
                .arg("0");
            if let Some(pw) = &self.password {
                b = b.password(pw).arg("--masterauth").arg(pw);
            }
            self.args.iter().fold(b, |b, a| b.arg(a))
        };
        let nodes = spawn_all(n, &node_builder);
        let mut cluster = RedisCluster {
            nodes,
            ids: Vec::new(),
            password: self.password.clone(),
        };
        cluster.ids = (0..n)
            .map(|i| cluster.run(i, redis::cmd("CLUSTER").arg("MYID")))
            .collect();
        // Distinct config epochs, as `redis-cli --cluster create` sets them: no epoch
        // collisions to resolve before the slot map settles.
        for i in 0..n {
            let _: () = cluster.run(i, redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1));
        }
        for k in 0..self.masters {
            let range = slot_share(k, self.masters);
            let _: () = cluster.run(
                k,
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(*range.start())
                    .arg(*range.end()),
            );
        }
        // Every pair meets directly: no waiting for gossip to introduce them.
        for i in 1..n {
            for j in 0..i {
                let other = &cluster.nodes[j];
                let _: () = cluster.run(
                    i,
                    redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg("127.0.0.1")
                        .arg(other.port())
                        .arg(other.cluster_port()),
                );
            }
        }
        cluster.wait_for("every node to know every node", READY_TIMEOUT, || {
            cluster.all_known()
        });
        for k in 0..self.masters {
            for j in 0..self.replicas {
                let r = self.masters + k * self.replicas + j;
                let _: () = cluster.run(
                    r,
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(&cluster.ids[k]),
                );
            }
        }
        cluster.wait_stable(READY_TIMEOUT);
        log::debug!(
            "redis cluster of {n} nodes ({} masters) ready in {:?}",
            self.masters,
            started.elapsed()
        );
        cluster
    }
}

/// Starts `n` servers from `builder` at once (start-up is mostly waiting). If one fails,
/// the others are dropped (killed) and its panic goes on.
fn spawn_all(n: usize, builder: &(impl Fn() -> RedisServerBuilder + Sync)) -> Vec<RedisServer> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(|| builder().spawn())).collect();
        let mut nodes = Vec::with_capacity(n);
        let mut failure = None;
        for handle in handles {
            match handle.join() {
                Ok(node) => nodes.push(node),
                Err(panic) => {
                    failure.get_or_insert(panic);
                }
            }
        }
        if let Some(panic) = failure {
            drop(nodes);
            std::panic::resume_unwind(panic);
        }
        nodes
    })
}

/// The slots of master `k` of `masters` at start: the `k`-th equal share.
fn slot_share(k: usize, masters: usize) -> RangeInclusive<u16> {
    let bound = |k: usize| (k * usize::from(SLOTS) / masters) as u16;
    bound(k)..=bound(k + 1) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_shares_cover_every_slot() {
        for m in [1, 2, 3, 5] {
            let shares: Vec<_> = (0..m).map(|k| slot_share(k, m)).collect();
            assert_eq!(*shares[0].start(), 0);
            assert_eq!(*shares[m - 1].end(), SLOTS - 1);
            for w in shares.windows(2) {
                assert_eq!(*w[0].end() + 1, *w[1].start());
            }
        }
    }
}
