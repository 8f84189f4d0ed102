//! The distributed semaphore: at most N holders of a name at once, each permit a lease of
//! its own (renewed by the watchdog, lost with its holder).

use std::fmt;
use std::time::Duration;

use crate::acquire::Wait;
use crate::backend::{Claim, Holders};
use crate::error::Result;
use crate::guard::LockGuard;
use crate::handle::{Handle, run_then_release};
use crate::interrupt::Interrupt;

/// A semaphore of a [`LockClient`](crate::LockClient): at most `permits` holders of its
/// name at once, across every client of the store ("at most N of these jobs at once").
///
/// Each permit is a hold with everything the mutex's has: a lease (renewed by the
/// watchdog unless the handle has a fixed one), so that a crashed holder's permit comes
/// back when its lease ends; a lost-lock signal; a fencing token
/// ([`LockGuard::fencing_token`]) larger than every earlier permit holder's of this name;
/// wake-ups when a permit is released. The guard releases the permit on drop.
///
/// The permit count is part of the semaphore: the first holder fixes it and it stays
/// fixed while any permit is held. An acquisition with another count fails with
/// [`BackendErrorKind::Conflict`](crate::BackendErrorKind::Conflict) (no second semaphore
/// appears). To change the count, let every holder release (or
/// [`force_unlock`](Semaphore::force_unlock) the name) and acquire with the new one.
///
/// A permit is not re-entrant: a thread that holds a permit of this semaphore and asks for
/// another gets [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once (one thread
/// taking every permit would wait for itself). Several threads of one client hold permits
/// independently.
///
/// The names of semaphores, mutexes and read-write locks are separate: the semaphore
/// `"jobs"` and the lock `"jobs"` never block each other.
///
/// ```
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let (a, b, c) = (
///     LockClient::new(backend.clone()),
///     LockClient::new(backend.clone()),
///     LockClient::new(backend),
/// );
/// let jobs = |client: &LockClient| client.get_semaphore("exports", 2);
/// let first = jobs(&a)?.acquire()?;
/// let second = jobs(&b)?.acquire()?;
/// assert!(jobs(&c)?.try_acquire()?.is_none()); // both permits taken
/// assert_eq!(jobs(&c)?.holders()?, 2);
/// drop(first);
/// let third = jobs(&c)?.try_acquire()?.expect("a permit was released");
/// assert!(third.fencing_token()? > second.fencing_token()?);
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Semaphore {
    handle: Handle,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(handle: Handle, permits: u32) -> Self {
        Semaphore { handle, permits }
    }

    fn claim(&self) -> Claim {
        Claim::Permit {
            permits: self.permits,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.handle.name.as_str()
    }

    /// Its number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The fixed lease of each permit taken through this handle; `None` when the watchdog
    /// renews them.
    pub fn lease(&self) -> Option<Duration> {
        self.handle.lease
    }

    /// This handle with a fixed lease per permit (not renewed): how long a permit stays
    /// taken if its holder neither releases nor extends it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease the client
    /// does not accept. No I/O happens here.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.handle = self.handle.with_lease(lease)?;
        Ok(self)
    }

    fn acquire_with(&self, wait: Wait, interrupt: Option<&Interrupt>) -> Result<Option<LockGuard>> {
        self.handle.acquire(self.claim(), wait, interrupt)
    }

    /// Takes a permit, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) when the calling thread holds
    /// a permit of it already; a [`Conflict`](crate::BackendErrorKind::Conflict) backend
    /// error when its holders hold it with another permit count; the mutex's errors
    /// otherwise.
    pub fn acquire(&self) -> Result<LockGuard> {
        self.acquire_with(Wait::Forever, None)
            .map(|g| g.expect("an unbounded wait ends only with a permit or an error"))
    }

    /// [`acquire`](Semaphore::acquire), ended early by `interrupt`
    /// ([`Error::Interrupted`](crate::Error::Interrupted)).
    pub fn acquire_interruptibly(&self, interrupt: &Interrupt) -> Result<LockGuard> {
        self.acquire_with(Wait::Forever, Some(interrupt))
            .map(|g| g.expect("an unbounded wait ends only with a permit or an error"))
    }

    /// One attempt: a permit, or `None` when all are taken.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::No, None)
    }

    /// Waits at most `timeout` for a permit (zero: one attempt).
    pub fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::from_timeout(timeout), None)
    }

    /// [`try_acquire_timeout`](Semaphore::try_acquire_timeout), ended early by `interrupt`.
    pub fn try_acquire_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::from_timeout(timeout), Some(interrupt))
    }

    /// Runs `f` holding a permit (waiting for one like [`acquire`](Semaphore::acquire)),
    /// released when `f` returns or panics, with the result rules of
    /// [`Lock::with_lock`](crate::Lock::with_lock).
    pub fn with_permit<R>(&self, f: impl FnOnce(&LockGuard) -> R) -> Result<R> {
        run_then_release(self.acquire()?, f)
    }

    /// Like [`with_permit`](Semaphore::with_permit), waiting at most `timeout`: `Ok(None)`,
    /// without running `f`, when no permit came in time.
    pub fn try_with_permit<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&LockGuard) -> R,
    ) -> Result<Option<R>> {
        match self.try_acquire_timeout(timeout)? {
            Some(guard) => run_then_release(guard, f).map(Some),
            None => Ok(None),
        }
    }

    /// How many permits are held now, by anyone (asks the backend).
    pub fn holders(&self) -> Result<u32> {
        Ok(u32::try_from(self.inspect()?.holders.len()).unwrap_or(u32::MAX))
    }

    /// Who holds its permits now (asks the backend): each holder's label and remaining
    /// lease, and the permit count the holders hold it with (which may differ from this
    /// handle's [`permits`](Semaphore::permits): an acquisition through this handle is then
    /// refused with a [`Conflict`](crate::BackendErrorKind::Conflict)).
    pub fn inspect(&self) -> Result<Holders> {
        self.handle.inspect(self.claim())
    }

    /// Whether the calling thread holds a permit of it (local knowledge, no I/O).
    pub fn is_held_by_current_thread(&self) -> bool {
        self.handle
            .existing_state(self.claim())
            .is_some_and(|s| s.held_by_current_thread())
    }

    /// Releases every permit of the name, whoever holds them (administration): returns
    /// whether any was held. Their holders find them lost at their next renewal.
    pub fn force_unlock(&self) -> Result<bool> {
        Ok(self
            .handle
            .client
            .backend
            .force_release_group(&self.handle.name, self.claim())?)
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.handle.name)
            .field("permits", &self.permits)
            .field("lease", &self.handle.lease)
            .finish_non_exhaustive()
    }
}
