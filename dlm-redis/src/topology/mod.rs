//! Topologies: which node serves a lock (one server, the master the sentinels name, the
//! master of the lock's slot in a Redis Cluster), and the one rule for a request that
//! failed because that may have changed. Above the nodes; below the backends.

mod cluster;
mod sentinel;

use std::sync::Arc;
use std::time::Instant;

use dlm_core::backend::BackendError;

pub(crate) use cluster::Cluster;
pub(crate) use sentinel::{Discovery, Watcher};

use crate::conn::Timeouts;
use crate::node::Node;

/// Where a backend's lock keys live.
pub(crate) enum Topology {
    /// One server.
    One(Arc<Node>),
    /// The master a Sentinel deployment names: the node's endpoint finds it on each
    /// connect (see [`Discovery`]).
    Sentinel(Arc<Node>, Arc<Discovery>),
    /// The master of the key's slot in a Redis Cluster.
    Cluster(Arc<Cluster>),
}

impl Topology {
    /// The backend's `kind` (the `backend` label of dlm's metrics).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Topology::One(_) => "redis",
            Topology::Sentinel(..) => "sentinel",
            Topology::Cluster(_) => "cluster",
        }
    }

    /// The node that serves `slot` now (computed only where it matters: in a cluster).
    pub(crate) fn node(&self, slot: impl FnOnce() -> u16) -> Result<Arc<Node>, BackendError> {
        match self {
            Topology::One(node) | Topology::Sentinel(node, _) => Ok(node.clone()),
            Topology::Cluster(cluster) => cluster.node(slot()),
        }
    }

    /// Every node known now (a cluster's masters).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Topology::One(node) | Topology::Sentinel(node, _) => vec![node.clone()],
            Topology::Cluster(cluster) => cluster.masters(),
        }
    }

    /// Where a release-hint listener subscribes: the server, or any node of a cluster
    /// (classic pub/sub reaches every node).
    pub(crate) fn listener(&self) -> crate::conn::Endpoint {
        match self {
            Topology::One(node) | Topology::Sentinel(node, _) => node.endpoint.clone(),
            Topology::Cluster(cluster) => cluster.any_node(),
        }
    }

    /// Runs `f` on the node that serves `slot`. When it fails with a transient error
    /// (the server went away, was demoted, stopped answering) and the topology says the
    /// slot is served elsewhere now, `f` runs once more there: Sentinel names another
    /// master (asked again if need be), or the cluster's slot map, read again, names
    /// another master. So a holder's release during a failover reaches the new master
    /// instead of leaving the lock to its lease; on one fixed server nothing moves.
    pub(crate) fn on_slot<T>(
        &self,
        slot: impl Fn() -> u16,
        t: Timeouts,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let node = self.node(&slot)?;
        let generation = node.endpoint.generation();
        let failed = match f(&node) {
            Err(e) if e.is_transient() => e,
            other => return other,
        };
        match self.moved(slot, &node, generation, Instant::now(), t) {
            Some(now) => f(&now),
            None => Err(failed),
        }
    }

    /// After a transient failure of a request made to `node` (in address `generation`)
    /// for `slot`, at `failed_at`: the node that serves `slot` now, if that changed.
    fn moved(
        &self,
        slot: impl FnOnce() -> u16,
        node: &Arc<Node>,
        generation: u64,
        failed_at: Instant,
        t: Timeouts,
    ) -> Option<Arc<Node>> {
        match self {
            Topology::One(_) => None,
            // The same node, at the address of the master named now.
            Topology::Sentinel(one, _) => {
                one.endpoint.moved_since(generation, t).then(|| one.clone())
            }
            Topology::Cluster(cluster) => {
                cluster.refresh_since(failed_at);
                cluster
                    .node(slot())
                    .ok()
                    .filter(|now| !Arc::ptr_eq(now, node))
            }
        }
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topology::One(node) | Topology::Sentinel(node, _) => write!(f, "{}", node.endpoint),
            Topology::Cluster(cluster) => write!(f, "{cluster:?}"),
        }
    }
}
