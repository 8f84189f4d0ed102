//! Redlock: one lock over N independent Redis masters. This file holds the type, its
//! construction and the `LockBackend` front; the rounds are in acquire.rs, fence.rs,
//! renewal.rs and release.rs.

mod acquire;
mod fence;
mod release;
mod renewal;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Renewal, Renewed, Watch,
};

use crate::fanout::{Fanout, Late, Replies, same_for_all};
use crate::hints::Hints;
use crate::node::Node;
use crate::options::Options;

/// The quorum of `n` nodes: a strict majority, `n / 2 + 1`.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// A lock over N independent Redis masters (the Redlock algorithm).
///
/// Every request goes to all nodes at once, with the same owner token on each, and an
/// operation returns as soon as its outcome is decided (a quorum acquired, released or
/// extended, or a quorum impossible): a stopped or slow minority costs no latency, and a
/// late reply is dealt with in the background (a late acquisition is released). An
/// acquisition succeeds when a quorum (`N/2 + 1`) took the key and the validity
/// `lease - elapsed - (lease x drift + 2 ms)`, counted from the start of the round, is
/// still positive; otherwise the key is released on all nodes, and the waiter retries
/// after a random delay. A node that does not answer within the per-node deadline
/// (connect timeout + I/O timeout, 200 ms by default) counts as failed.
///
/// Its assumptions (bounded clock drift between the nodes, no node that restarts without
/// its data inside a lease) are in the README's "Semantics and caveats".
///
/// Semaphores and read-write locks are refused (`Unsupported`): a majority of nodes per
/// permit does not bound the holders at N. With 3 nodes and 2 permits, A takes nodes 1
/// and 2, B nodes 2 and 3, C nodes 1 and 3: every node has 2 holders, yet 3 clients each
/// hold a majority. Use [`RedisBackend`](crate::RedisBackend) (one server, Sentinel or
/// Cluster) for them. Elections are refused too: a lead is a one-permit semaphore's hold,
/// and its published value would need a quorum of nodes to agree on every change, with
/// observers reading a quorum (a value changed on some nodes only would show two leaders'
/// values at once).
///
/// ```no_run
/// use dlm_core::{Lock, LockClient};
/// use dlm_redis::Redlock;
///
/// let backend = Redlock::new(&[
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])?;
/// let client = LockClient::new(backend);
/// let guard = client.get_lock("nightly-report")?.lock()?;
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    fanout: Fanout,
    options: Options,
    quorum: usize,
    hints: Option<Hints>,
    /// The largest fencing token this backend has seen a stream raised to, any slot's (0:
    /// none yet): the next fence proposes one above it (see [`Redlock::propose`]).
    proposals: AtomicU64,
    /// Per node, whether a fencing stream far ahead of the others was already logged.
    ahead_warned: Box<[AtomicBool]>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Each worker finishes its current connect first (bounded by the connect
        // timeout); the drainer drops its stragglers (their keys end with their leases).
        self.fanout.stop();
        for node in &self.nodes {
            node.stop_connect_worker();
        }
    }
}

impl Redlock {
    /// A Redlock over `nodes` with `options` (built and checked by its builder).
    pub(crate) fn assemble(nodes: Vec<Node>, options: Options) -> Redlock {
        let endpoints = nodes.iter().map(|n| n.endpoint.clone()).collect();
        let hints = Hints::when_enabled(&options, endpoints, quorum(nodes.len()));
        Redlock {
            inner: Arc::new(Inner {
                hints,
                quorum: quorum(nodes.len()),
                proposals: AtomicU64::new(0),
                ahead_warned: nodes.iter().map(|_| AtomicBool::new(false)).collect(),
                nodes: nodes.into_iter().map(Arc::new).collect(),
                fanout: Fanout::new("redlock"),
                options,
            }),
        }
    }

    /// The Redis keys and the channel of the lock called `name`.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a name that [`LockName::new`] rejects.
    pub fn keys(&self, name: &str) -> dlm_core::Result<crate::protocol::LockKeys> {
        Ok(self.nodes_ref()[0].keys.all(&LockName::new(name)?))
    }

    /// How many nodes there are.
    pub fn nodes(&self) -> usize {
        self.nodes_ref().len()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// How many nodes' release-hint listeners are subscribed now (they start with the
    /// first wait).
    pub fn release_hint_listeners(&self) -> usize {
        self.inner.hints.as_ref().map_or(0, |h| h.listeners_up())
    }

    /// How many threads this Redlock runs now, besides the connection pools' and the
    /// release-hint listeners' (its connect workers start on first need, one per node,
    /// and a drainer starts with the first reply that comes late).
    pub fn threads(&self) -> usize {
        self.inner.fanout.threads(&self.inner.nodes)
    }

    fn nodes_ref(&self) -> &[Arc<Node>] {
        &self.inner.nodes
    }

    fn deadline(&self, start: Instant) -> Instant {
        start + self.inner.options.connect_timeout + self.inner.options.io_timeout
    }
}

impl LockBackend for Redlock {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.acquire(name, owner, ttl, false)
    }

    /// The fenced acquire script on every node, carrying a proposal (one above the last
    /// token this backend saw): acquisition and token in one round when a quorum takes the
    /// lock and the proposal; a commit round follows when the proposal is not taken by a
    /// quorum (as in `fence`). The tokens are ordered as `fence`'s: a node draws only in
    /// the step that set (or found) our key.
    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let fenced = self.inner.options.fencing;
        self.acquire(name, owner, ttl, fenced)
    }

    /// The fence script on every node, with a proposal one above the largest token this
    /// backend has seen for the lock's slot: when a quorum takes it (their streams were
    /// below it), it is the token, in one round. Otherwise (another process fenced
    /// meanwhile, a node lost its stream, the first fence of the slot) the token is one
    /// above the streams of a quorum, committed in a second round.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.options.fencing {
            return Err(super::redis::fencing_off());
        }
        self.fence_round(name, owner)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.extend_hold(name, owner, ttl)
    }

    /// One batch per node (all the extensions in one write), all nodes at once: a round
    /// costs one round trip, whatever the number of holds; a node that has not answered
    /// when every hold is decided is left to the drainer.
    /// The mutex's holds only (Redlock keeps no other kind, `supports`): a renewal of
    /// another kind is answered `Unsupported` on its own, the others renewed as usual.
    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        let (mine, others): (Vec<usize>, Vec<usize>) =
            (0..renewals.len()).partition(|&i| renewals[i].claim == Claim::Exclusive);
        for i in others {
            renewed(
                i,
                Err(BackendError::new(
                    BackendErrorKind::Unsupported,
                    format!("Redlock keeps no {} holds", renewals[i].claim),
                )),
            );
        }
        let batch: Vec<Renewal<'_>> = mine.iter().map(|&i| renewals[i]).collect();
        for (&i, result) in mine.iter().zip(self.extend_holds(&batch)) {
            renewed(i, result);
        }
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.release_hold(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.force_release_all(name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            None,
            same_for_all(|node, _| node.keys.inspect_call(name)),
            |node, _, reply| node.reader().inspect(name, reply),
            // The q-th longest lease needs every answer (a busy node is not asked).
            |_: &Replies<Option<Duration>>| false,
            Late::Drop,
        );
        if replies.failures() > n - q {
            return Err(replies.error("inspect", q));
        }
        // Held while at least a quorum of nodes still has a key: until the q-th longest
        // remaining lease runs out.
        let mut remaining: Vec<Duration> = replies.ok().filter_map(|r| *r).collect();
        remaining.sort_unstable_by(|a, b| b.cmp(a));
        Ok(remaining.get(q - 1).copied())
    }

    /// A release message from any node wakes the waiter.
    fn watch(&self, name: &LockName) -> Option<Watch> {
        let hints = self.inner.hints.as_ref()?;
        hints.watch(self.nodes_ref().first()?.keys.channel(name))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        match (&self.inner.hints, self.nodes_ref().first()) {
            (Some(hints), Some(node)) => hints.wake_pending(|| node.keys.channel(name)),
            _ => false,
        }
    }

    fn kind(&self) -> &'static str {
        "redlock"
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<String> = self
            .nodes_ref()
            .iter()
            .map(|n| n.endpoint.to_string())
            .collect();
        f.debug_struct("Redlock")
            .field("nodes", &servers)
            .field("quorum", &self.inner.quorum)
            .field("prefix", &self.inner.options.prefix)
            .finish_non_exhaustive()
    }
}
