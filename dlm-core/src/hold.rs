//! The hold state of one lock of one client (what this process knows about its own hold
//! of it: [`LockShared`], [`Holding`]), and the backend calls of a hold, each choosing
//! between the mutex's call and the groups' in one place.
//!
//! No state mutex is held across a backend call: an extension, a renewal or a release
//! takes what it needs under the mutex, lets go, makes the request, and applies the
//! answer only if the hold is still the same acquisition (its generation).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{
    Acquire, BackendError, Claim, FencingToken, GroupRequest, Lease, LockName, OwnerToken, Watch,
};
use crate::error::{Error, Result};
use crate::observe::Metrics;
use crate::predictions::PredictionSlot;
use crate::settings::{ClientShared, thread_no};
use crate::signal::Signal;
use crate::token_draw::TokenDraw;
use crate::watchdog::{Renewable, RenewedHold, Started, Ticket};

/// What one [`LockShared`] keeps the holds of: a name as a resource of one kind (the
/// mutex, a semaphore with a permit count, a read-write lock's reads or writes) and, for
/// the kinds that several threads of a process hold at once (permits, reads), the thread.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct HoldKey {
    pub(crate) name: LockName,
    pub(crate) claim: Claim,
    /// The holding thread, for shared kinds; `None` for exclusive ones.
    pub(crate) thread: Option<u64>,
}

impl HoldKey {
    /// The key of `claim` on `name` for the calling thread.
    pub(crate) fn new(name: LockName, claim: Claim) -> Self {
        let thread = match claim {
            Claim::Permit { .. } | Claim::Read => Some(thread_no()),
            _ => None,
        };
        HoldKey {
            name,
            claim,
            thread,
        }
    }
}

/// Where a hold state is registered: told when the state goes (its last handle or guard
/// is dropped). The client's registry, above this module: the trait keeps the imports
/// one way.
pub(crate) trait Forget: Send + Sync {
    /// `lock`, kept under `key`, is gone.
    fn forget(&self, key: &HoldKey, lock: *const LockShared);
}

/// What [`LockShared::end_hold`] hands to the release at the backend.
pub(crate) struct Ended {
    pub(crate) token: OwnerToken,
    /// The end of its lease (the backend's clock): the release is sent again until then.
    pub(crate) until: Instant,
    /// The hold's lost signal, if one was made: to be ended with the verdict.
    pub(crate) signal: Option<Signal>,
    pub(crate) was_valid: bool,
    /// Its loss was already counted.
    pub(crate) counted_lost: bool,
}

/// The hold state of one lock name of one client, shared by all its handles and guards.
pub(crate) struct LockShared {
    pub(crate) client: Arc<ClientShared>,
    /// Where this state is registered (told when it goes).
    registry: Weak<dyn Forget>,
    pub(crate) name: LockName,
    /// The kind of hold kept here: every backend call of these holds says it.
    pub(crate) claim: Claim,
    /// The thread whose holds these are, for kinds held by several threads at once.
    key_thread: Option<u64>,
    pub(crate) state: Mutex<State>,
    pub(crate) metrics: Arc<Metrics>,
    /// Its place in the client's predictions of token reads.
    prediction: PredictionSlot,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) holding: Option<Holding>,
    pub(crate) next_generation: u64,
    /// The last hold ended by its owner ([`LockShared::end_hold`]: a release, or a
    /// downgrade that turned it into a read hold), whose own request takes care of the
    /// store; holds dropped otherwise (found expired) have nobody's request behind them.
    pub(crate) ended_by_owner: u64,
}

/// What this process knows about its own hold of a lock.
pub(crate) struct Holding {
    /// The thread that acquired it.
    pub(crate) thread: u64,
    /// Re-entrant holds outstanding.
    pub(crate) count: u32,
    /// Identifies this acquisition: guards of an earlier one are stale.
    pub(crate) generation: u64,
    pub(crate) token: OwnerToken,
    pub(crate) lease: Lease,
    /// The hold's fencing token: the one its lease carried, or the one the first
    /// `LockGuard::fencing_token` drew. Every guard of the hold (re-entries too) reads
    /// this one.
    pub(crate) fence: Option<FencingToken>,
    /// When it was acquired, if metrics measure durations (for the hold time).
    pub(crate) since: Option<Instant>,
    /// The acquisition asked for the token to be drawn with it (`try_acquire_fenced`).
    pub(crate) drew_at_acquisition: bool,
    /// `LockGuard::fencing_token` gave the token out: the next acquisition of this lock
    /// draws it with the acquisition (see `TokenDraw::Predicted`).
    pub(crate) read: bool,
    /// Renewals (watchdog and extensions) recorded in `lease`.
    pub(crate) renewals: u64,
    /// A renewal or extension found the lock gone.
    pub(crate) lost: bool,
    /// Its place in the watchdog's schedule (watchdog-renewed holds only): dropped with
    /// the hold, which ends the renewals.
    pub(crate) _renewal: Option<Ticket>,
    /// The lost-lock signal, made on the first `LockGuard::lost_signal`: ended with a
    /// verdict (lost or released) when the hold ends. Most holds never ask, and pay
    /// nothing for it.
    pub(crate) signal: Option<Signal>,
}

impl Holding {
    pub(crate) fn is_valid(&self, now: Instant) -> bool {
        !self.lost && now < self.lease.valid_until()
    }

    /// Records that the lock is gone and signals it to whoever watches a
    /// [`LostSignal`](crate::LostSignal) of this hold.
    pub(crate) fn mark_lost(&mut self) {
        self.lost = true;
        if let Some(signal) = self.signal.take() {
            signal.end(true);
        }
    }

    /// What a renewal (or extension) of this hold sends.
    pub(crate) fn start_renewal(&self) -> Started {
        Started {
            token: self.token,
            renewals: self.renewals,
        }
    }

    /// Records the lease a renewal got. No mutex is held across the requests, so two
    /// renewals (the watchdog's and an `extend`, or two `extend`s) can be under way at
    /// once and reach the backend in either order. If another renewal was recorded since
    /// this one was sent, the two overlapped and the backend keeps whichever arrived last:
    /// the hold then keeps the earlier of the two ends, never a lease longer than the
    /// backend's. The fencing token stays that of the hold (`fence`).
    ///
    /// A renewal that comes back after the hold's lease ran out here (`now`) is not
    /// applied: the hold is lost (and signalled so), whatever the backend answered. Its
    /// holder may already have been told (`is_held`, a lost signal) and stopped; a hold
    /// must not come back to life. Returns whether the renewal was applied.
    pub(crate) fn renewed(&mut self, started: Started, lease: Lease, now: Instant) -> bool {
        if now >= self.lease.valid_until() {
            self.mark_lost();
            return false;
        }
        let until = if started.renewals == self.renewals {
            lease.valid_until()
        } else {
            lease.valid_until().min(self.lease.valid_until())
        };
        self.lease = Lease::new(until);
        self.renewals += 1;
        true
    }
}

impl RenewedHold for Holding {
    fn lease(&self) -> Lease {
        self.lease
    }

    fn renewed(&mut self, started: Started, lease: Lease, now: Instant) -> bool {
        Holding::renewed(self, started, lease, now)
    }

    fn mark_lost(&mut self) {
        Holding::mark_lost(self);
    }
}

impl LockShared {
    pub(crate) fn new(
        client: Arc<ClientShared>,
        registry: Weak<dyn Forget>,
        key: HoldKey,
        metrics: Arc<Metrics>,
        prediction: PredictionSlot,
    ) -> Self {
        LockShared {
            client,
            registry,
            name: key.name,
            claim: key.claim,
            key_thread: key.thread,
            state: Mutex::new(State::default()),
            metrics,
            prediction,
        }
    }

    /// Whether the next acquisition draws the fencing token with it (see [`TokenDraw`]).
    pub(crate) fn draw_at_acquisition(&self) -> bool {
        match self.client.token_draw {
            TokenDraw::Predicted => self.client.predictions.read_last_time(self.prediction),
            TokenDraw::AtAcquisition => true,
            TokenDraw::WhenRead => false,
        }
    }

    /// One acquisition attempt for `owner`, drawing the token with it when `fenced`, its
    /// group hold labelled `label` if given (else with the client's label).
    pub(crate) fn try_acquire(
        &self,
        owner: &OwnerToken,
        ttl: Duration,
        fenced: bool,
        label: Option<&str>,
    ) -> std::result::Result<Acquire, BackendError> {
        let backend = &self.client.backend;
        match self.claim {
            // The mutex's own calls: its hot path stays one virtual call.
            Claim::Exclusive if fenced => backend.try_acquire_fenced(&self.name, owner, ttl),
            Claim::Exclusive => backend.try_acquire(&self.name, owner, ttl),
            claim => backend.try_acquire_group(
                &GroupRequest::new(&self.name, claim, owner, ttl)
                    .fenced(fenced)
                    .label(label.or(self.client.label.as_deref())),
            ),
        }
    }

    /// Releases `owner`'s hold at the backend; if that fails transiently while its lease
    /// (ending at `until`, the backend's clock) lasts, again in the background. The first
    /// answer.
    pub(crate) fn release_at_backend(
        &self,
        owner: &OwnerToken,
        until: Instant,
    ) -> std::result::Result<bool, BackendError> {
        self.client
            .releaser
            .release(&self.name, self.claim, owner, until, &self.metrics)
    }

    /// Undoes a step that failed but may have written `owner`'s hold (an acquisition, a
    /// downgrade): releases it, again in the background while that fails transiently and
    /// the hold it may have written lasts (until `until`, the backend's clock).
    pub(crate) fn undo(&self, owner: &OwnerToken, until: Instant) {
        if let Err(e) = self.release_at_backend(owner, until) {
            log::debug!(
                "{} {:?}: undoing a step that may have written a hold failed: {e}",
                self.claim.primitive(),
                self.name
            );
        }
    }

    /// Extends `owner`'s hold at the backend.
    pub(crate) fn extend_at_backend(
        &self,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> std::result::Result<Option<Lease>, BackendError> {
        match self.claim {
            Claim::Exclusive => self.client.backend.extend(&self.name, owner, ttl),
            claim => self
                .client
                .backend
                .extend_group(&self.name, claim, owner, ttl),
        }
    }

    /// Draws `owner`'s fencing token at the backend.
    pub(crate) fn fence_at_backend(
        &self,
        owner: &OwnerToken,
    ) -> std::result::Result<Option<FencingToken>, BackendError> {
        match self.claim {
            Claim::Exclusive => self.client.backend.fence(&self.name, owner),
            claim => self.client.backend.fence_group(&self.name, claim, owner),
        }
    }

    /// Release hints for a waiter of these holds.
    pub(crate) fn watch(&self) -> Option<Watch> {
        match self.claim {
            Claim::Exclusive => self.client.backend.watch(&self.name),
            claim => self.client.backend.watch_group(&self.name, claim),
        }
    }

    /// Whether a waiter of this process was woken for these holds and has not tried yet
    /// (the mutex only: holds of other kinds are not handed over one at a time).
    pub(crate) fn wake_pending(&self) -> bool {
        self.claim == Claim::Exclusive && self.client.backend.wake_pending(&self.name)
    }

    /// Gives back one hold of acquisition `generation`; the last one releases at the
    /// backend.
    ///
    /// The hold leaves the state before the request, and the state mutex is not held
    /// across it: local questions (`is_held`, `hold_count`, a lost signal's state) and the
    /// watchdog's renewals of other locks go on meanwhile. A re-entry after that point
    /// cannot join the ending hold: it is a fresh acquisition with an owner token of its
    /// own, which this release (of the old token) cannot touch at the backend.
    pub(crate) fn release_hold(&self, generation: u64, all: bool) -> Result<()> {
        let Some(Ended {
            token,
            until,
            signal,
            was_valid,
            counted_lost,
        }) = self.end_hold(generation, all)?
        else {
            return Ok(());
        };
        let released = self.release_at_backend(&token, until);
        if !counted_lost && (!was_valid || matches!(released, Ok(false))) {
            self.metrics.lost();
        }
        if let Some(signal) = signal {
            // Until now a watcher sees the hold as held (its release under way).
            // Lost if the lease had run out here (as the signal already said) or the key
            // was gone; a failed release (the key lasts until its lease ends) is still the
            // holder letting go.
            signal.end(!was_valid || matches!(released, Ok(false)));
        }
        match released {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LockLost),
            Err(e) => Err(e.into()),
        }
    }

    /// The local end of hold `generation` (or, unless `all`, of one re-entry of it:
    /// `None`): the hold leaves the state, its renewals end, and what its release at the
    /// backend needs is returned. `Err(NotHeld)` when it is not the current hold.
    pub(crate) fn end_hold(&self, generation: u64, all: bool) -> Result<Option<Ended>> {
        let mut state = self.state.lock();
        let holding = match state.holding.as_mut() {
            Some(h) if h.generation == generation => h,
            _ => return Err(Error::NotHeld),
        };
        if !all && holding.count > 1 {
            holding.count -= 1;
            return Ok(None);
        }
        let ended = Ended {
            token: holding.token,
            until: holding.lease.valid_until(),
            signal: holding.signal.take(),
            was_valid: holding.is_valid(self.client.backend.now()),
            counted_lost: holding.lost,
        };
        let since = holding.since;
        self.client
            .predictions
            .record(self.prediction, holding.read, holding.drew_at_acquisition);
        // Drops the hold's ticket under the state mutex: its renewals end.
        state.holding = None;
        state.ended_by_owner = generation;
        drop(state);
        self.metrics.released(since);
        Ok(Some(ended))
    }

    /// Whether the calling thread has a current hold here whose lease has not run out or
    /// been found lost (local knowledge).
    pub(crate) fn held_by_current_thread(&self) -> bool {
        let state = self.state.lock();
        state
            .holding
            .as_ref()
            .is_some_and(|h| h.thread == thread_no() && h.is_valid(self.client.backend.now()))
    }

    /// Runs `f` on hold `generation` under the state mutex, if it is current and not lost.
    pub(crate) fn with_current<T>(
        &self,
        generation: u64,
        f: impl FnOnce(&mut Holding) -> T,
    ) -> Option<T> {
        let mut state = self.state.lock();
        state
            .holding
            .as_mut()
            .filter(|h| h.generation == generation && !h.lost)
            .map(f)
    }
}

impl Renewable for LockShared {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn claim(&self) -> Claim {
        self.claim
    }

    fn now(&self) -> Instant {
        self.client.backend.now()
    }

    fn start_renewal(&self, generation: u64) -> Option<Started> {
        self.with_current(generation, |h| h.start_renewal())
    }

    fn with_hold(&self, generation: u64, f: &mut dyn FnMut(&mut dyn RenewedHold)) -> bool {
        let mut state = self.state.lock();
        match state.holding.as_mut() {
            Some(h) if h.generation == generation => {
                if !h.lost {
                    f(h);
                }
                false
            }
            _ => state.ended_by_owner == generation,
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn give_up(&self, token: &OwnerToken, until: Instant) {
        self.client
            .releaser
            .release_later(&self.name, self.claim, token, until, &self.metrics);
    }
}

impl Drop for LockShared {
    fn drop(&mut self) {
        let key = HoldKey {
            name: self.name.clone(),
            claim: self.claim,
            thread: self.key_thread,
        };
        if let Some(registry) = self.registry.upgrade() {
            registry.forget(&key, self as *const LockShared);
        }
    }
}
