//! A real Redis Cluster of `redis-server` processes, for tests of Cluster support.
//!
//! [`RedisCluster::spawn`] starts 3 masters with one replica each ([`RedisCluster::builder`]
//! for other shapes, a password or another node timeout). Every node is a
//! [`RedisServer`] on a free loopback port, with `--cluster-enabled yes`, its own
//! `nodes.conf` in its own dir and a cluster bus port of its own
//! ([`RedisServerBuilder::cluster_port`]). The cluster is built with plain commands
//! (`CLUSTER ADDSLOTSRANGE`, `MEET`, `REPLICATE`; no `redis-cli`), and `spawn` returns once
//! it is ready (see [`RedisCluster::wait_stable`]). Dropping the cluster kills and reaps
//! every node.
//!
//! Topology changes a test can drive:
//! - slot migration, step by step so that load can run while a slot is half moved
//!   ([`RedisCluster::begin_migration`], [`Migration::move_some`], [`Migration::move_keys`],
//!   [`Migration::finish`]), or in one go ([`RedisCluster::migrate_slot`]);
//! - manual failover ([`RedisCluster::failover`]) and, after a test kills or pauses a
//!   master, automatic failover ([`RedisCluster::wait_for_master_change`]).
//!
//! Every wait is bounded polling of what the nodes say (`CLUSTER INFO`, `CLUSTER NODES`,
//! `INFO replication`); when one runs out it panics with what was still missing and the
//! tail of every node's log.
//!
//! Nodes are numbered from 0: nodes `0..masters` start as masters (master `k` with the
//! `k`-th equal share of the 16384 slots), and replica `j` of master `k` is node
//! `masters + k * replicas + j`. Failovers change roles: [`RedisCluster::masters`],
//! [`RedisCluster::replicas_of`] and [`RedisCluster::role`] ask the nodes.
//!
//! ```no_run
//! use dlm_testkit::cluster::{RedisCluster, slot_of};
//!
//! let cluster = RedisCluster::spawn();
//! let slot = slot_of(b"{user1}:lock");
//! let owner = cluster.master_of_slot(slot);
//! let target = cluster.masters().into_iter().find(|&m| m != owner).unwrap();
//! let migration = cluster.begin_migration(slot, target);
//! migration.move_keys();
//! // ... the slot is MIGRATING on `owner`, IMPORTING on `target`: run load here ...
//! migration.finish();
//! assert_eq!(cluster.master_of_slot(slot), target);
//! let new_master = cluster.failover(target);
//! assert_eq!(cluster.master_of_slot(slot), new_master);
//! ```
//!
//! [`RedisServerBuilder::cluster_port`]: crate::redis_server::RedisServerBuilder::cluster_port

mod builder;
mod migration;
mod nodes;
mod proxied;
mod query;
mod slots;

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::redis_server::RedisServer;

pub use builder::RedisClusterBuilder;
pub use migration::Migration;
pub use slots::{SLOTS, key_in_slot, slot_of};

use nodes::{info_field, owners, serves_all};

/// How long [`RedisClusterBuilder::spawn`] may take to get a ready cluster.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a migration's end or a manual failover may take to settle.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// The pause between two polls of the nodes.
const POLL: Duration = Duration::from_millis(20);
/// Connect/read/write timeout of the polling connections.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Keys per `MIGRATE` in [`Migration::move_keys`].
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s own timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;
/// How many lines of each node's log a panic message quotes.
const LOG_TAIL_LINES: usize = 12;

/// What a node is, by its own account (`INFO replication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A master.
    Master,
    /// A replica of node `of`.
    Replica {
        /// The index of its master.
        of: usize,
        /// Whether its replication link to the master is up (`master_link_status:up`).
        link_up: bool,
    },
}

/// A Redis Cluster of real `redis-server` processes on loopback ports (see the [module
/// docs](self)). Dropping it kills and reaps every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The cluster node id of each node (kept in `nodes.conf`, so across restarts).
    ids: Vec<String>,
    /// The nodes' `requirepass`, for `MIGRATE ... AUTH`.
    password: Option<String>,
}

impl RedisCluster {
    /// Starts 3 masters with one replica each and returns once the cluster is ready.
    pub fn spawn() -> RedisCluster {
        Self::builder().spawn()
    }

    /// A builder for another shape or configuration.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// The URL of every node (`redis://[:password@]127.0.0.1:<port>/`, the password
    /// percent-encoded), in node order: seeds for a cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably (to kill or restart it).
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Every node, in order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// How many nodes there are (masters and replicas).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes (never true for a spawned cluster).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The cluster node id of node `i` (`CLUSTER MYID`).
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The node at `addr`, as redirections name it (`127.0.0.1:<port>`).
    pub fn node_index(&self, addr: &str) -> Option<usize> {
        let (host, port) = addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        if !matches!(host, "127.0.0.1" | "localhost" | "") {
            return None;
        }
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// What node `i` is, by its own account.
    ///
    /// # Panics
    /// When the node does not answer (killed; paused nodes block for 5 s first).
    pub fn role(&self, i: usize) -> Role {
        let info = self.nodes[i].info("replication");
        match info_field(&info, "role") {
            Some("master") => Role::Master,
            Some("slave") => {
                let port = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok());
                let of = port
                    .and_then(|port| self.nodes.iter().position(|n| n.port() == port))
                    .unwrap_or_else(|| {
                        self.fail(&format!("node {i} replicates no node of ours:\n{info}"))
                    });
                let link_up = info_field(&info, "master_link_status") == Some("up");
                Role::Replica { of, link_up }
            }
            _ => self.fail(&format!("node {i}: no role in INFO replication:\n{info}")),
        }
    }

    /// The running (not killed, not paused) nodes that are masters by their own account,
    /// in order.
    pub fn masters(&self) -> Vec<usize> {
        self.live()
            .into_iter()
            .filter(|&i| self.role(i) == Role::Master)
            .collect()
    }

    /// The running (not killed, not paused) nodes that replicate `master` by their own
    /// account, in order.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        self.live()
            .into_iter()
            .filter(|&i| matches!(self.role(i), Role::Replica { of, .. } if of == master))
            .collect()
    }

    /// The master that serves `slot`, as the first running node sees it (`CLUSTER
    /// NODES`; after [`spawn`](Self::spawn), [`Migration::finish`], [`failover`](Self::failover)
    /// or [`wait_for_master_change`](Self::wait_for_master_change) every node agrees).
    ///
    /// # Panics
    /// When `slot` is out of range, no node runs, or the slot is unassigned.
    pub fn master_of_slot(&self, slot: u16) -> usize {
        assert!(slot < SLOTS, "slot {slot} out of range");
        let (i, view) = self.first_view();
        let owner = owners(&view.lines)[usize::from(slot)]
            .unwrap_or_else(|| self.fail(&format!("node {i} sees slot {slot} unassigned")));
        self.index_of_id(owner)
            .unwrap_or_else(|| self.fail(&format!("node {i}: slot {slot} on unknown node {owner}")))
    }

    /// The slot ranges that node `master` serves, as the first running node sees it
    /// (empty for a replica).
    ///
    /// # Panics
    /// When no node runs.
    pub fn slots_of(&self, master: usize) -> Vec<RangeInclusive<u16>> {
        let (i, view) = self.first_view();
        let line = view
            .line(&self.ids[master])
            .unwrap_or_else(|| self.fail(&format!("node {i} does not know node {master}")));
        line.slots.iter().map(|&(a, b)| a..=b).collect()
    }

    /// A manual failover of `master` (`CLUSTER FAILOVER` on its first replica whose link
    /// is up): returns that replica's index once it is master of the old master's slots,
    /// the old master replicates it, and the cluster is stable again
    /// ([`wait_stable`](Self::wait_stable)). No write is lost: the replica catches up
    /// with the paused master before it takes over.
    ///
    /// # Panics
    /// When `master` is not a running master, has no replica with its link up, or the
    /// failover does not complete within 20 s.
    pub fn failover(&self, master: usize) -> usize {
        if self.role(master) != Role::Master {
            self.fail(&format!("node {master} is not a master: no failover"));
        }
        let replica = self
            .replicas_of(master)
            .into_iter()
            .find(|&r| matches!(self.role(r), Role::Replica { link_up: true, .. }))
            .unwrap_or_else(|| {
                self.fail(&format!("node {master} has no replica with its link up"))
            });
        let slots = self.slots_of(master);
        let _: () = self.run(replica, redis::cmd("CLUSTER").arg("FAILOVER"));
        let new_id = &self.ids[replica];
        let what = format!("failover of node {master} to node {replica}");
        self.wait_for(&what, CHANGE_TIMEOUT, || {
            let views = self.settled()?;
            serves_all(&views[0], &slots, new_id, replica)?;
            for (i, view) in &views {
                let me = view
                    .myself()
                    .ok_or_else(|| format!("node {i}: no myself line"))?;
                if *i == replica && !me.has("master") {
                    return Err(format!("node {replica} is still {}", me.flags.join(",")));
                }
                if *i == master && me.master.as_deref() != Some(new_id.as_str()) {
                    return Err(format!(
                        "node {master} does not replicate node {replica} yet"
                    ));
                }
            }
            Ok(())
        });
        replica
    }

    /// Waits until the slots that `old_master` served (as the first running node sees
    /// them at the call) are served by another node, and the cluster is stable
    /// ([`wait_stable`](Self::wait_stable); a killed or paused node is left out). Returns
    /// the new master. For tests that kill or pause a master: the cluster notices after
    /// the node timeout, and a replica takes over about a second later.
    ///
    /// # Panics
    /// When `old_master` serves no slots, or the change does not come within `limit`.
    pub fn wait_for_master_change(&self, old_master: usize, limit: Duration) -> usize {
        let slots = self.slots_of(old_master);
        let Some(first) = slots.first().map(|r| *r.start()) else {
            self.fail(&format!("node {old_master} serves no slots"));
        };
        let what = format!("another master for the slots of node {old_master}");
        self.wait_for(&what, limit, || {
            let views = self.settled()?;
            let owner = owners(&views[0].1.lines)[usize::from(first)]
                .ok_or_else(|| format!("slot {first} is unassigned"))?;
            let new = self
                .index_of_id(owner)
                .ok_or_else(|| format!("slot {first} on unknown node {owner}"))?;
            if new == old_master {
                return Err(format!("node {old_master} still serves slot {first}"));
            }
            serves_all(&views[0], &slots, owner, new)?;
            Ok(new)
        })
    }

    /// Waits until the cluster is stable: every running, unpaused node says
    /// `cluster_state:ok` and `cluster_slots_assigned:16384`, knows every node (no
    /// handshake), sees no running node as failing, agrees with the others on the slot
    /// map and on every running node's role, and, if it is a replica, has its
    /// replication link up. Killed or paused nodes are left out (the others may see them
    /// as failed).
    ///
    /// # Panics
    /// When the cluster is not stable within `limit` (the message says what was not).
    pub fn wait_stable(&self, limit: Duration) {
        self.wait_for("a stable cluster", limit, || self.settled().map(drop));
    }
}
