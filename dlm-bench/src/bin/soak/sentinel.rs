//! The Sentinel target: a master, 2 replicas and 3 sentinels (the testkit's short
//! timings: `down-after-milliseconds` 1000, `failover-timeout` 5000), clients that find
//! the master through the sentinels, the library's default timeouts.
//!
//! Faults: the master stopped for 0.4 s (shorter than `down-after`: no failover, no hold
//! may be lost), stopped until the sentinels fail it over, killed (then restarted, and
//! made a replica by the sentinels), failed over by `SENTINEL FAILOVER`; a replica killed
//! and restarted, a sentinel killed and restarted. Each failover is declared: replication
//! is asynchronous, so the old master's last grants may be lost (killed or stopped), or
//! it keeps granting until the sentinels demote it (`SENTINEL FAILOVER`), and another
//! client gets the lock too.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::sentinel::SentinelTopology;
use rand::Rng;
use rand::rngs::StdRng;

use crate::targets::{connections, leaked_keys};
use crate::{Declared, Target};

/// How long a failover may take to settle before the soak gives up.
const SETTLE: Duration = Duration::from_secs(60);
/// A stop that the sentinels do not notice (`down-after` is 1 s).
const SHORT_STOP: Duration = Duration::from_millis(400);
const BULK: usize = 300;

pub(crate) struct SentinelTarget {
    topology: SentinelTopology,
    /// The master as last seen, and since when it is known to be it.
    master: usize,
    known: Instant,
    /// Whether the last fault left every node alone as far as holds go.
    untouched: bool,
}

impl SentinelTarget {
    pub(crate) fn new() -> Self {
        let topology = SentinelTopology::spawn();
        let master = topology.master_index();
        SentinelTarget {
            topology,
            master,
            known: Instant::now(),
            untouched: true,
        }
    }

    /// Waits until the topology is settled and notes its master.
    fn settle(&mut self) -> usize {
        self.master = self.topology.wait_settled(SETTLE);
        self.known = Instant::now();
        self.master
    }

    /// A failover that began at `start` and has settled: declared.
    fn failed_over(&mut self, start: Instant, declared: &Declared) {
        self.settle();
        declared.failover(start);
    }
}

impl Target for SentinelTarget {
    fn name(&self) -> &'static str {
        "sentinel"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        let t = &self.topology;
        Arc::new(
            RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let old = self.settle();
        let start = Instant::now();
        self.untouched = false;
        let kind = match rng.random_range(0..6) {
            0 => {
                self.topology.data_node(old).pause();
                thread::sleep(SHORT_STOP);
                self.topology.data_node(old).resume();
                self.untouched = true;
                "master stop 0.4 s"
            }
            1 => {
                self.topology.data_node(old).pause();
                self.topology.wait_for_new_master(old, SETTLE);
                self.topology.data_node(old).resume();
                "master stop until failover (declared)"
            }
            2 => {
                self.topology.data_node_mut(old).kill();
                self.topology.wait_for_new_master(old, SETTLE);
                self.topology.data_node_mut(old).restart();
                "master kill + restart (declared)"
            }
            3 => {
                self.topology.failover();
                "SENTINEL FAILOVER (declared)"
            }
            4 => {
                // Not data node 0: it restarts as a master (its role at start).
                let replicas = self.topology.replica_indexes();
                let choices: Vec<usize> = replicas.into_iter().filter(|&r| r != 0).collect();
                let r = choices[rng.random_range(0..choices.len())];
                self.topology.data_node_mut(r).kill();
                thread::sleep(Duration::from_secs(1));
                self.topology.data_node_mut(r).restart();
                self.untouched = true;
                "replica kill + restart"
            }
            _ => {
                let s = rng.random_range(0..self.topology.sentinel_count());
                self.topology.sentinel_mut(s).kill();
                thread::sleep(Duration::from_secs(1));
                self.topology.restart_sentinel(s);
                self.untouched = true;
                "sentinel kill + restart"
            }
        };
        let planned = kind.ends_with("(declared)");
        if planned {
            self.failed_over(start, declared);
            return kind;
        }
        if self.settle() != old {
            // A fault too short for a failover got one anyway: the machine was too slow.
            declared.failover(start);
            self.untouched = false;
            return "failover after a fault meant not to cause one (declared)";
        }
        kind
    }

    fn untouched(&self, _name: &str) -> bool {
        self.untouched
    }

    fn unplanned(&mut self, declared: &Declared) -> Option<&'static str> {
        let (before, since) = (self.master, self.known);
        if self.settle() == before {
            return None;
        }
        declared.failover(since);
        Some("failover between faults (declared)")
    }

    fn bulk(&self) -> usize {
        BULK
    }

    fn leaked_keys(&self) -> usize {
        leaked_keys(self.topology.master())
    }

    fn connections(&self) -> usize {
        let t = &self.topology;
        let data: usize = t.data_nodes().iter().map(connections).sum();
        let sentinels: usize = (0..t.sentinel_count())
            .map(|i| connections(t.sentinel(i)))
            .sum();
        data + sentinels
    }
}
