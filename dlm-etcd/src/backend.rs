//! `EtcdBackend`: the lock operations as etcd transactions, each call handed to the
//! operation of its module (`acquire`, `claims`, `renew`).

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::{
    Acquire, BackendError, Claim, FencingToken, GroupRequest, Holders, Lease, LockBackend,
    LockName, OwnerToken, Renewal, Renewed, Watch, every_hold_kind,
};

use crate::acquire;
use crate::claims;
use crate::gateway::{b64, revision};
use crate::hints::Hints;
use crate::hints::LAST_HELD_REVISION;
use crate::inner::Inner;
use crate::renew;
use crate::resource::Resource;

/// A lock backend on an etcd cluster (or a single member), over etcd's v3 HTTP/JSON
/// gateway.
///
/// - **Keys.** A lock called `n` is the key `dlm/lock/n` (the prefix is configurable);
///   its value is the owner token and the holder's lease in milliseconds
///   (`token|ms`), attached to an etcd lease. Nothing else is written.
/// - **Acquisition** is one transaction: put the key with the lease if it does not exist
///   (`create_revision == 0`), else read it.
/// - **Fencing token:** the key's `create_revision`, a cluster-wide revision that only
///   grows, kept in the Raft log: it survives restarts of every member, leader changes
///   and the loss of any minority.
/// - **Leases.** etcd leases have whole-second TTLs. A lock with a lease of `d` is put on
///   an etcd lease of `ceil(d) + 1` seconds that this backend shares among the locks it
///   takes with leases of the same whole-second class, reused for as long as it outlives
///   the new lock's lease. A renewal keeps an etcd lease alive only when every key on
///   it is renewed in that round (one keep-alive for all such leases); other renewed
///   keys move to the current lease of their class, so a lock nobody renews (a fixed
///   lease, a leaked guard past `max_hold`) ends with its own etcd lease whatever the
///   other locks do. So the server may keep a lock whose holder is gone up to about 2 s
///   longer than asked (the rounding, plus etcd's own expiry check every 0.5 s), **plus up
///   to one etcd lease (`ceil(lease) + 1` s) per leader election**: a new leader gives
///   every etcd lease its full TTL again (etcd-io/etcd#9395, intended there; a 4 s lock
///   whose holder went away, the leader killed 3 s in, was free after 9.5 s in
///   `tests/cluster_faults.rs`). The holder's validity is the lease asked for, never more.
/// - **Release** deletes the key only if its value is still the owner's (compared in the
///   transaction). Waiters are woken by one streaming `/v3/watch` per backend.
/// - **Semaphores and read-write locks** ([`LockClient::get_semaphore`],
///   [`LockClient::get_rw_lock`]): one key per holder under the resource's own prefix
///   (`dlm/lock/n`, a 0 byte, `sem` or `rw`, a 0 byte), each on an etcd lease; admission
///   is one transaction whose compares cover that prefix (a semaphore that already has
///   holders: two, the second comparing that nothing changed since the first read); the
///   fencing token is the holder key's `create_revision`.
///
/// [`LockClient::get_semaphore`]: dlm_core::LockClient::get_semaphore
/// [`LockClient::get_rw_lock`]: dlm_core::LockClient::get_rw_lock
///
/// Build it with [`EtcdBackend::new`] or [`EtcdBackend::builder`].
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

impl EtcdBackend {
    /// The key that holds lock `name` (for operators and tests).
    pub fn key(&self, name: &LockName) -> Vec<u8> {
        self.inner.key(name)
    }

    /// The member URLs, as given.
    pub fn members(&self) -> &[String] {
        self.inner.gateway.members()
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("members", &self.inner.gateway.members())
            .field("prefix", &String::from_utf8_lossy(&self.inner.key_prefix))
            .finish_non_exhaustive()
    }
}

impl LockBackend for EtcdBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        acquire::try_acquire(&self.inner, name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        renew::extend(&self.inner, name, owner, ttl)
    }

    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        renew::extend_many(&self.inner, renewals, renewed)
    }

    /// The token was handed out with the acquisition (the key's `create_revision`); asked
    /// again, it is read back: `None` once the key is not `owner`'s.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        acquire::fence(&self.inner, name, owner)
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        acquire::release(&self.inner, name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        acquire::force_release(&self.inner, name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        acquire::inspect(&self.inner, name)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.subscribe(name.as_str().as_bytes())
    }

    fn supports(&self, claim: Claim) -> bool {
        every_hold_kind(claim)
    }

    /// One transaction when the resource allows the hold as it is (an empty semaphore, a
    /// read-write lock without writer and mark for a read, without holders for a write);
    /// else the transaction returns the resource, and a semaphore with a permit left is
    /// taken by a second one that compares that nothing under it changed since. The token
    /// (with every lease) is the holder key's `create_revision`.
    /// Every lease carries its token (`request.fenced` changes nothing).
    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        claims::try_acquire(&self.inner, request)
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        claims::extend(&self.inner, name, claim, owner, ttl)
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        claims::release(&self.inner, name, claim, owner)
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        claims::fence(&self.inner, name, claim, owner)
    }

    /// Every waiter of the resource is woken by a deletion under it (a release, a
    /// downgrade, a lease's end, the writer's mark ending): several may get in.
    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let res = Resource::of(&self.inner, name, claim).ok()?;
        self.subscribe(&res.id)
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        claims::relabel(&self.inner, name, claim, owner, label)
    }

    /// A watch of its own on the resource's keys, puts included (the shared watch carries
    /// deletions only), from the revision read now: nothing after this call is missed.
    /// It ends when the observer drops its subscription.
    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let res = Resource::of(&self.inner, name, claim).ok()?;
        let (start, end) = res.all();
        let reply = self
            .inner
            .gateway
            .post_read(
                "/v3/kv/range",
                &serde_json::json!({ "key": b64(&start), "range_end": b64(&end), "count_only": true }),
            )
            .ok()?;
        let from = revision(&reply).ok()? + 1;
        let hints = Hints::observe(
            &self.inner.gateway,
            &self.inner.key_prefix,
            (start, end),
            from,
        );
        let inner_watch = hints.subscribe_to(&res.id)?;
        let receiver = inner_watch.receiver().clone();
        Some(Watch::with_unsubscribe(
            receiver,
            Box::new(ObserverWatch {
                _watch: inner_watch,
                hints: Some(hints),
            }),
        ))
    }

    fn supports_elections(&self) -> bool {
        true
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        claims::downgrade(&self.inner, name, writer, reader, ttl)
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        claims::force_release(&self.inner, name, claim)
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        claims::inspect(&self.inner, name, claim)
    }

    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner
            .hints
            .lock()
            .as_ref()
            .is_some_and(|h| h.wake_pending(name))
    }
}

impl EtcdBackend {
    /// A subscription to the hints of `resource` (a lock's name or a resource id),
    /// starting the backend's watch if it is not running.
    fn subscribe(&self, resource: &[u8]) -> Option<Watch> {
        let mut hints = self.inner.hints.lock();
        let h = hints.get_or_insert_with(|| {
            let start = LAST_HELD_REVISION.with(Cell::get);
            let from = if start > 0 { start + 1 } else { 0 };
            Hints::start(&self.inner.gateway, &self.inner.key_prefix, from)
        });
        h.subscribe_to(resource)
    }
}

/// An observer's own watch stream, stopped when its subscription is dropped.
struct ObserverWatch {
    _watch: Watch,
    hints: Option<Hints>,
}

impl dlm_core::backend::Unsubscribe for ObserverWatch {
    fn unsubscribe(mut self: Box<Self>, _pending_wake: bool) {
        if let Some(h) = self.hints.take() {
            h.stop();
        }
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        if let Some(h) = self.inner.hints.lock().take() {
            h.stop();
        }
    }
}
