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

use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::thread;
use std::time::{Duration, Instant};

use crate::redis_server::{RedisServer, RedisServerBuilder};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

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

/// The hash slot of `key`, by Redis Cluster's rule (as `CLUSTER KEYSLOT`): CRC16 (XMODEM)
/// modulo 16384 of the key, or of its hash tag, the part between the first `{` and the
/// first `}` after it, when that part is not empty.
pub fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// A key in `slot`: `{tag}name`, with the first decimal tag that hashes to `slot`.
///
/// # Panics
/// When `slot` is not below [`SLOTS`].
pub fn key_in_slot(slot: u16, name: &str) -> String {
    assert!(slot < SLOTS, "slot {slot} out of range");
    let tag = (0u32..)
        .map(|n| n.to_string())
        .find(|tag| crc16(tag.as_bytes()) % SLOTS == slot)
        .expect("every slot has a decimal tag");
    format!("{{{tag}}}{name}")
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum of key slots.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (0..8).fold(crc ^ (u16::from(b) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

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

    /// Starts moving `slot` from its master to master `to`, in the order of the Redis
    /// docs (`CLUSTER SETSLOT`): `IMPORTING` on the target, then `MIGRATING` on the
    /// source. While the [`Migration`] is open, the source answers `ASK` for keys of the
    /// slot it no longer holds, and `TRYAGAIN` for multi-key commands that span moved and
    /// unmoved keys.
    ///
    /// # Panics
    /// When `to` is not a master or already serves the slot, or a command fails.
    pub fn begin_migration(&self, slot: u16, to: usize) -> Migration<'_> {
        let from = self.master_of_slot(slot);
        if from == to {
            self.fail(&format!("slot {slot} is already on node {to}"));
        }
        if self.role(to) != Role::Master {
            self.fail(&format!(
                "node {to} is not a master: cannot import slot {slot}"
            ));
        }
        let setslot = |node: usize, state: &str, other: usize| {
            let _: () = self.run(
                node,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(&self.ids[other]),
            );
        };
        setslot(to, "IMPORTING", from);
        setslot(from, "MIGRATING", to);
        Migration {
            cluster: self,
            slot,
            source: from,
            target: to,
        }
    }

    /// Moves `slot` to master `to` in one go ([`begin_migration`](Self::begin_migration)
    /// then [`Migration::finish`]).
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        self.begin_migration(slot, to).finish();
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

    /// The running, unpaused nodes.
    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running() && !self.nodes[i].is_paused())
            .collect()
    }

    fn index_of_id(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|x| x == id)
    }

    /// The view of the first running, unpaused node; panics if there is none.
    fn first_view(&self) -> (usize, View) {
        let Some(&i) = self.live().first() else {
            self.fail("no node is running");
        };
        let view = self
            .view(i)
            .unwrap_or_else(|e| self.fail(&format!("node {i}: {e}")));
        (i, view)
    }

    /// What node `i` says about the cluster.
    fn view(&self, i: usize) -> Result<View, String> {
        let node = &self.nodes[i];
        let query = || -> redis::RedisResult<(String, String, String)> {
            let client = redis::Client::open(node.url())?;
            let mut con = client.get_connection_with_timeout(QUERY_TIMEOUT)?;
            con.set_read_timeout(Some(QUERY_TIMEOUT))?;
            con.set_write_timeout(Some(QUERY_TIMEOUT))?;
            redis::pipe()
                .cmd("CLUSTER")
                .arg("INFO")
                .cmd("CLUSTER")
                .arg("NODES")
                .cmd("INFO")
                .arg("replication")
                .query(&mut con)
        };
        let (info, nodes, replication) = query().map_err(|e| e.to_string())?;
        Ok(View {
            info,
            lines: parse_nodes(&nodes)?,
            replication,
        })
    }

    /// Whether every node knows every node, past the handshake.
    fn all_known(&self) -> Result<(), String> {
        for i in self.live() {
            let view = self.view(i).map_err(|e| format!("node {i}: {e}"))?;
            self.knows_all(i, &view)?;
        }
        Ok(())
    }

    fn knows_all(&self, i: usize, view: &View) -> Result<(), String> {
        if view.lines.len() != self.nodes.len() {
            return Err(format!(
                "node {i} knows {} nodes, not {}",
                view.lines.len(),
                self.nodes.len()
            ));
        }
        for (j, id) in self.ids.iter().enumerate() {
            let line = view
                .line(id)
                .ok_or_else(|| format!("node {i} does not know node {j}"))?;
            if line.has("handshake") || line.has("noaddr") {
                return Err(format!(
                    "node {i} sees node {j} as {}",
                    line.flags.join(",")
                ));
            }
        }
        Ok(())
    }

    /// The views of the running nodes if the cluster is stable (see
    /// [`wait_stable`](Self::wait_stable)), else what is not.
    fn settled(&self) -> Result<Vec<(usize, View)>, String> {
        let live = self.live();
        if live.is_empty() {
            return Err("no node is running".to_owned());
        }
        let mut views = Vec::with_capacity(live.len());
        for &i in &live {
            let view = self.view(i).map_err(|e| format!("node {i}: {e}"))?;
            views.push((i, view));
        }
        for (i, view) in &views {
            let state = info_field(&view.info, "cluster_state");
            if state != Some("ok") {
                return Err(format!("node {i}: cluster_state:{}", state.unwrap_or("?")));
            }
            let assigned = info_field(&view.info, "cluster_slots_assigned");
            if assigned != Some("16384") {
                return Err(format!(
                    "node {i}: cluster_slots_assigned:{}",
                    assigned.unwrap_or("?")
                ));
            }
            self.knows_all(*i, view)?;
            for &j in &live {
                let line = view.line(&self.ids[j]).expect("checked by knows_all");
                if line.has("fail") || line.has("fail?") {
                    return Err(format!(
                        "node {i} sees node {j} as {}",
                        line.flags.join(",")
                    ));
                }
            }
            if info_field(&view.replication, "role") == Some("slave") {
                let link = info_field(&view.replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!(
                        "node {i}: master_link_status:{}",
                        link.unwrap_or("?")
                    ));
                }
            }
        }
        let (first, reference) = &views[0];
        let slot_map = owners(&reference.lines);
        for (i, view) in &views[1..] {
            let other = owners(&view.lines);
            if let Some(slot) = (0..slot_map.len()).find(|&s| slot_map[s] != other[s]) {
                return Err(format!(
                    "nodes {first} and {i} disagree on slot {slot}: {:?} vs {:?}",
                    slot_map[slot].map(|id| self.index_of_id(id)),
                    other[slot].map(|id| self.index_of_id(id)),
                ));
            }
        }
        for (j, own) in &views {
            let me = own
                .myself()
                .ok_or_else(|| format!("node {j}: no myself line"))?;
            for (i, view) in &views {
                let seen = view.line(&self.ids[*j]).expect("checked by knows_all");
                if (seen.has("master"), &seen.master) != (me.has("master"), &me.master) {
                    return Err(format!(
                        "node {i} sees node {j} as {} (of {:?}), it says {} (of {:?})",
                        seen.flags.join(","),
                        seen.master.as_deref().and_then(|id| self.index_of_id(id)),
                        me.flags.join(","),
                        me.master.as_deref().and_then(|id| self.index_of_id(id)),
                    ));
                }
            }
        }
        Ok(views)
    }

    /// Polls `check` until it succeeds or `limit` runs out (then panics with its last
    /// complaint and the nodes' logs).
    fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        let start = Instant::now();
        loop {
            let why = match check() {
                Ok(v) => {
                    log::debug!("redis cluster: {what} after {:?}", start.elapsed());
                    return v;
                }
                Err(why) => why,
            };
            if start.elapsed() > limit {
                self.fail(&format!("waited {limit:?} for {what}; still: {why}"));
            }
            thread::sleep(POLL);
        }
    }

    /// Runs `cmd` on node `i`; panics with the logs if it fails.
    fn run<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.nodes[i].connection())
            .unwrap_or_else(|e| self.fail(&format!("node {i}: {} failed: {e}", cmd_text(cmd))))
    }

    /// Panics with `msg`, the nodes' ports and the tail of every node's log.
    fn fail(&self, msg: &str) -> ! {
        let mut logs = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let log = node.log_contents();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
            let _ = writeln!(
                logs,
                "--- node {i} (port {}, pid {}) redis.log tail ---\n{tail}",
                node.port(),
                node.pid()
            );
        }
        let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
        panic!("redis cluster on ports {ports:?}: {msg}\n{logs}")
    }
}

/// Whether `view` shows every slot of `slots` on node `id` (index `index`).
fn serves_all(
    (i, view): &(usize, View),
    slots: &[RangeInclusive<u16>],
    id: &str,
    index: usize,
) -> Result<(), String> {
    let owners = owners(&view.lines);
    for slot in slots.iter().flat_map(|r| r.clone()) {
        if owners[usize::from(slot)] != Some(id) {
            return Err(format!("node {i} does not see slot {slot} on node {index}"));
        }
    }
    Ok(())
}

/// A slot migration under way (see [`RedisCluster::begin_migration`]). Finish it with
/// [`finish`](Self::finish): dropped unfinished, it leaves the slot half moved.
#[must_use = "a migration left unfinished leaves its slot MIGRATING/IMPORTING"]
#[derive(Debug)]
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    source: usize,
    target: usize,
}

impl Migration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The node the slot moves from.
    pub fn source(&self) -> usize {
        self.source
    }

    /// The node the slot moves to.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Moves up to `max` of the slot's keys still on the source to the target
    /// (`CLUSTER GETKEYSINSLOT`, then one `MIGRATE ... KEYS`); returns how many it sent
    /// (0 once none is left).
    ///
    /// # Panics
    /// When a command fails.
    pub fn move_some(&self, max: usize) -> usize {
        let c = self.cluster;
        let keys: Vec<Vec<u8>> = c.run(
            self.source,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(max),
        );
        if keys.is_empty() {
            return 0;
        }
        let target = &c.nodes[self.target];
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(target.port())
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS);
        if let Some(pw) = &c.password {
            migrate.arg("AUTH").arg(pw);
        }
        migrate.arg("KEYS");
        for key in &keys {
            migrate.arg(key.as_slice());
        }
        // "NOKEY" when every key expired in between.
        let _: String = c.run(self.source, &migrate);
        keys.len()
    }

    /// Moves every key of the slot still on the source to the target, in batches of 100;
    /// returns how many it moved.
    ///
    /// # Panics
    /// When a command fails.
    pub fn move_keys(&self) -> usize {
        let mut moved = 0;
        loop {
            match self.move_some(MIGRATE_BATCH) {
                0 => return moved,
                n => moved += n,
            }
        }
    }

    /// Moves any keys left ([`move_keys`](Self::move_keys)), then assigns the slot to the
    /// target, in the order of the Redis docs: `CLUSTER SETSLOT <slot> NODE <target>` on
    /// the target, the source, then the other masters. Returns once every running node
    /// agrees that the target serves the slot, no node has it open, and the cluster is
    /// stable ([`RedisCluster::wait_stable`]).
    ///
    /// # Panics
    /// When a command fails, or the nodes do not agree within 20 s.
    pub fn finish(self) {
        self.move_keys();
        let c = self.cluster;
        let target_id = &c.ids[self.target];
        let assign = |node: usize| {
            let _: () = c.run(
                node,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(target_id),
            );
        };
        assign(self.target);
        assign(self.source);
        for m in c.masters() {
            if m != self.target && m != self.source {
                assign(m);
            }
        }
        let slot = self.slot;
        let what = format!("slot {slot} on node {} everywhere", self.target);
        c.wait_for(&what, CHANGE_TIMEOUT, || {
            let views = c.settled()?;
            for view in &views {
                serves_all(view, &[slot..=slot], target_id, self.target)?;
                let (i, view) = view;
                if view.myself().is_some_and(|me| me.open.contains(&slot)) {
                    return Err(format!("node {i} still has slot {slot} open"));
                }
            }
            Ok(())
        });
    }
}

/// What one node says: `CLUSTER INFO`, `CLUSTER NODES` (parsed), `INFO replication`.
#[derive(Debug)]
struct View {
    info: String,
    lines: Vec<NodeLine>,
    replication: String,
}

impl View {
    fn line(&self, id: &str) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.id == id)
    }

    fn myself(&self) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.has("myself"))
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, PartialEq)]
struct NodeLine {
    id: String,
    flags: Vec<String>,
    /// The master's id, for a replica.
    master: Option<String>,
    /// Served slot ranges.
    slots: Vec<(u16, u16)>,
    /// Slots being imported or migrated (`[slot-<-id]`, `[slot->-id]`; myself only).
    open: Vec<u16>,
}

impl NodeLine {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Parses `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <config-epoch>
/// <link-state> <slot> <slot> ...`.
fn parse_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    let bad = |line: &str| format!("unexpected CLUSTER NODES line {line:?}");
    let slot = |s: &str, line: &str| s.parse::<u16>().map_err(|_| bad(line));
    let mut lines = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(bad(line));
        }
        let mut node = NodeLine {
            id: fields[0].to_owned(),
            flags: fields[2].split(',').map(str::to_owned).collect(),
            master: (fields[3] != "-").then(|| fields[3].to_owned()),
            slots: Vec::new(),
            open: Vec::new(),
        };
        for entry in &fields[8..] {
            if let Some(open) = entry.strip_prefix('[') {
                let number = open.split('-').next().unwrap_or_default();
                node.open.push(slot(number, line)?);
            } else if let Some((a, b)) = entry.split_once('-') {
                node.slots.push((slot(a, line)?, slot(b, line)?));
            } else {
                let s = slot(entry, line)?;
                node.slots.push((s, s));
            }
        }
        lines.push(node);
    }
    Ok(lines)
}

/// The owner (node id) of each slot.
fn owners(lines: &[NodeLine]) -> Vec<Option<&str>> {
    let mut owners = vec![None; usize::from(SLOTS)];
    for line in lines {
        for &(a, b) in &line.slots {
            for s in a..=b.min(SLOTS - 1) {
                owners[usize::from(s)] = Some(line.id.as_str());
            }
        }
    }
    owners
}

/// The value of `name:` in `INFO`-style text.
fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

/// The command as text, for messages.
fn cmd_text(cmd: &redis::Cmd) -> String {
    let args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
        _ => "<cursor>".to_owned(),
    });
    args.collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{a}b"), slot_of(b"a"));
        assert_eq!(slot_of(b"a{b}{c}"), slot_of(b"b"));
        assert_eq!(slot_of(b"{{x}}"), slot_of(b"{x"));
        assert_ne!(slot_of(b"{}x"), slot_of(b"x"));
        assert_eq!(slot_of(b"{}x"), crc16(b"{}x") % SLOTS);
        for slot in [0, 1, 5460, 16383] {
            assert_eq!(slot_of(key_in_slot(slot, "k").as_bytes()), slot);
        }
    }

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

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002,host master - 0 1426238316232 2 connected 5461-10922 [77->-292f]
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 16383 [93-<-292f]
";
        let lines = parse_nodes(text).unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].master.as_deref(), Some("e7d1"));
        assert!(lines[0].has("slave") && lines[0].slots.is_empty());
        assert_eq!(lines[1].slots, vec![(5461, 10922)]);
        assert_eq!(lines[1].open, vec![77]);
        assert!(lines[2].has("myself"));
        assert_eq!(lines[2].slots, vec![(0, 5460), (16383, 16383)]);
        assert_eq!(lines[2].open, vec![93]);
        let owners = owners(&lines);
        assert_eq!(owners[0], Some("e7d1"));
        assert_eq!(owners[6000], Some("67ed"));
        assert_eq!(owners[12000], None);
        assert!(parse_nodes("garbage").is_err());
    }
}
