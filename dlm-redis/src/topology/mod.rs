//! Topologies: which node serves a lock (one server, the master the sentinels name, the
//! master of the lock's slot in a Redis Cluster), and the one rule for a request that
//! failed because that may have changed. Above the nodes; below the backends.
//!
//! Each deployment's own rules live in its folder: `sentinel/` (finding the master, the
//! watcher, the release journal, the checks at build), `cluster/` (the slot map, the
//! redirections read and followed, the checks of the seeds). Here: the [`Topology`] and
//! the one rule both share ([`Topology::on_slot`]).

mod cluster;
mod sentinel;

use std::sync::Arc;
use std::time::Instant;

use dlm_core::backend::{BackendError, Claim, LockName, OwnerToken};

pub(crate) use cluster::Cluster;
pub(crate) use cluster::redirect::Redirect;
pub(crate) use sentinel::{MasterAuth, Sentinel};

use crate::conn::Timeouts;
use crate::node::Node;

/// Where a backend's lock keys live.
pub(crate) enum Topology {
    /// One server.
    One(Arc<Node>),
    /// The master a Sentinel deployment names: its node's endpoint finds it on each
    /// connect (see [`Sentinel`]).
    Sentinel(Arc<Sentinel>),
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
            Topology::One(node) => Ok(node.clone()),
            Topology::Sentinel(sentinel) => Ok(sentinel.node.clone()),
            Topology::Cluster(cluster) => cluster.node(slot()),
        }
    }

    /// Every node known now (a cluster's masters).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Topology::One(node) => vec![node.clone()],
            Topology::Sentinel(sentinel) => vec![sentinel.node.clone()],
            Topology::Cluster(cluster) => cluster.masters(),
        }
    }

    /// Where a release-hint listener subscribes: the server, or any node of a cluster
    /// (classic pub/sub reaches every node).
    pub(crate) fn listener(&self) -> crate::conn::Endpoint {
        match self {
            Topology::One(node) => node.endpoint.clone(),
            Topology::Sentinel(sentinel) => sentinel.node.endpoint.clone(),
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

    /// [`on_slot`](Self::on_slot) for `f`, a release of `owner`'s `claim` hold of `name`
    /// that says whether it released. With Sentinel, a release made is journaled, to be
    /// sent again to the next master if this one was being replaced (see
    /// [`Sentinel::journaled`]).
    pub(crate) fn release_on_slot(
        &self,
        slot: impl Fn() -> u16,
        t: Timeouts,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        f: impl Fn(&Node) -> Result<bool, BackendError>,
    ) -> Result<bool, BackendError> {
        match self {
            Topology::Sentinel(sentinel) => {
                sentinel.journaled(name, claim, owner, || self.on_slot(slot, t, f))
            }
            Topology::One(_) | Topology::Cluster(_) => self.on_slot(slot, t, f),
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
            Topology::Sentinel(sentinel) => {
                let one = &sentinel.node;
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
            Topology::One(node) => write!(f, "{}", node.endpoint),
            Topology::Sentinel(sentinel) => write!(f, "{}", sentinel.node.endpoint),
            Topology::Cluster(cluster) => write!(f, "{cluster:?}"),
        }
    }
}
