//! The `Lock` trait and its one implementation over any backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Acquisition, Wait};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::hold::LockShared;
use crate::interrupt::Interrupt;
use crate::keep_alive::KeepAlive;
use crate::settings::thread_no;

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
    /// What an acquisition returns, releasing on drop: a [`LockGuard`] for one name, a
    /// [`MultiLockGuard`](crate::MultiLockGuard) for a set.
    type Guard: HoldGuard;

    /// Blocks until the lock is acquired. Not interruptible. Transient backend failures
    /// are retried for the retry policy's error timeout, then returned.
    fn lock(&self) -> Result<Self::Guard>;

    /// Blocks until the lock is acquired or `interrupt` fires ([`Error::Interrupted`]).
    fn lock_interruptibly(&self, interrupt: &Interrupt) -> Result<Self::Guard>;

    /// One attempt; `Ok(None)` if someone else holds the lock. Never waits.
    fn try_lock(&self) -> Result<Option<Self::Guard>>;

    /// Waits at most `timeout` (`Duration::MAX`: forever; zero: one attempt). `Ok(None)`
    /// if the lock was not acquired in time.
    fn try_lock_timeout(&self, timeout: Duration) -> Result<Option<Self::Guard>>;

    /// Like [`try_lock_timeout`](Lock::try_lock_timeout), and ends early with
    /// [`Error::Interrupted`] when `interrupt` fires.
    fn try_lock_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<Self::Guard>>;

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
    /// Once `f` has run under a lock that was held throughout, its result reaches the
    /// caller even if the release then fails (the server could not be reached): the
    /// failure is logged with `log::warn!` and the lock is left to its lease, which ends
    /// by itself (a watchdog-renewed lease within the watchdog timeout). A caller that
    /// retries transient errors therefore never runs work again that already ran.
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
    fn with_lock<R>(&self, f: impl FnOnce(&Self::Guard) -> R) -> Result<R>
    where
        Self: Sized,
    {
        let guard = self.lock()?;
        let result = f(&guard); // a panic drops the guard, which releases
        release_after_work(guard)?;
        Ok(result)
    }

    /// Like [`with_lock`](Lock::with_lock), waiting at most `timeout` for the lock (zero:
    /// one attempt): `Ok(None)`, without running `f`, when it was not acquired in time.
    fn try_with_lock<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Self::Guard) -> R,
    ) -> Result<Option<R>>
    where
        Self: Sized,
    {
        let Some(guard) = self.try_lock_timeout(timeout)? else {
            return Ok(None);
        };
        let result = f(&guard);
        release_after_work(guard)?;
        Ok(Some(result))
    }
}

/// The release at the end of a closure helper. `Err(LockLost)` when the hold was lost
/// during the work (found gone by a renewal or by this release, or its lease ran out):
/// the work was not exclusive. Any other failure of the release is logged (a transient
/// one is sent again in the background), so that the result of work that ran exclusively
/// reaches the caller.
pub(crate) fn release_after_work(guard: impl HoldGuard) -> Result<()> {
    let name = guard.describe();
    let held = guard.is_held();
    match guard.unlock() {
        Err(Error::LockLost) => Err(Error::LockLost),
        _ if !held => Err(Error::LockLost),
        Ok(()) => Ok(()),
        Err(e) => {
            log::warn!(
                "{name}: the work ran under the lock, but the release failed \
                 (sent again in the background while it fails transiently): {e}"
            );
            Ok(())
        }
    }
}

// `Lock` stays object-safe (its closure helpers need `Self: Sized`): this does not
// compile otherwise.
const _: Option<&dyn Lock<Guard = LockGuard>> = None;

/// What the closure helpers of [`Lock`] need of its guard: implemented by [`LockGuard`]
/// and [`MultiLockGuard`](crate::MultiLockGuard) only (sealed), whose own methods of the
/// same names say more.
pub trait HoldGuard: sealed::Sealed {
    /// `true` while the hold is (every hold of the guard is) held. No I/O.
    fn is_held(&self) -> bool;

    /// Gives back the hold (every hold of the guard).
    ///
    /// # Errors
    /// [`Error::LockLost`] when a hold had been lost; otherwise the first failure.
    fn unlock(self) -> Result<()>;
}

pub(crate) mod sealed {
    /// Keeps [`HoldGuard`](super::HoldGuard) to this crate's guards.
    pub trait Sealed {
        /// The lock or locks, for messages: `lock "a"`, `locks ["a", "b"]`.
        fn describe(&self) -> String;
    }
}

impl sealed::Sealed for LockGuard {
    fn describe(&self) -> String {
        format!("lock {:?}", self.name())
    }
}

impl HoldGuard for LockGuard {
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }

    fn unlock(self) -> Result<()> {
        LockGuard::unlock(self)
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
        let shared = &self.shared;
        Ok(shared
            .metrics
            .check(shared.client.backend.inspect(&shared.name))?)
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
        let shared = &self.shared;
        Ok(shared
            .metrics
            .check(shared.client.backend.force_release(&shared.name))?)
    }

    pub(crate) fn acquire(
        &self,
        wait: Wait,
        interrupt: Option<&Interrupt>,
    ) -> Result<Option<LockGuard>> {
        Acquisition {
            shared: &self.shared,
            lease: self.lease,
            keep_alive: &self._keep_alive,
            campaign: None,
        }
        .run(wait, interrupt)
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
    type Guard = LockGuard;

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
