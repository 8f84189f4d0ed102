//! The `Lock` trait and its one implementation over any backend.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};
use parking_lot::Mutex;

use crate::backend::{Acquire, Lease, LockName, OwnerToken, Watch};
use crate::client::{ClientShared, thread_no};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::interrupt::Interrupt;
use crate::signal::Signal;
use crate::watchdog::{KeepAlive, Registration, Ticket};

/// The operations of the Java `AbstractLock` this library grew from, with Rust guards.
///
/// Every acquisition returns a [`LockGuard`] that releases on drop. The Java-style
/// [`unlock`](Lock::unlock) is there too: it gives back one hold of the calling thread, for
/// code that keeps holds across scopes with [`LockGuard::into_hold`].
///
/// ```
/// use std::time::Duration;
/// use dlm_core::{Lock, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let lock = LockClient::new(backend.clone()).get_lock("report")?;
/// let other = LockClient::new(backend).get_lock("report")?; // another owner
///
/// let guard = lock.lock()?;                        // waits as long as it takes
/// assert!(other.try_lock()?.is_none());            // one attempt: held, so `None`
/// assert!(other.try_lock_timeout(Duration::from_millis(20))?.is_none());
/// let again = lock.lock()?;                        // re-entrant on this thread
/// assert_eq!(lock.hold_count(), 2);
/// drop(again);
/// guard.unlock()?;                                 // the last hold releases
/// assert!(other.try_lock()?.is_some());
///
/// // Closure form: the lock is released when the closure returns.
/// assert_eq!(other.try_with_lock(Duration::ZERO, |_guard| "done")?, Some("done"));
///
/// // Java style: keep the hold past the guard, give it back with `Lock::unlock`.
/// lock.lock()?.into_hold();
/// lock.unlock()?;
/// # Ok::<(), dlm_core::Error>(())
/// ```
pub trait Lock {
    /// Blocks until the lock is acquired. Not interruptible. Transient backend failures
    /// are retried for the retry policy's error timeout, then returned.
    fn lock(&self) -> Result<LockGuard>;

    /// Blocks until the lock is acquired or `interrupt` fires ([`Error::Interrupted`]).
    fn lock_interruptibly(&self, interrupt: &Interrupt) -> Result<LockGuard>;

    /// One attempt; `Ok(None)` if someone else holds the lock. Never waits.
    fn try_lock(&self) -> Result<Option<LockGuard>>;

    /// Waits at most `timeout` (`Duration::MAX`: forever; zero: one attempt). `Ok(None)`
    /// if the lock was not acquired in time.
    fn try_lock_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>>;

    /// Like [`try_lock_timeout`](Lock::try_lock_timeout), and ends early with
    /// [`Error::Interrupted`] when `interrupt` fires.
    fn try_lock_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<LockGuard>>;

    /// Gives back one hold of the calling thread; the last one releases the lock.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the calling thread holds no hold of this lock;
    /// [`Error::LockLost`] when the lease was lost before this release.
    fn unlock(&self) -> Result<()>;

    /// Releases everything this handle's thread holds of the lock, whatever the hold
    /// count (the Java `Releasable::release`). `Ok(())` when nothing was held.
    fn release(&self) -> Result<()>;

    /// Runs `f` while holding the lock (waiting for it like [`lock`](Lock::lock)) and
    /// releases it when `f` returns or panics (node-redlock's `using`). `f` gets the
    /// guard: check [`LockGuard::is_held`] or [`LockGuard::ensure_held`] between steps of
    /// long work, and hand [`LockGuard::fencing_token`] to the resource.
    ///
    /// # Errors
    /// What [`lock`](Lock::lock) returns, before `f` runs; [`Error::LockLost`] after `f`
    /// ran when the lease was lost meanwhile (another holder may have run at the same
    /// time: `f`'s result is dropped, since the work it describes was not exclusive).
    ///
    /// ```
    /// use dlm_core::{Lock, LockClient};
    /// use dlm_memory::MemoryBackend;
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let total = client.get_lock("ledger")?.with_lock(|guard| {
    ///     assert!(guard.is_held());
    ///     40 + 2
    /// })?;
    /// assert_eq!(total, 42);
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    fn with_lock<R>(&self, f: impl FnOnce(&LockGuard) -> R) -> Result<R>
    where
        Self: Sized,
    {
        let guard = self.lock()?;
        let result = f(&guard); // a panic drops the guard, which releases
        guard.unlock()?;
        Ok(result)
    }

    /// Like [`with_lock`](Lock::with_lock), waiting at most `timeout` for the lock (zero:
    /// one attempt): `Ok(None)`, without running `f`, when it was not acquired in time.
    fn try_with_lock<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&LockGuard) -> R,
    ) -> Result<Option<R>>
    where
        Self: Sized,
    {
        let Some(guard) = self.try_lock_timeout(timeout)? else {
            return Ok(None);
        };
        let result = f(&guard);
        guard.unlock()?;
        Ok(Some(result))
    }
}

/// A named lock of a [`LockClient`](crate::LockClient); implements [`Lock`] for every
/// backend.
///
/// Cheap to clone; every handle to one name from one client shares the hold state.
#[derive(Clone)]
pub struct DistributedLock {
    shared: Arc<LockShared>,
    /// A fixed lease; `None`: watchdog-renewed.
    lease: Option<Duration>,
    /// Keeps the client's renewal thread running while this handle exists.
    _keep_alive: Arc<KeepAlive>,
}

pub(crate) struct LockShared {
    pub(crate) client: Arc<ClientShared>,
    pub(crate) name: LockName,
    pub(crate) state: Mutex<State>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) holding: Option<Holding>,
    next_generation: u64,
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
    /// A renewal or extension found the lock gone.
    pub(crate) lost: bool,
    /// Its place in the watchdog's schedule (watchdog-renewed holds only): dropped with
    /// the hold, which ends the renewals.
    _renewal: Option<Ticket>,
    /// The lost-lock signal, made on the first [`LockGuard::lost_signal`]: ended with a
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
}

impl LockShared {
    pub(crate) fn new(client: Arc<ClientShared>, name: LockName) -> Self {
        LockShared {
            client,
            name,
            state: Mutex::new(State::default()),
        }
    }

    /// Gives back one hold of acquisition `generation`; the last one releases at the
    /// backend. The state lock is held across the backend call so that a concurrent
    /// acquisition by the same owner cannot be undone by this release.
    pub(crate) fn release_hold(&self, generation: u64, all: bool) -> Result<()> {
        let mut state = self.state.lock();
        let holding = match state.holding.as_mut() {
            Some(h) if h.generation == generation => h,
            _ => return Err(Error::NotHeld),
        };
        if !all && holding.count > 1 {
            holding.count -= 1;
            return Ok(());
        }
        let token = holding.token;
        let signal = holding.signal.take();
        let was_valid = holding.is_valid(self.client.backend.now());
        state.holding = None;
        let released = self.client.backend.release(&self.name, &token);
        if let Some(signal) = signal {
            // Under the state mutex: a watcher never sees the hold gone without a verdict.
            // Lost if the lease had run out here (as the signal already said) or the key
            // was gone; a failed release (the key lasts until its lease ends) is still the
            // holder letting go.
            signal.end(!was_valid || matches!(released, Ok(false)));
        }
        drop(state);
        match released {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LockLost),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for LockShared {
    fn drop(&mut self) {
        self.client
            .unregister(&self.name, self as *const LockShared);
    }
}

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
enum Wait {
    /// One attempt.
    No,
    /// Until this instant.
    Until(Instant),
    Forever,
}

impl Wait {
    fn from_timeout(timeout: Duration) -> Wait {
        if timeout.is_zero() {
            return Wait::No;
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => Wait::Until(deadline),
            None => Wait::Forever,
        }
    }
}

impl DistributedLock {
    pub(crate) fn new(
        shared: Arc<LockShared>,
        lease: Option<Duration>,
        keep_alive: Arc<KeepAlive>,
    ) -> Self {
        DistributedLock {
            shared,
            lease,
            _keep_alive: keep_alive,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.shared.name.as_str()
    }

    /// The fixed lease each acquisition through this handle asks for; `None` when leases
    /// are renewed by the client's watchdog.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// This handle with a fixed lease: how long the lock stays held if the holder neither
    /// releases nor extends it. The watchdog does not renew such locks (Redisson's
    /// `lock(leaseTime)`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease below 1 ms, above the client's maximum, or
    /// one that overflows the monotonic clock. No I/O happens here.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.lease = Some(self.shared.client.check_lease(lease)?);
        Ok(self)
    }

    /// Whether anyone holds the lock now (asks the backend).
    pub fn is_locked(&self) -> Result<bool> {
        Ok(self.remaining_lease()?.is_some())
    }

    /// The remaining lease of whoever holds the lock, or `None` when it is free (asks the
    /// backend).
    pub fn remaining_lease(&self) -> Result<Option<Duration>> {
        Ok(self.shared.client.backend.inspect(&self.shared.name)?)
    }

    /// Whether the calling thread holds the lock with a lease that has not run out or
    /// been found lost (local knowledge, no I/O).
    pub fn is_held_by_current_thread(&self) -> bool {
        let state = self.shared.state.lock();
        state.holding.as_ref().is_some_and(|h| {
            h.thread == thread_no() && h.is_valid(self.shared.client.backend.now())
        })
    }

    /// How many holds the calling thread has (0 when it does not hold the lock).
    pub fn hold_count(&self) -> u32 {
        let state = self.shared.state.lock();
        match state.holding.as_ref() {
            Some(h) if h.thread == thread_no() => h.count,
            _ => 0,
        }
    }

    /// Releases the lock whoever holds it, in any process (administration). Returns
    /// whether it was held. Waiters are woken where the backend supports it.
    pub fn force_unlock(&self) -> Result<bool> {
        Ok(self
            .shared
            .client
            .backend
            .force_release(&self.shared.name)?)
    }

    fn acquire(&self, wait: Wait, interrupt: Option<&Interrupt>) -> Result<Option<LockGuard>> {
        let shared = &self.shared;
        let client = &shared.client;
        if interrupt.is_some_and(Interrupt::is_interrupted) {
            return Err(Error::Interrupted);
        }
        if client.reentrant
            && let Some(guard) = self.reenter()?
        {
            return Ok(Some(guard));
        }
        let token = client.token_for_current_thread();
        let never = crossbeam_channel::never();
        let interrupt_rx: &Receiver<()> = interrupt.map_or(&never, Interrupt::receiver);
        let mut watch: Option<Watch> = None;
        let mut subscribed = false;
        let mut attempt: u32 = 0;
        let mut failing_since: Option<Instant> = None;
        let ttl = self.lease.unwrap_or(client.watchdog.config().timeout);
        // The next attempt follows a wake-up of ours.
        let mut woken = false;
        // A real attempt was made (every call makes at least one).
        let mut attempted = false;
        let mut force = false;
        loop {
            // No barging past a hand-over in progress: an attempt that does not follow a
            // wake-up of ours holds back while a waiter of this process has been woken for
            // this lock and has not finished its attempt (typically woken by our own
            // thread's release a moment ago). It waits for its own turn (hints come in
            // FIFO order) or its backoff instead, so local waiters are served in turn.
            // `try_lock`, and the last look before a deadline, always attempt.
            let (our_turn, forced) = (std::mem::take(&mut woken), std::mem::take(&mut force));
            let hold_back = !our_turn
                && !forced
                && !matches!(wait, Wait::No)
                && client.backend.wake_pending(&shared.name);
            if hold_back && !subscribed {
                subscribed = true;
                watch = client.backend.watch(&shared.name);
            }
            let outcome = if hold_back && watch.is_some() {
                Ok(Acquire::Held { retry_after: None })
            } else {
                attempted = true;
                client.backend.try_acquire(&shared.name, &token, ttl)
            };
            if let Some(w) = &watch {
                w.trying(false);
            }
            let (retry_after, error) = match outcome {
                Ok(Acquire::Acquired(lease)) => {
                    if let Some(w) = &watch {
                        w.consume();
                    }
                    if interrupt.is_some_and(Interrupt::is_interrupted) {
                        self.abandon(&token);
                        return Err(Error::Interrupted);
                    }
                    return Ok(Some(self.install(token, lease)));
                }
                Ok(Acquire::Held { retry_after }) => {
                    failing_since = None;
                    (retry_after, None)
                }
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if !e.is_transient() || since.elapsed() >= client.retry.error_timeout_value() {
                        self.abandon(&token);
                        return Err(e.into());
                    }
                    log::debug!(
                        "lock {:?}: transient backend error, retrying: {e}",
                        shared.name
                    );
                    (None, Some(e))
                }
            };
            let now = Instant::now();
            let deadline = match wait {
                Wait::No => None,
                Wait::Until(d) if now >= d => None,
                Wait::Until(d) => Some(Some(d)),
                Wait::Forever => Some(None),
            };
            let Some(deadline) = deadline else {
                if !attempted {
                    // Held back until the end: look once before giving up.
                    force = true;
                    continue;
                }
                // Out of time: report the last failure if the last attempt failed.
                return match error {
                    Some(e) => {
                        self.abandon(&token);
                        Err(e.into())
                    }
                    None => Ok(None),
                };
            };
            // Subscribe after the first contended attempt, then look once more before
            // sleeping: a release between that attempt and the subscription is seen by the
            // second attempt, one after it by the subscription. No wake-up is lost, and an
            // uncontended acquisition pays nothing for the subscription.
            if !subscribed {
                subscribed = true;
                watch = client.backend.watch(&shared.name);
                if watch.is_some() && error.is_none() {
                    continue;
                }
            }
            let delay = match (&watch, retry_after) {
                // Woken by the release hint; otherwise look when the holder's lease ends.
                (Some(_), Some(remaining)) if error.is_none() => {
                    remaining + Duration::from_micros(rand::random_range(500..=2_000))
                }
                _ => client.retry.delay(attempt, retry_after),
            };
            attempt = attempt.saturating_add(1);
            let wake_at = match (now.checked_add(delay), deadline) {
                (Some(t), Some(d)) => t.min(d),
                (Some(t), None) => t,
                (None, Some(d)) => d,
                (None, None) => now + Duration::from_secs(3600),
            };
            let hint_rx = watch.as_ref().map_or(&never, Watch::receiver);
            select! {
                recv(interrupt_rx) -> _ => return Err(Error::Interrupted),
                recv(hint_rx) -> hint => {
                    if let (Ok(()), Some(w)) = (&hint, &watch) {
                        // Our turn: newcomers of this process hold back until we tried.
                        w.trying(true);
                        woken = true;
                    }
                    if hint.is_err() {
                        // The subscription died: poll from now on.
                        log::debug!("lock {:?}: release hints lost, polling", shared.name);
                        watch = None;
                    }
                }
                recv(crossbeam_channel::at(wake_at)) -> _ => {}
            }
        }
    }

    /// The re-entrant fast path: a further hold of a lock the calling thread holds.
    fn reenter(&self) -> Result<Option<LockGuard>> {
        let mut state = self.shared.state.lock();
        let me = thread_no();
        let Some(h) = state.holding.as_mut().filter(|h| h.thread == me) else {
            return Ok(None);
        };
        if !h.is_valid(self.shared.client.backend.now()) {
            // The earlier hold's lease is gone; its guards will report it. This
            // acquisition starts afresh.
            log::warn!(
                "lock {:?}: re-acquired by its holding thread after the lease was lost",
                self.shared.name
            );
            state.holding = None;
            return Ok(None);
        }
        h.count = h.count.checked_add(1).ok_or_else(|| {
            crate::error::InvalidArgument::new("hold count", "too many re-entrant holds")
        })?;
        let (generation, lease) = (h.generation, h.lease);
        drop(state);
        Ok(Some(LockGuard::new(
            self.shared.clone(),
            self._keep_alive.clone(),
            generation,
            lease,
        )))
    }

    fn install(&self, token: OwnerToken, lease: Lease) -> LockGuard {
        let mut state = self.shared.state.lock();
        state.next_generation += 1;
        let generation = state.next_generation;
        if state.holding.is_some() {
            // Another of our threads held it, but the backend granted it to us: that hold
            // expired. Its guards will see they are stale.
            log::warn!(
                "lock {:?}: taken over from an expired hold of this process",
                self.shared.name
            );
        }
        // Scheduled under the state mutex: the hold and its ticket appear together.
        let renewal = if self.lease.is_none() {
            self.shared.client.watchdog.register(Registration {
                lock: Arc::downgrade(&self.shared),
                generation,
                acquired: Instant::now(),
            })
        } else {
            None
        };
        state.holding = Some(Holding {
            thread: thread_no(),
            count: 1,
            generation,
            token,
            lease,
            lost: false,
            _renewal: renewal,
            signal: None,
        });
        drop(state);
        LockGuard::new(
            self.shared.clone(),
            self._keep_alive.clone(),
            generation,
            lease,
        )
    }

    /// Best effort: undoes an acquisition that may have landed (an attempt that failed
    /// after the request was sent, or one that won after an interrupt).
    fn abandon(&self, token: &OwnerToken) {
        if let Err(e) = self.shared.client.backend.release(&self.shared.name, token) {
            log::debug!(
                "lock {:?}: clean-up after a failed acquisition failed: {e}",
                self.shared.name
            );
        }
    }

    fn current_generation(&self) -> Result<u64> {
        let state = self.shared.state.lock();
        match state.holding.as_ref() {
            Some(h) if h.thread == thread_no() => Ok(h.generation),
            _ => Err(Error::NotHeld),
        }
    }
}

impl Lock for DistributedLock {
    fn lock(&self) -> Result<LockGuard> {
        self.acquire(Wait::Forever, None)
            .map(|g| g.expect("an unbounded wait ends only with the lock or an error"))
    }

    fn lock_interruptibly(&self, interrupt: &Interrupt) -> Result<LockGuard> {
        self.acquire(Wait::Forever, Some(interrupt))
            .map(|g| g.expect("an unbounded wait ends only with the lock or an error"))
    }

    fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.acquire(Wait::No, None)
    }

    fn try_lock_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Wait::from_timeout(timeout), None)
    }

    fn try_lock_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<LockGuard>> {
        self.acquire(Wait::from_timeout(timeout), Some(interrupt))
    }

    fn unlock(&self) -> Result<()> {
        let generation = self.current_generation()?;
        self.shared.release_hold(generation, false)
    }

    fn release(&self) -> Result<()> {
        match self.current_generation() {
            Ok(generation) => self.shared.release_hold(generation, true),
            Err(Error::NotHeld) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl fmt::Debug for DistributedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedLock")
            .field("name", &self.shared.name)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}
