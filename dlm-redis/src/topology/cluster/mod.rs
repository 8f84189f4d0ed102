//! Redis Cluster: the slot map, one node (and pool) per master, and the redirections
//! (the cluster is its masters' [`Router`]).
//!
//! A lock's keys share one hash slot (`protocol/keys.rs`: the name is the hash tag, the fencing
//! stream's tag is chosen for that slot), so every request of a lock goes to one master:
//! the slot's, from the map. A `MOVED` updates the map and sends the request again to the
//! node it names; an `ASK` (a slot half migrated) sends it once, after `ASKING`, to the
//! importing node; `TRYAGAIN` and `CLUSTERDOWN` are retried after a short pause, within
//! the I/O timeout, then reported as `Unavailable` (the front retries those within its
//! error budget). A node that cannot be reached makes the map be asked for again (at most
//! every [`REFRESH_EVERY`]), so that a promoted replica is found after a failover.
//!
//! Here: the slot map and its nodes; the redirections, read and followed
//! (`redirect.rs`); the checks of the seeds at build (`setup.rs`).

// The children extend `Cluster` (its routing, its construction) and import from here,
// never the other way; `Redirect` is reached as `cluster::redirect::Redirect`.
pub(super) mod redirect;
mod setup;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dlm_core::{BackendError, BackendErrorKind};
use parking_lot::{Mutex, RwLock};

use crate::conn::{Endpoint, Locate, Timeouts};
use crate::node::{Node, Router};
use crate::options::{Options, Tls};
use crate::slot::SLOTS;
use crate::transport::Wire;

/// The shortest time between two reads of the slot map.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The masters and who serves which slot.
struct SlotMap {
    /// By `host:port`.
    nodes: HashMap<String, Arc<Node>>,
    /// The master of each slot; `None` for a slot no master serves.
    slots: Vec<Option<Arc<Node>>>,
}

/// One Redis Cluster.
pub(crate) struct Cluster {
    options: Options,
    /// The seeds, for the first read of the map and when no known master answers.
    seeds: Vec<Endpoint>,
    /// The TLS configuration of the seeds (`rediss://`), used for every node.
    tls: Tls,
    map: RwLock<SlotMap>,
    /// When the map was last read; locked while it is being read.
    refreshed: Mutex<Option<Instant>>,
    /// Given to the nodes, which route their requests through the cluster.
    me: Weak<Cluster>,
}

impl Cluster {
    /// The master of `slot` now.
    pub(crate) fn node(&self, slot: u16) -> Result<Arc<Node>, BackendError> {
        if let Some(node) = &self.map.read().slots[usize::from(slot)] {
            return Ok(node.clone());
        }
        self.refresh();
        self.map.read().slots[usize::from(slot)]
            .clone()
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("redis cluster: no master serves slot {slot} (CLUSTERDOWN)"),
                )
            })
    }

    /// The masters now, one each.
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        self.map.read().nodes.values().cloned().collect()
    }

    /// The node at `addr` (`host:port`, or `:port` for the host of `from`), made if new.
    fn node_at(&self, from: &Node, addr: &str) -> Result<Arc<Node>, BackendError> {
        if let Some(node) = self.map.read().nodes.get(addr) {
            return Ok(node.clone());
        }
        let endpoint = self.endpoint_at(&from.endpoint, addr)?;
        let key = endpoint.host_port().unwrap_or_else(|| addr.to_owned());
        let mut map = self.map.write();
        Ok(map
            .nodes
            .entry(key)
            .or_insert_with(|| self.new_node(endpoint))
            .clone())
    }

    /// After `MOVED slot addr`: the slot's master is `addr`.
    fn moved(&self, from: &Node, slot: u16, addr: &str) -> Result<Arc<Node>, BackendError> {
        let node = self.node_at(from, addr)?;
        self.map.write().slots[usize::from(slot)] = Some(node.clone());
        Ok(node)
    }

    /// The endpoint of `addr` (`host:port`, or `:port` for the host of `from`), with the
    /// seeds' credentials, database and TLS.
    fn endpoint_at(&self, from: &Endpoint, addr: &str) -> Result<Endpoint, BackendError> {
        let bad = || {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("{from}: a node address makes no sense: {addr:?}"),
            )
        };
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = if host.is_empty() || host == "?" {
            from.host().ok_or_else(bad)?
        } else {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        };
        from.moved_to(&host, port, self.tls.as_ref().map(|(c, o)| (c, o)))
            .map_err(|e| BackendError::new(BackendErrorKind::Tls, format!("{addr}: {e}")))
    }

    fn new_node(&self, endpoint: Endpoint) -> Arc<Node> {
        let router: Weak<dyn Router> = self.me.clone();
        Arc::new(Node::new(endpoint, &self.options).routed_by(router))
    }

    /// Reads the slot map again, from a master that answers (or a seed), unless another
    /// thread is doing it or it was read less than [`REFRESH_EVERY`] ago.
    pub(crate) fn refresh(&self) {
        let Some(refreshed) = self.refreshed.try_lock() else {
            return;
        };
        if refreshed.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return;
        }
        self.read_map(refreshed);
    }

    /// Reads the slot map again unless it was read after `since` (waits for a read under
    /// way).
    pub(crate) fn refresh_since(&self, since: Instant) {
        let refreshed = self.refreshed.lock();
        if refreshed.is_some_and(|t| t > since) {
            return;
        }
        self.read_map(refreshed);
    }

    fn read_map(&self, mut refreshed: parking_lot::MutexGuard<'_, Option<Instant>>) {
        let t = self.options.timeouts();
        let known: Vec<Endpoint> = self
            .masters()
            .iter()
            .filter(|n| n.down().is_none())
            .map(|n| n.endpoint.clone())
            .collect();
        for endpoint in known.iter().chain(&self.seeds) {
            let slots = endpoint
                .connect(t)
                .and_then(|mut con| cluster_slots(&mut con, endpoint));
            match slots.and_then(|slots| self.apply(endpoint, &slots)) {
                Ok(()) => break,
                Err(e) => log::debug!("redis cluster: reading the slot map: {e}"),
            }
        }
        *refreshed = Some(Instant::now());
    }

    /// Makes the map from a `CLUSTER SLOTS` reply of `from`.
    fn apply(&self, from: &Endpoint, reply: &redis::Value) -> Result<(), BackendError> {
        let bad = |why: &str| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("{from}: CLUSTER SLOTS: {why}"),
            )
        };
        let redis::Value::Array(ranges) = reply else {
            return Err(bad("not an array"));
        };
        let mut owners: Vec<(u16, u16, String)> = Vec::with_capacity(ranges.len());
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                return Err(bad("a range is not an array"));
            };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end)), Some(master)) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return Err(bad("a range without its bounds and master"));
            };
            let redis::Value::Array(master) = master else {
                return Err(bad("a master is not an array"));
            };
            let host = match master.first() {
                Some(redis::Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                _ => String::new(),
            };
            let Some(redis::Value::Int(port)) = master.get(1) else {
                return Err(bad("a master without a port"));
            };
            let (Ok(start), Ok(end), Ok(port)) = (
                u16::try_from(*start),
                u16::try_from(*end),
                u16::try_from(*port),
            ) else {
                return Err(bad("a number out of range"));
            };
            if usize::from(end) >= SLOTS || start > end {
                return Err(bad("a slot out of range"));
            }
            owners.push((start, end, format!("{host}:{port}")));
        }
        let mut endpoints = HashMap::new();
        for (_, _, addr) in &owners {
            if !endpoints.contains_key(addr) {
                endpoints.insert(addr.clone(), self.endpoint_at(from, addr)?);
            }
        }
        let mut map = self.map.write();
        let mut nodes = HashMap::new();
        for (addr, endpoint) in endpoints {
            let key = endpoint.host_port().unwrap_or_else(|| addr.clone());
            let node = match map.nodes.get(&key) {
                Some(node) => node.clone(),
                None => self.new_node(endpoint),
            };
            nodes.insert(addr, node);
        }
        let mut slots = vec![None; SLOTS];
        for (start, end, addr) in &owners {
            for slot in &mut slots[usize::from(*start)..=usize::from(*end)] {
                *slot = nodes.get(addr).cloned();
            }
        }
        map.slots = slots;
        map.nodes = nodes
            .into_values()
            .map(|n| (n.endpoint.host_port().unwrap_or_default(), n))
            .collect();
        Ok(())
    }

    /// The endpoint of any node of the cluster that answers (the release-hint listener's:
    /// classic pub/sub reaches every node of a cluster). The address, credentials and TLS
    /// come from the cluster's nodes on each connect.
    pub(crate) fn any_node(self: &Arc<Self>) -> Endpoint {
        use redis::IntoConnectionInfo;
        Endpoint::located(
            "redis://127.0.0.1/"
                .into_connection_info()
                .expect("a valid URL"),
            "redis cluster (any node)".into(),
            self.clone(),
        )
    }

    /// A connection to any master that answers, or else a seed.
    fn connect_any(&self, t: Timeouts) -> Result<Wire, BackendError> {
        let masters: Vec<Endpoint> = self.masters().iter().map(|n| n.endpoint.clone()).collect();
        let mut last = None;
        for endpoint in masters.iter().chain(&self.seeds) {
            match endpoint.connect(t) {
                Ok(con) => return Ok(con),
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        self.refresh();
        Err(last.unwrap_or_else(|| {
            BackendError::new(BackendErrorKind::Unavailable, "redis cluster: no node")
        }))
    }
}

impl Locate for Cluster {
    fn connect(&self, t: Timeouts) -> Result<(Wire, u64), BackendError> {
        self.connect_any(t).map(|con| (con, 0))
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.map.read();
        f.debug_struct("Cluster")
            .field("masters", &map.nodes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// `CLUSTER SLOTS` on `con`.
fn cluster_slots(con: &mut Wire, endpoint: &Endpoint) -> Result<redis::Value, BackendError> {
    redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(con)
        .map_err(|e| endpoint.error(&e))
}
