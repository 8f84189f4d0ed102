//! The Cluster target: 3 masters with a replica each (`cluster-node-timeout` 4 s, so that
//! a stop longer than the lease can end before a failover), clients seeded with every
//! node, the library's default timeouts.
//!
//! Faults, on the master of a hot lock's slot: stopped for 1 s and for 2.5 s (longer
//! than the lease, shorter than the node timeout: no failover), stopped until its replica
//! takes over, killed (then restarted: it comes back as a replica), failed over by
//! `CLUSTER FAILOVER` on its replica; and a hot lock's slot migrated to another master,
//! key by key, under load. The failovers of a stopped or killed master are declared
//! (its last grants may not have reached its replica); `CLUSTER FAILOVER` and the
//! migration are not (the replica catches up before it takes over; `MIGRATE` moves a key
//! with its TTL). Bulk holds on the other masters must survive every fault, and through
//! a migration every bulk hold must.

use std::ops::RangeInclusive;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_redis::RedisBackend;
use dlm_testkit::cluster::{RedisCluster, slot_of};
use rand::Rng;
use rand::rngs::StdRng;

use crate::targets::{connections, leaked_keys};
use crate::{Declared, LOCKS, Target};

const NODE_TIMEOUT: Duration = Duration::from_secs(4);
/// How long a failover may take to happen or settle before the soak gives up.
const SETTLE: Duration = Duration::from_secs(60);
const BULK: usize = 300;
/// Keys per step of a migration, and the pause between steps.
const MIGRATE_STEP: usize = 1;
const MIGRATE_PAUSE: Duration = Duration::from_millis(300);

pub(crate) struct ClusterTarget {
    cluster: RedisCluster,
    /// The masters as last seen (sorted), and since when they are known to be them.
    masters: Vec<usize>,
    known: Instant,
    /// Which master served each slot range before the last fault.
    map: Vec<(RangeInclusive<u16>, usize)>,
    /// What the last fault touched.
    touched: Touched,
}

enum Touched {
    Nothing,
    /// The slots of the masters it stopped, killed or failed over (as they were before).
    Slots(Vec<RangeInclusive<u16>>),
    Everything,
}

/// The slot of lock `name`'s keys (names without braces: the name is the hash tag).
fn slot(name: &str) -> u16 {
    slot_of(format!("dlm:{{{name}}}").as_bytes())
}

impl ClusterTarget {
    pub(crate) fn new() -> Self {
        // With `cluster-require-full-coverage yes` (Redis's default) every master refuses
        // every slot (CLUSTERDOWN) from the moment a failed master is seen as failed until
        // its replica takes over, so holds whose lease ends meanwhile are lost on every
        // master: a 10-minute run at the default lost 422 holds on untouched masters in 13
        // master kills, all inside such windows. Off here, so that "untouched" means what
        // dlm controls; the README states the default's effect.
        let cluster = RedisCluster::builder()
            .node_timeout(NODE_TIMEOUT)
            .arg("--cluster-require-full-coverage")
            .arg("no")
            .spawn();
        let mut target = ClusterTarget {
            cluster,
            masters: Vec::new(),
            known: Instant::now(),
            map: Vec::new(),
            touched: Touched::Nothing,
        };
        target.settle();
        target
    }

    /// Waits until the cluster is stable and notes its masters and slot map.
    fn settle(&mut self) -> Vec<usize> {
        self.cluster.wait_stable(SETTLE);
        let masters = self.cluster.masters();
        self.map = masters
            .iter()
            .flat_map(|&m| self.cluster.slots_of(m).into_iter().map(move |r| (r, m)))
            .collect();
        self.masters = masters.clone();
        self.known = Instant::now();
        masters
    }

    fn home(&self, name: &str) -> Option<usize> {
        let s = slot(name);
        self.map
            .iter()
            .find(|(r, _)| r.contains(&s))
            .map(|&(_, m)| m)
    }

    /// The slots master `m` serves, by the map of the last settle.
    fn slots_of(&self, m: usize) -> Vec<RangeInclusive<u16>> {
        self.map
            .iter()
            .filter(|&&(_, o)| o == m)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

impl Target for ClusterTarget {
    fn name(&self) -> &'static str {
        "cluster"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::cluster_builder(&self.cluster.seed_urls())
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let before = self.settle();
        let hot = format!("soak-{}", rng.random_range(0..LOCKS));
        let m = self.home(&hot).expect("every slot is served");
        let start = Instant::now();
        self.touched = Touched::Slots(self.slots_of(m));
        let c = &mut self.cluster;
        let stop = |c: &RedisCluster, d: Duration| {
            c.node(m).pause();
            thread::sleep(d);
            c.node(m).resume();
        };
        let kind = match rng.random_range(0..6) {
            0 => {
                stop(c, Duration::from_secs(1));
                "master stop 1 s"
            }
            1 => {
                stop(c, Duration::from_millis(2500));
                "master stop 2.5 s > lease"
            }
            2 => {
                c.node(m).pause();
                c.wait_for_master_change(m, SETTLE);
                c.node(m).resume();
                "master stop until failover (declared)"
            }
            3 => {
                c.node_mut(m).kill();
                c.wait_for_master_change(m, SETTLE);
                c.node_mut(m).restart();
                "master kill + restart (declared)"
            }
            4 => {
                // Seen once after slot migrations: the failover done, one node still
                // saw a slot migrated to the old master on it 20 s later. Given more
                // time to settle (and counted apart); a cluster that never agrees fails
                // the run.
                let failover = catch_unwind(AssertUnwindSafe(|| c.failover(m)));
                if failover.is_err() {
                    c.wait_stable(SETTLE);
                    "CLUSTER FAILOVER, settled late"
                } else {
                    "CLUSTER FAILOVER"
                }
            }
            _ => {
                let others: Vec<usize> = before.iter().copied().filter(|&o| o != m).collect();
                let to = others[rng.random_range(0..others.len())];
                let migration = c.begin_migration(slot(&hot), to);
                thread::sleep(MIGRATE_PAUSE);
                while migration.move_some(MIGRATE_STEP) > 0 {
                    thread::sleep(MIGRATE_PAUSE);
                }
                thread::sleep(MIGRATE_PAUSE);
                migration.finish();
                self.touched = Touched::Nothing;
                "slot migrated"
            }
        };
        let planned = kind.ends_with("(declared)") || kind.starts_with("CLUSTER FAILOVER");
        let after = self.settle();
        if kind.ends_with("(declared)") {
            declared.failover(start);
        } else if !planned && after != before {
            // A fault meant to end before the node timeout got a failover anyway.
            declared.failover(start);
            self.touched = Touched::Everything;
            return "failover after a fault meant not to cause one (declared)";
        }
        kind
    }

    fn untouched(&self, name: &str) -> bool {
        match &self.touched {
            Touched::Nothing => true,
            Touched::Everything => false,
            Touched::Slots(slots) => {
                let s = slot(name);
                !slots.iter().any(|r| r.contains(&s))
            }
        }
    }

    fn unplanned(&mut self, declared: &Declared) -> Option<&'static str> {
        let (before, since) = (self.masters.clone(), self.known);
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
        self.cluster
            .masters()
            .into_iter()
            .map(|m| leaked_keys(self.cluster.node(m)))
            .sum()
    }

    fn connections(&self) -> usize {
        self.cluster.nodes().iter().map(connections).sum()
    }
}
