//! What the handles of a client share: the client's settings and its registry of locks,
//! and each lock's hold state (what this process knows about its own hold of a lock).
//!
//! No state mutex is held across a backend call: an extension, a renewal or a release
//! takes what it needs under the mutex, lets go, makes the request, and applies the
//! answer only if the hold is still the same acquisition (its generation).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{
    Acquire, BackendError, Claim, FencingToken, Lease, LockBackend, LockName, OwnerToken, Watch,
};
use crate::error::{Error, InvalidArgument, Result};
use crate::observe::Metrics;
use crate::retry::RetryPolicy;
use crate::signal::Signal;
use crate::token_draw::TokenDraw;
use crate::watchdog::{Renewable, RenewedHold, Started, Ticket, Watchdog};

/// The settings and registry of one client, shared by its handles.
pub(crate) struct ClientShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) id: [u8; 16],
    /// The fixed lease of handles that set none; `None`: watchdog-renewed leases.
    pub(crate) lease: Option<Duration>,
    pub(crate) max_lease: Duration,
    /// Renews watchdog-managed holds (its thread starts with the first of them).
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) reentrant: bool,
    pub(crate) retry: RetryPolicy,
    /// The client's metrics (the locks' own, with their names as a label, when
    /// `metrics_lock_names`).
    pub(crate) metrics: Arc<Metrics>,
    metrics_lock_names: bool,
    pub(crate) token_draw: TokenDraw,
    /// Per lock name (by a hash), whether its last hold read its fencing token.
    predictions: Predictions,
    seq: AtomicU64,
    registry: Mutex<HashMap<HoldKey, Weak<LockShared>>>,
}

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

/// The settings of a client, for [`ClientShared::new`].
pub(crate) struct Settings {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) id: [u8; 16],
    pub(crate) lease: Option<Duration>,
    pub(crate) max_lease: Duration,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) reentrant: bool,
    pub(crate) retry: RetryPolicy,
    /// Metrics on (registered now, with the recorder in place).
    pub(crate) metrics: bool,
    /// Each lock's metrics carry its name.
    pub(crate) metrics_lock_names: bool,
    pub(crate) token_draw: TokenDraw,
}

impl ClientShared {
    pub(crate) fn new(s: Settings) -> Self {
        let metrics = if s.metrics {
            crate::observe::describe();
            Metrics::register(s.backend.kind(), None)
        } else {
            Metrics::off()
        };
        ClientShared {
            backend: s.backend,
            id: s.id,
            lease: s.lease,
            max_lease: s.max_lease,
            watchdog: s.watchdog,
            reentrant: s.reentrant,
            retry: s.retry,
            metrics: Arc::new(metrics),
            metrics_lock_names: s.metrics && s.metrics_lock_names,
            token_draw: s.token_draw,
            predictions: Predictions::new(),
            seq: AtomicU64::new(0),
            registry: Mutex::new(HashMap::new()),
        }
    }

    /// The owner token of the calling thread's next acquisition: unique to it (re-entry is
    /// counted here and never reaches the backend), so that a request that arrives late at
    /// a server, or a clean-up of a failed attempt, can only ever touch the key of the
    /// acquisition that sent it, never a later one of the same thread.
    pub(crate) fn token_for_current_thread(&self) -> OwnerToken {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        OwnerToken::new(self.id, thread_no(), seq)
    }

    /// The shared state of the lock called `name`: the one every live handle to it
    /// shares, or a new one.
    pub(crate) fn lock_state(self: &Arc<Self>, name: LockName) -> Arc<LockShared> {
        self.hold_state(HoldKey::new(name, Claim::Exclusive))
    }

    /// The shared state of the holds `key` names, as [`lock_state`](Self::lock_state).
    pub(crate) fn hold_state(self: &Arc<Self>, key: HoldKey) -> Arc<LockShared> {
        let mut registry = self.registry.lock();
        if let Some(shared) = registry.get(&key).and_then(Weak::upgrade) {
            return shared;
        }
        let name = key.name.clone();
        let prediction = self.predictions.slot(&name);
        let metrics = if self.metrics_lock_names {
            Arc::new(Metrics::register(self.backend.kind(), Some(name.as_str())))
        } else {
            self.metrics.clone()
        };
        let shared = Arc::new(LockShared::new(
            self.clone(),
            key.clone(),
            metrics,
            prediction,
        ));
        registry.insert(key, Arc::downgrade(&shared));
        shared
    }

    /// The shared state of `key` if a handle or guard keeps it alive (no new one).
    pub(crate) fn existing_state(&self, key: &HoldKey) -> Option<Arc<LockShared>> {
        self.registry.lock().get(key).and_then(Weak::upgrade)
    }

    /// Forgets `lock` when its last handle is gone.
    fn unregister(&self, key: &HoldKey, lock: *const LockShared) {
        let mut registry = self.registry.lock();
        if registry.get(key).is_some_and(|w| w.as_ptr() == lock) {
            registry.remove(key);
        }
    }

    pub(crate) fn check_lease(&self, lease: Duration) -> Result<Duration, InvalidArgument> {
        check_lease(lease, self.max_lease)
    }
}

/// `lease` if it is at least 1 ms, at most `max_lease`, and fits the monotonic clock.
pub(crate) fn check_lease(
    lease: Duration,
    max_lease: Duration,
) -> Result<Duration, InvalidArgument> {
    if lease < Duration::from_millis(1) {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} is below the minimum of 1 ms"),
        ));
    }
    if lease > max_lease {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} exceeds the maximum of {:?}", max_lease),
        ));
    }
    if Instant::now().checked_add(lease).is_none() {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} overflows the monotonic clock"),
        ));
    }
    Ok(lease)
}

/// How many lock names a client's prediction table tells apart (one bit each).
const PREDICTION_BITS: usize = 4096;

/// Whether the last hold of a lock read its fencing token, per lock name of one client:
/// a table of bits indexed by a hash of the name. Kept by the client, not in the lock's
/// [`LockShared`]: that goes with the last handle of the lock, and a program that calls
/// `client.get_lock(name)?.lock()?` for each use (a common style) would never have a
/// prediction. Bounded (512 bytes) whatever the number of names; two names that share a
/// bit share a prediction, which costs at most a misprediction (an unused draw, or one
/// more request), never a guarantee.
struct Predictions {
    bits: Box<[AtomicU64]>,
    hasher: RandomState,
}

/// A lock name's place in [`Predictions`]: a word and a bit.
#[derive(Clone, Copy)]
pub(crate) struct PredictionSlot {
    word: usize,
    mask: u64,
}

impl Predictions {
    fn new() -> Self {
        Predictions {
            bits: (0..PREDICTION_BITS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn slot(&self, name: &LockName) -> PredictionSlot {
        let bit = (self.hasher.hash_one(name) % PREDICTION_BITS as u64) as usize;
        PredictionSlot {
            word: bit / 64,
            mask: 1 << (bit % 64),
        }
    }

    fn read_last_time(&self, slot: PredictionSlot) -> bool {
        self.bits[slot.word].load(Ordering::Relaxed) & slot.mask != 0
    }

    /// Records how a hold ended: it read its token (draw with the next acquisition), or
    /// its token was drawn with the acquisition and never read (draw on read next time).
    /// A hold that neither read nor drew changes nothing.
    fn record(&self, slot: PredictionSlot, read: bool, drew_at_acquisition: bool) {
        let word = &self.bits[slot.word];
        let set = word.load(Ordering::Relaxed) & slot.mask != 0;
        if read && !set {
            word.fetch_or(slot.mask, Ordering::Relaxed);
        } else if !read && drew_at_acquisition && set {
            word.fetch_and(!slot.mask, Ordering::Relaxed);
        }
    }
}

/// A small number unique to the calling thread for the life of the process.
pub(crate) fn thread_no() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NO: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NO.with(|n| *n)
}

/// What [`LockShared::end_hold`] hands to the release at the backend.
pub(crate) struct Ended {
    pub(crate) token: OwnerToken,
    /// The hold's lost signal, if one was made: to be ended with the verdict.
    pub(crate) signal: Option<Signal>,
    pub(crate) was_valid: bool,
    /// Its loss was already counted.
    pub(crate) counted_lost: bool,
}

/// The hold state of one lock name of one client, shared by all its handles and guards.
pub(crate) struct LockShared {
    pub(crate) client: Arc<ClientShared>,
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
    fn new(
        client: Arc<ClientShared>,
        key: HoldKey,
        metrics: Arc<Metrics>,
        prediction: PredictionSlot,
    ) -> Self {
        LockShared {
            client,
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

    /// One acquisition attempt for `owner`, drawing the token with it when `fenced`.
    pub(crate) fn try_acquire(
        &self,
        owner: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> std::result::Result<Acquire, BackendError> {
        let backend = &self.client.backend;
        match self.claim {
            // The mutex's own calls: its hot path stays one virtual call.
            Claim::Exclusive if fenced => backend.try_acquire_fenced(&self.name, owner, ttl),
            Claim::Exclusive => backend.try_acquire(&self.name, owner, ttl),
            claim => backend.try_acquire_group(&self.name, claim, owner, ttl, fenced),
        }
    }

    /// Releases `owner`'s hold at the backend.
    pub(crate) fn release_at_backend(
        &self,
        owner: &OwnerToken,
    ) -> std::result::Result<bool, BackendError> {
        match self.claim {
            Claim::Exclusive => self.client.backend.release(&self.name, owner),
            claim => self.client.backend.release_group(&self.name, claim, owner),
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
            signal,
            was_valid,
            counted_lost,
        }) = self.end_hold(generation, all)?
        else {
            return Ok(());
        };
        let released = self.metrics.check(self.release_at_backend(&token));
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

    fn with_hold(&self, generation: u64, f: &mut dyn FnMut(&mut dyn RenewedHold)) {
        self.with_current(generation, |h| f(h));
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl Drop for LockShared {
    fn drop(&mut self) {
        let key = HoldKey {
            name: self.name.clone(),
            claim: self.claim,
            thread: self.key_thread,
        };
        self.client.unregister(&key, self as *const LockShared);
    }
}
