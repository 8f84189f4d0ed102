//! The contract between the generic front and a backend: what a store implements
//! ([`LockBackend`]) and the types it exchanges with the front.
//!
//! Users of a lock need none of this beyond what the crate root re-exports
//! ([`LockName`], [`FencingToken`], [`BackendError`], [`BackendErrorKind`]); a backend
//! needs only this module: `use dlm_core::backend::{...}`.
//!
//! ## `crossbeam-channel` is part of this contract
//! A [`Watch`] carries a [`channel::Receiver`]: the front waits on it together with an
//! interrupt and a timer in one `select!`, and a backend with a hint source of its own
//! (not a [`WaitList`]) hands the receiving end of such a channel to [`Watch::new`]. The
//! crate is re-exported as [`channel`] so that a backend uses the same version as
//! dlm-core; a release of dlm-core that moves to an incompatible `crossbeam-channel` is
//! an incompatible release of dlm-core. Nothing outside this module exposes it.

mod claim;
mod holders;
mod lease;
mod name;
mod owner;
mod waiters;
mod watch;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crossbeam_channel as channel;

pub use crate::error::{BackendError, BackendErrorKind};
pub use claim::{Claim, GroupRequest, WRITER_MARK, every_hold_kind, writer_mark};
pub use holders::{Holder, Holders};
pub use lease::{FencingToken, Lease};
pub(crate) use name::check_label;
pub use name::{LockName, MAX_LABEL_LEN, MAX_NAME_LEN};
pub(crate) use owner::random_client_id;
pub use owner::{EncodedOwnerToken, OwnerToken};
pub use waiters::{Handover, MAX_HANDOVERS_IN_A_ROW, Successor, WaitList};
pub use watch::{Unsubscribe, Watch};

/// The outcome of one acquisition attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The lock is ours.
    Acquired(Lease),
    /// Someone else holds it.
    Held {
        /// The holder's remaining lease, when known: the lock cannot become free by
        /// expiry before then, so a waiter need not look again sooner (unless woken).
        retry_after: Option<Duration>,
    },
}

/// One hold to renew, for [`LockBackend::extend_many`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Renewal<'a> {
    /// The lock's name.
    pub name: &'a LockName,
    /// The kind of hold: [`Claim::Exclusive`] for the mutex's (renewed as
    /// [`extend`](LockBackend::extend) would), another claim for a semaphore's or
    /// read-write lock's (as [`extend_group`](LockBackend::extend_group) would).
    pub claim: Claim,
    /// The holder's token.
    pub owner: &'a OwnerToken,
    /// The lease to set from now.
    pub ttl: Duration,
}

impl<'a> Renewal<'a> {
    /// A renewal of `owner`'s hold of kind `claim` of `name`, for `ttl`.
    pub fn new(name: &'a LockName, claim: Claim, owner: &'a OwnerToken, ttl: Duration) -> Self {
        Renewal {
            name,
            claim,
            owner,
            ttl,
        }
    }
}

/// Where [`LockBackend::extend_many`] reports each renewal's outcome: called once per
/// renewal, with its index in the round and what [`extend`](LockBackend::extend) (or
/// [`extend_group`](LockBackend::extend_group)) would have returned.
pub type Renewed<'a> = dyn FnMut(usize, Result<Option<Lease>, BackendError>) + 'a;

/// A lock store: one bounded attempt per call, never sleeping, never retrying.
///
/// The generic front ([`LockClient`](crate::LockClient)) implements waiting, deadlines,
/// interrupts, re-entrancy and guards once, on top of these calls. Implement this trait to
/// plug in a new store:
///
/// 1. Keep per name: the owner token of the holder and its expiry. If you issue fencing
///    tokens (with the lease, or on demand in [`fence`](LockBackend::fence)), every
///    holder of a name must get a larger token than every earlier holder of it, even
///    after your store loses state (dlm-memory: one counter per store; dlm-redis: stream
///    IDs, which restart from the server's clock).
/// 2. [`try_acquire`](LockBackend::try_acquire) takes the name if it is free (or already
///    held by the same token, which refreshes the lease), with an expiry: no acquire path
///    may leave a name held without one.
/// 3. [`extend`](LockBackend::extend) and [`release`](LockBackend::release) act only when
///    the token still holds the name, and never re-create a missing entry.
/// 4. Return within your I/O deadline; map failures to [`BackendError`] kinds so the front
///    knows what to retry.
/// 5. A call that fails may still have been applied (its reply was lost): return the
///    error and leave the rest to the front, which undoes what the call may have written
///    (it releases the attempt's owner token, again in the background while that fails)
///    and retries with a new token. Never send a request again as if it had not been
///    applied when it may have been: the second answer ("not yours", "already held")
///    would be about the first.
/// 6. Run the conformance suite of `dlm-testkit` against it.
///
/// For a walk-through, see the `dlm-testkit` crate's `guide` module: the contract in
/// detail, a complete backend (a map behind a mutex) and the conformance suite run
/// against it.
///
/// Contention is not an error: it is [`Acquire::Held`]. Calling a backend directly (the
/// front does this; users rarely need to):
///
/// ```
/// use std::time::Duration;
/// use dlm_core::backend::{Acquire, LockBackend, LockName, OwnerToken};
/// use dlm_memory::MemoryBackend;
///
/// let backend = MemoryBackend::new();
/// let name = LockName::new("report")?;
/// let (me, other) = (OwnerToken::random_for_tests(1), OwnerToken::random_for_tests(2));
/// let ttl = Duration::from_secs(10);
/// let Acquire::Acquired(lease) = backend.try_acquire(&name, &me, ttl)? else {
///     panic!("a free lock");
/// };
/// assert!(lease.fence().is_some());            // dlm-memory hands tokens out at once
/// assert_eq!(backend.fence(&name, &me)?, lease.fence());
/// assert_eq!(backend.fence(&name, &other)?, None); // not its lock: no token
/// assert!(matches!(
///     backend.try_acquire(&name, &other, ttl)?,
///     Acquire::Held { retry_after: Some(_) }   // when the holder's lease ends, at most
/// ));
/// assert!(!backend.release(&name, &other)?);   // not its lock
/// assert!(backend.release(&name, &me)?);
/// assert_eq!(backend.inspect(&name)?, None);    // free
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// One bounded attempt to take `name` for `owner` for `ttl`.
    ///
    /// Idempotent for the same owner: if `owner` already holds `name`, the lease is
    /// refreshed to `ttl` and `Acquired` is returned again (a retry after a lost reply must
    /// never block its own sender). The returned lease's `valid_until` is already reduced by
    /// the time the call took and by the backend's drift allowance.
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError>;

    /// [`try_acquire`](LockBackend::try_acquire) for a hold whose fencing token will
    /// probably be read: one bounded attempt that takes `name` and, in the same atomic
    /// step on each node, draws its token, handed out with the [`Lease`]
    /// ([`Lease::with_fence`]). The front calls it instead of `try_acquire` when the last
    /// hold of this lock (by this client) read its token, so that a holder who reads every
    /// token pays no request for it beyond the acquisition; a token drawn here and never
    /// read costs the store the draw, nothing else.
    ///
    /// The token must be ordered as one drawn by [`fence`](LockBackend::fence): drawn only
    /// where the key was set (or found `owner`'s), in the step that set it. A draw that
    /// fails after the lock was taken must not fail the acquisition: return the lease
    /// without a token, and the front draws with `fence` when the token is read (where the
    /// failure then shows). Same idempotence as `try_acquire`.
    ///
    /// The default calls `try_acquire` (the front then draws with `fence` when the token
    /// is read): right for a backend that hands tokens out with every lease, or issues
    /// none. The conformance suite expects a backend that issues tokens to hand one out
    /// here.
    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.try_acquire(name, owner, ttl)
    }

    /// Resets the expiry of `name` to `ttl` if `owner` still holds it. `Ok(None)`: it is
    /// no longer ours. Never re-creates a missing entry. The returned lease keeps the
    /// fencing token of the acquisition.
    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError>;

    /// Renews several holds at once: the watchdog's renewal round. The round holds every
    /// due hold of the client, whatever its kind: the mutex's and the groups' alike
    /// ([`Renewal::claim`]). Each renewal's outcome goes to `renewed`, once, with its index:
    /// what [`extend`](LockBackend::extend) or [`extend_group`](LockBackend::extend_group)
    /// would return for it.
    ///
    /// **Report each outcome as soon as its request has come back.** The front judges a
    /// renewal by the moment it is reported: a renewal reported after the hold's previous
    /// lease ended is not applied (the hold is lost, and its token released in the
    /// background), and the new lease runs from when the request was sent (the lease's
    /// `valid_until`, as for `extend`). So a backend that reports a whole round at its end
    /// makes its first renewals look as late as its last. Do not hold a lock of your own
    /// while calling `renewed`: the front takes the hold's state lock in it.
    ///
    /// The default calls `extend` (or `extend_group`) for each in turn and reports each as
    /// it returns. A backend that talks to servers should batch them (one request or
    /// pipeline per server, whatever the number and the kinds of the holds), so that a
    /// client holding many locks does not lose them to one slow server: the renewals of one
    /// round must all be done well within a third of the lease.
    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        for (i, r) in renewals.iter().enumerate() {
            let outcome = match r.claim {
                Claim::Exclusive => self.extend(r.name, r.owner, r.ttl),
                claim => self.extend_group(r.name, claim, r.owner, r.ttl),
            };
            renewed(i, outcome);
        }
    }

    /// Draws the fencing token of `owner`'s hold of `name`: one bounded, atomic step that
    /// checks that `owner` still holds `name` and, if so, issues a token larger than every
    /// token issued for `name` to earlier holders. `Ok(None)`: it is not ours any more (a
    /// holder that lost its lock never gets a token afterwards).
    ///
    /// The front calls it on the first [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)
    /// of a hold whose [`Lease`] carried no token, and keeps the answer for the rest of
    /// the hold: a backend for which a token costs nothing may hand it out with every
    /// acquisition ([`Lease::with_fence`]) instead, and one that must write to draw it
    /// (dlm-redis) does so only here or in
    /// [`try_acquire_fenced`](LockBackend::try_acquire_fenced), so an acquisition whose
    /// token is never read costs what an unfenced one does. Calling it twice for one hold may give two tokens; both
    /// are ordered after every earlier holder's.
    ///
    /// The default says that this backend issues no tokens
    /// ([`BackendErrorKind::Unsupported`]).
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let _ = (name, owner);
        Err(BackendError::new(
            BackendErrorKind::Unsupported,
            "this backend issues no fencing tokens",
        ))
    }

    /// Releases `name` if `owner` holds it. `Ok(false)`: it was not ours (any more).
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError>;

    /// Releases `name` whoever holds it (administration). `Ok(false)`: it was free.
    fn force_release(&self, name: &LockName) -> Result<bool, BackendError>;

    /// The remaining lease of whoever holds `name`, or `None` if it is free.
    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError>;

    /// Optional and cheap (no I/O on the caller's thread beyond registering): a
    /// subscription that receives a hint when `name` was probably released. The front
    /// subscribes after its first attempt finds the lock held, then attempts once more
    /// (a release in between is seen by that attempt, a later one by the subscription),
    /// and still bounds every wait by the holder's remaining lease, so a lost hint
    /// costs a bounded delay, never a hang. The default returns `None` (the front
    /// polls).
    fn watch(&self, name: &LockName) -> Option<Watch> {
        let _ = name;
        None
    }

    /// Optional and cheap (no I/O): whether a release hint for `name` has been delivered
    /// to a waiter of this process that has not woken up to use it yet. The front then
    /// lets that waiter try first instead of racing it: a thread that releases and at
    /// once asks again does not barge past the hand-over it just started, so local
    /// waiters are served in turn. The default (`false`) never holds anyone back.
    fn wake_pending(&self, name: &LockName) -> bool {
        let _ = name;
        false
    }

    /// The clock this backend's leases are measured on: the front compares every
    /// [`Lease::valid_until`] it got from this backend with it (whether a guard
    /// [`is_held`](crate::LockGuard::is_held), a re-entry, the watchdog's verdict on a
    /// failed renewal). The default is [`Instant::now`]; override it only for a test
    /// double with a virtual clock (`dlm_memory::ManualClock`), so that its guards see
    /// the leases its store sees. It must never go back. Timeouts of waits are real time
    /// whatever this returns.
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// Whether this backend can keep a lock called `name`, checked when a handle is made
    /// ([`LockClient::get_lock`](crate::LockClient::get_lock) and the other `get_`
    /// calls), before any I/O: a store with rules of its own for names (a file name may
    /// not contain `/`) refuses a name it cannot keep with a clear error there, instead
    /// of failing at the first attempt. The default accepts every [`LockName`].
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::InvalidArgument) naming the rule the name breaks.
    fn check_name(&self, name: &LockName) -> Result<(), crate::InvalidArgument> {
        let _ = name;
        Ok(())
    }

    /// Checks a kind of hold the backend [`supports`](LockBackend::supports) against its
    /// own limits (the largest permit count it keeps, say) when a handle is made, before
    /// any I/O. A wrapper forwards it. The default accepts every claim.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::InvalidArgument) naming the limit.
    fn check_claim(&self, claim: Claim) -> Result<(), crate::InvalidArgument> {
        let _ = claim;
        Ok(())
    }

    /// A short, fixed name for this kind of backend (`"memory"`, `"redis"`, `"redlock"`,
    /// ...): the `backend` label of dlm's metrics ([`crate::metric_names`]). Return one of
    /// a few constant values, never a server address or a lock name: each value is a time
    /// series of its own. A wrapper returns the kind of the backend it wraps. The default
    /// is `"custom"`.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Whether this backend keeps holds of `claim`'s kind: a semaphore
    /// ([`Claim::Permit`]) or a read-write lock ([`Claim::Read`], [`Claim::Write`]). The
    /// front asks once, when a handle is made, and refuses one the backend cannot serve
    /// with [`BackendErrorKind::Unsupported`] (no I/O). The default: the mutex only.
    ///
    /// A backend that answers `true` implements the `_group` calls below: the holds of a
    /// *group resource* (a semaphore or a read-write lock of a name, held by a group of
    /// holders; separate from the name's mutex). The front calls them only with those
    /// claims, never with [`Claim::Exclusive`] (the mutex has its own calls). Their rules
    /// are the mutex's (idempotent acquisition for the same owner, an expiry on every
    /// entry, extensions and releases only by the holder, fencing tokens ordered across
    /// holders) plus the claim's: at most `permits` holders of a semaphore, never a reader
    /// beside a writer, no new reader while a writer waits. dlm-memory's `group.rs` is the
    /// reference; the conformance suite checks them. A backend that keeps every kind
    /// answers with [`every_hold_kind`].
    fn supports(&self, claim: Claim) -> bool {
        claim == Claim::Exclusive
    }

    /// [`try_acquire`](LockBackend::try_acquire) of a group hold: `request.owner`'s hold of
    /// kind `request.claim` of `request.name` for `request.ttl`, drawing its token with it
    /// when `request.fenced` (as [`try_acquire_fenced`](LockBackend::try_acquire_fenced)),
    /// and keeping `request.label` with it for [`inspect_group`](LockBackend::inspect_group).
    /// [`Acquire::Held`] when the claim's rule refuses it now.
    ///
    /// A [`Claim::Write`] attempt refused because others hold the lock marks it as awaited
    /// by a writer for [`writer_mark`]`(ttl)`, which refuses new readers meanwhile, and
    /// answers a `retry_after` of at most a third of the mark (the writer then renews the
    /// mark while it waits); a granted write clears the mark. A [`Claim::Permit`] attempt
    /// whose `permits` differs from the count the semaphore's current holders hold it with
    /// fails with [`BackendErrorKind::Conflict`]. The default refuses
    /// ([`BackendErrorKind::Unsupported`]).
    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        Err(unsupported(request.claim))
    }

    /// [`extend`](LockBackend::extend) of a group hold. The default refuses.
    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let _ = (name, owner, ttl);
        Err(unsupported(claim))
    }

    /// [`release`](LockBackend::release) of a group hold; wakes the resource's waiters
    /// (all of them: several may get in). The default refuses.
    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let _ = (name, owner);
        Err(unsupported(claim))
    }

    /// [`fence`](LockBackend::fence) of a group hold: a token larger than every token
    /// issued to earlier permit holders (semaphore) or write holders (read-write lock) of
    /// `name`; for a read hold, one larger than every earlier write hold's, so that a
    /// store that accepts only increasing tokens refuses a writer that came before the
    /// reader. The default refuses.
    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let _ = (name, owner);
        Err(unsupported(claim))
    }

    /// [`watch`](LockBackend::watch) for a waiter of a group hold: hints when a holder of
    /// the resource releases. `None` (the default): waiters poll.
    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let _ = (name, claim);
        None
    }

    /// Sets the label of `owner`'s live hold of kind `claim` on `name` to `label` (an
    /// election leader's new value: [`Leadership::proclaim`](crate::Leadership::proclaim)),
    /// keeping its lease and token, and tells the resource's observers
    /// ([`observe_group`](LockBackend::observe_group)). `Ok(false)`: `owner` holds nothing
    /// there. The default: unsupported.
    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        let _ = (name, owner, label);
        Err(unsupported(claim))
    }

    /// A subscription for an observer of the holders of kind `claim` on `name` (an
    /// election's [`Observer`](crate::Observer)): a hint at every change the store makes
    /// to them (a grant, a release, a relabel, a forced release). Unlike
    /// [`watch_group`](LockBackend::watch_group)'s, its hints are everyone's: an observer
    /// never takes a wake-up meant for a waiter. `None` (the default): observers look
    /// again when the current holder's lease would end.
    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let _ = (name, claim);
        None
    }

    /// Whether the backend keeps elections ([`LockClient::get_election`](crate::LockClient::get_election)):
    /// semaphore permits, [`relabel_group`](LockBackend::relabel_group),
    /// [`observe_group`](LockBackend::observe_group), and tokens in
    /// [`inspect_group`](LockBackend::inspect_group)'s holders. The default: `false`.
    fn supports_elections(&self) -> bool {
        false
    }

    /// Turns `writer`'s write hold of the read-write lock `name` into a read hold of
    /// `reader` for `ttl`, in one atomic step: no other writer can get in between.
    /// `Ok(None)`: `writer` no longer holds it. The read hold keeps the write hold's
    /// fencing token, if it had one, and its label. Like an acquisition, a downgrade that
    /// fails may have been applied: the front then releases `reader`'s read hold (and the
    /// write hold). The default refuses.
    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let _ = (name, writer, reader, ttl);
        Err(unsupported(Claim::Write))
    }

    /// [`force_release`](LockBackend::force_release) of a group resource: ends every hold
    /// of it (every permit; every read and write hold, and a writer's mark) and wakes its
    /// waiters. Whether anything was held. The default refuses.
    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        let _ = name;
        Err(unsupported(claim))
    }

    /// Who holds the group resource `name` now: each live holder (its kind, its remaining
    /// lease, its label) and, for a semaphore with a permit held, the permit count its
    /// holders hold it with. A free resource has no holders. The default refuses.
    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        let _ = name;
        Err(unsupported(claim))
    }
}

/// The error of a backend asked for a primitive it does not keep.
fn unsupported(claim: Claim) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        format!(
            "this backend keeps no {} holds ({claim})",
            claim.primitive()
        ),
    )
}

/// What a [`LockClient`](crate::LockClient) runs on: any [`LockBackend`] by value (it is
/// put behind an [`Arc`]), or an `Arc` of one, to share one backend (and its
/// connections) between clients. Implemented for those; not meant to be implemented
/// elsewhere.
///
/// ```
/// use std::sync::Arc;
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// // By value: the client owns the backend.
/// let alone = LockClient::new(MemoryBackend::new());
/// // Shared: two clients (two owners) over one store.
/// let shared = Arc::new(MemoryBackend::new());
/// let a = LockClient::new(shared.clone());
/// let b = LockClient::builder(shared).reentrant(false).build()?;
/// # let _ = (alone, a, b);
/// # Ok::<(), dlm_core::Error>(())
/// ```
pub trait IntoBackend: sealed::Sealed {
    /// The backend, shared.
    fn into_backend(self) -> Arc<dyn LockBackend>;
}

mod sealed {
    pub trait Sealed {}
}

impl<B: LockBackend> sealed::Sealed for B {}
impl<B: LockBackend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        Arc::new(self)
    }
}

impl<B: LockBackend> sealed::Sealed for Arc<B> {}
impl<B: LockBackend> IntoBackend for Arc<B> {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        self
    }
}

impl sealed::Sealed for Arc<dyn LockBackend> {}
impl IntoBackend for Arc<dyn LockBackend> {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        self
    }
}
