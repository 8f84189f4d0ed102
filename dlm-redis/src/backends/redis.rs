//! The single-instance backend.

mod claims;
mod handover;
mod renewals;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holders, Lease,
    LockBackend, LockName, OwnerToken, Renewal, Renewed, Watch, every_hold_kind,
};

use crate::fanout::Fanout;
use crate::hints::Hints;
use crate::node::Node;
use crate::protocol::{Keys, NodeAcquire, ReleaseId};
use crate::topology::Topology;

use crate::options::Options;

/// A lock on one Redis server.
///
/// Safe while that one server keeps its data: a failover to a replica or a restart without
/// persistence can lose a lock that is held (see the README's "Semantics and caveats").
/// Fencing tokens are IDs drawn from the fencing stream of the lock's cluster slot, on
/// the first [`fencing_token`](dlm_core::LockGuard::fencing_token) of a hold, by a script
/// that checks that the lock is still ours and draws (`XADD`) in one step: they increase
/// even after the server lost its data, as long as its clock has not gone back below them.
///
/// ```no_run
/// use dlm_core::{Lock, LockClient};
/// use dlm_redis::RedisBackend;
///
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379/").build()?;
/// let client = LockClient::new(backend);
/// let guard = client.get_lock("invoice-42")?.lock()?;
/// println!("fencing token {}", guard.fencing_token()?);
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    target: Topology,
    keys: Keys,
    options: Options,
    hints: Option<Hints>,
    /// Renewals go to every node at once (in a cluster, every master of the holds).
    fanout: Fanout,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.fanout.stop();
        for node in self.target.nodes() {
            node.stop_connect_worker();
        }
    }
}

impl RedisBackend {
    /// The Redis keys and the channel of the lock called `name`.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a name that [`LockName::new`] rejects.
    pub fn keys(&self, name: &str) -> dlm_core::Result<crate::protocol::LockKeys> {
        Ok(self.inner.keys.all(&LockName::new(name)?))
    }

    /// [`fenced_set`](crate::fenced_set) on this backend's server, over its pooled
    /// connections (with its TLS, credentials, database and timeouts): the resource-side
    /// check for a value kept next to the lock.
    ///
    /// ```no_run
    /// use dlm_core::{Lock, LockClient};
    /// use dlm_redis::{FencedWriteError, RedisBackend};
    ///
    /// let backend = std::sync::Arc::new(RedisBackend::new("redis://127.0.0.1:6379/")?);
    /// let client = LockClient::new(backend.clone());
    /// let guard = client.get_lock("report:42")?.lock()?;
    /// let token = guard.fencing_token()?;
    /// match backend.fenced_set("report:42:value", token, b"done") {
    ///     Ok(()) => {}
    ///     Err(FencedWriteError::Stale(e)) => eprintln!("a newer holder wrote first: {e}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// assert_eq!(backend.fenced_get("report:42:value")?, Some((b"done".to_vec(), token)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`FencedWriteError::Stale`](crate::fenced::FencedWriteError::Stale) when a newer token wrote
    /// first; [`FencedWriteError::Backend`](crate::fenced::FencedWriteError::Backend) when Redis
    /// fails.
    pub fn fenced_set(
        &self,
        key: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<(), crate::fenced::FencedWriteError> {
        let reply = self
            .on_node_of_key(key, |node| {
                node.run(|con| crate::fenced::set_request(con, key, token, value))
            })
            .map_err(crate::fenced::FencedWriteError::Backend)?;
        crate::fenced::set_verdict(token, reply)
    }

    /// [`fenced_get`](crate::fenced_get) on this backend's server, over its pooled
    /// connections: the value stored by [`fenced_set`](RedisBackend::fenced_set) at `key`,
    /// with the token of its last write.
    ///
    /// # Errors
    /// [`BackendError`] when Redis fails.
    pub fn fenced_get(&self, key: &str) -> Result<Option<(Vec<u8>, FencingToken)>, BackendError> {
        self.on_node_of_key(key, |node| {
            node.run(|con| crate::fenced::get_request(con, key))
        })
    }

    /// A backend on `target` with `options` (built and checked by a builder).
    pub(crate) fn assemble(target: Topology, options: Options) -> RedisBackend {
        let hints = Hints::when_enabled(&options, vec![target.listener()], 1);
        let fanout = Fanout::new(target.kind());
        RedisBackend {
            inner: Arc::new(Inner {
                target,
                keys: Keys::new(options.prefix.clone(), options.fence_ttl),
                options,
                hints,
                fanout,
            }),
        }
    }

    /// Whether the release-hint listener is subscribed now (it starts with the first
    /// wait; `false` while its connection is down or when hints are off).
    pub fn release_hints_active(&self) -> bool {
        self.inner
            .hints
            .as_ref()
            .is_some_and(|h| h.listeners_up() > 0)
    }

    /// Wakes a waiter of this process for the release `id` at once (see `Hints::released`).
    fn released_here(&self, name: &LockName, id: u64) {
        if let Some(hints) = &self.inner.hints {
            hints.released(|| self.inner.keys.channel(name), id);
        }
    }

    /// Runs `f` on the node that serves the lock `name` (in a cluster, on the new master
    /// if the slot's master failed and was replaced).
    fn on_node<T>(
        &self,
        name: &LockName,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.on_slot(|| self.inner.keys.slot(name), f)
    }

    /// [`on_node`](Self::on_node) for the node that serves `key`.
    fn on_node_of_key<T>(
        &self,
        key: &str,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.on_slot(|| crate::slot::key_slot(key.as_bytes()), f)
    }

    fn on_slot<T>(
        &self,
        slot: impl Fn() -> u16,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.inner
            .target
            .on_slot(slot, self.inner.options.timeouts(), f)
    }

    /// [`on_slot`](Self::on_slot) for `f`, a release of `owner`'s `claim` hold of `name`
    /// that says whether it released (with Sentinel, journaled: see
    /// [`Topology::release_on_slot`]).
    fn release_on(
        &self,
        slot: impl Fn() -> u16,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        f: impl Fn(&Node) -> Result<bool, BackendError>,
    ) -> Result<bool, BackendError> {
        let t = self.inner.options.timeouts();
        self.inner
            .target
            .release_on_slot(slot, t, name, claim, owner, f)
    }

    fn lease(&self, start: Instant, ttl: Duration) -> Option<Lease> {
        let valid_until = start + ttl.checked_sub(self.inner.options.drift(ttl))?;
        (valid_until > Instant::now()).then(|| Lease::new(valid_until))
    }
}

impl RedisBackend {
    /// The node that serves `name` now.
    fn node_of(&self, name: &LockName) -> Result<Arc<Node>, BackendError> {
        self.inner.target.node(|| self.inner.keys.slot(name))
    }

    /// A grant made at `start` for `ttl` on `node` (with its token, if drawn): its lease,
    /// or a `Timeout` when the grant came too late to be of use (an error, which the front
    /// undoes as every failed step that may have written a hold).
    pub(super) fn granted(
        &self,
        node: &Node,
        start: Instant,
        ttl: Duration,
        token: Option<FencingToken>,
    ) -> Result<Acquire, BackendError> {
        match self.lease(start, ttl) {
            Some(lease) => Ok(Acquire::Acquired(match token {
                Some(t) => lease.with_fence(t),
                None => lease,
            })),
            None => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "{}: acquiring took {:?}, more than the lease's validity",
                    node.endpoint,
                    start.elapsed()
                ),
            )),
        }
    }

    /// One acquisition attempt on `node`; with `fenced`, the token is drawn with it (the
    /// fenced acquire script).
    fn acquire_on(
        &self,
        node: &Node,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Result<Acquire, BackendError> {
        let start = Instant::now();
        let wait = self.inner.options.replica_wait;
        let (answer, token, acked) = if fenced {
            node.acquire_fenced(name, owner, ttl, wait)?
        } else {
            let (answer, acked) = node.acquire(name, owner, ttl, wait)?;
            (answer, None, acked)
        };
        if let (NodeAcquire::Acquired, Some(w)) = (answer, wait)
            && acked.unwrap_or(0) < w.replicas
        {
            // Not on enough replicas: a failover could lose it. The front undoes it, as
            // it undoes every failed step that may have written a hold.
            return Err(node.not_replicated(w, acked, "the grant"));
        }
        match answer {
            NodeAcquire::Acquired => self.granted(node, start, ttl, token.map(FencingToken::new)),
            NodeAcquire::Held { remaining } => Ok(Acquire::Held {
                retry_after: Some(remaining),
            }),
        }
    }
}

impl LockBackend for RedisBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.on_node(name, |node| self.acquire_on(node, name, owner, ttl, false))
    }

    /// The fenced acquire script on the lock's node: `SET NX` and, where it took the lock
    /// (or found it ours), the token's draw from the slot's stream, in one step and one
    /// round trip. The draw happens while the key is held, as `fence`'s does, so the
    /// tokens are ordered the same way. With `wait_for_replicas`, `WAIT` covers the grant
    /// and the draw. A draw that fails (a foreign key at the stream's name, an ACL
    /// denial) leaves the lock taken without a token: the read draws then, and fails.
    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let fenced = self.inner.options.fencing;
        self.on_node(name, |node| self.acquire_on(node, name, owner, ttl, fenced))
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.on_node(name, |node| {
            let start = Instant::now();
            let wait = self.inner.options.replica_wait;
            let (extended, acked) = node.extend(name, owner, ttl, wait)?;
            if !extended {
                return Ok(None);
            }
            // Renewed on the master only: a failover now could bring back the previous
            // lease, which the front keeps until a renewal replicates.
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the renewal"));
            }
            Ok(self.lease(start, ttl))
        })
    }

    /// The fence script on the lock's node: if the lock is still `owner`'s, a new ID from
    /// the slot's stream (drawn after every earlier holder's, since they drew while they
    /// held the lock). With `wait_for_replicas`, a draw that too few replicas acknowledged
    /// is `NotReplicated` (a failover could give its ID again); a later call draws anew.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.options.fencing {
            return Err(fencing_off());
        }
        self.on_node(name, |node| {
            let wait = self.inner.options.replica_wait;
            let (answer, acked) = node.fence(name, owner, wait)?;
            let Some(token) = answer.stream() else {
                return Ok(None);
            };
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the fencing token's draw"));
            }
            Ok(Some(FencingToken::new(token)))
        })
    }

    /// Each node's renewals, every kind of hold together, go pipelined in one write
    /// (followed by `WAIT` when asked for), to every node at once through the fan-out: a
    /// round costs one round trip, whatever the number and the kinds of the holds and (in
    /// a cluster) the masters. Each node's renewals are reported as its reply is read, so
    /// a stopped master delays nobody else's: the round ends when every node answered or
    /// after a quarter of the shortest lease (at most the request deadline). A node that
    /// did not answer by then fails its renewals with `Timeout`; its late replies go to
    /// the drainer, and while they are outstanding the node counts as busy.
    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        self.renew_many(renewals, renewed);
    }

    /// Releases; or, when a thread of this process waits for the lock (asleep, offering
    /// to take it over), hands the lock to it in the same request: one script gives the
    /// key to the waiter's token with a lease of its own and, when it will be read, its
    /// fencing token; the waiter holds it without a request of its own (on one server or
    /// a cluster, without `wait_for_replicas`; see
    /// [`WaitList::successor`](dlm_core::backend::WaitList::successor)).
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.release_mutex(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let id = ReleaseId::Release.random();
        let released = self.on_node(name, |node| node.force_release(name, id))?;
        if released {
            self.released_here(name, id);
        }
        Ok(released)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let hints = self.inner.hints.as_ref()?;
        hints.watch(self.inner.keys.channel(name))
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.on_node(name, |node| node.inspect(name))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner
            .hints
            .as_ref()
            .is_some_and(|h| h.wake_pending(|| self.inner.keys.channel(name)))
    }

    fn kind(&self) -> &'static str {
        self.inner.target.kind()
    }

    /// Semaphores and read-write locks: one hash per resource (`prefix:{name}:sem`,
    /// `prefix:{name}:rw`) that the claim script reads and writes in one step.
    fn supports(&self, claim: Claim) -> bool {
        every_hold_kind(claim)
    }

    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        self.claim_acquire(request)
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.claim_extend(name, claim, owner, ttl)
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.claim_release(name, claim, owner)
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.claim_fence(name, claim, owner)
    }

    /// A release of a semaphore's permit or of a read-write lock's hold wakes every
    /// waiter of it (several may get in), not one.
    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.inner
            .hints
            .as_ref()?
            .watch_all(self.inner.keys.claim_channel(name, claim))
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.claim_downgrade(name, writer, reader, ttl)
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.claim_force_release(name, claim)
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.claim_relabel(name, claim, owner, label)
    }

    /// The group's channel, watched by all: its waiters are all woken by each release
    /// already, and a one-permit semaphore announces its grants and relabels there too.
    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.watch_group(name, claim)
    }

    /// With fencing on (an election's term is its token).
    fn supports_elections(&self) -> bool {
        self.inner.options.fencing
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.claim_inspect(name, claim)
    }
}

/// What `fence` says when fencing is switched off.
pub(crate) fn fencing_off() -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        "fencing is switched off (fencing(false))",
    )
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.inner.target)
            .field("prefix", &self.inner.options.prefix)
            .field("fencing", &self.inner.options.fencing)
            .finish_non_exhaustive()
    }
}
