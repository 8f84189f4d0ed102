//! The distributed read-write lock: many readers or one writer, writer-preferring.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use crate::acquire::Wait;
use crate::backend::{Claim, Holders};
use crate::error::{Deadlock, Error, InvalidArgument, Result};
use crate::guard::LockGuard;
use crate::handle::{Handle, run_then_release};
use crate::interrupt::Interrupt;

/// A read-write lock of a [`LockClient`](crate::LockClient): any number of readers at
/// once, or one writer, across every client of the store.
///
/// **Writer-preferring.** Once a writer waits, new readers wait behind it: the readers
/// inside drain, and the writer gets in within one read hold (the longest a reader keeps
/// it). A steady stream of readers cannot starve a writer. (While a writer waits it
/// renews a mark at the backend at each attempt, at least every second; a writer that
/// gives up, such as a failed [`try_write`](ReadWriteLock::try_write), or dies leaves the
/// mark to expire within [`WRITER_MARK`](crate::backend::WRITER_MARK), 3 s, and readers
/// go in again.)
///
/// **Re-entry.** Read holds of one thread are counted on one hold (a second `read` of the
/// thread never waits, even while a writer waits); write holds are re-entrant as the
/// mutex's are; a thread that holds the write lock may also [`read`](ReadWriteLock::read)
/// (counted on its write hold). A thread that holds a read hold and asks for the write
/// lock gets [`Error::WouldDeadlock`] with [`Deadlock::Upgrade`] at once: two readers
/// upgrading together would each wait for the other. Take the write lock and
/// [`downgrade`](WriteGuard::downgrade) it instead.
///
/// **Fencing.** A write hold's token is larger than every earlier write hold's of this
/// name. A read hold's token is larger than every write hold's before it, and at most the
/// next writer's: a store that accepts only non-decreasing tokens then refuses a writer
/// that came before the reader, and readers of one period may share a token.
///
/// The names of read-write locks, mutexes and semaphores are separate.
///
/// ```
/// use dlm_core::{Deadlock, Error, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let clients: Vec<_> = (0..3).map(|_| LockClient::new(backend.clone())).collect();
/// let [a, b, c] = [0, 1, 2].map(|i| clients[i].get_rw_lock("config"));
/// let (a, b, c) = (a?, b?, c?);
///
/// let r1 = a.read()?;
/// let r2 = b.read()?;                           // readers share
/// assert!(c.try_write()?.is_none());            // a writer waits for them
/// assert!(matches!(a.write(), Err(Error::WouldDeadlock(Deadlock::Upgrade))));
/// drop((r1, r2));
///
/// let w = c.write()?;
/// assert!(a.try_read()?.is_none());             // no reader beside a writer
/// let r = w.downgrade()?;                       // atomically a reader
/// assert!(a.try_read()?.is_some());             // readers join it
/// assert!(b.try_write()?.is_none());
/// drop(r);
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    handle: Handle,
}

impl ReadWriteLock {
    pub(crate) fn new(handle: Handle) -> Self {
        ReadWriteLock { handle }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.handle.name.as_str()
    }

    /// The fixed lease of each hold taken through this handle; `None` when the watchdog
    /// renews them.
    pub fn lease(&self) -> Option<Duration> {
        self.handle.lease
    }

    /// This handle with a fixed lease per hold (not renewed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease the client does not accept. No I/O happens
    /// here.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.handle = self.handle.with_lease(lease)?;
        Ok(self)
    }

    fn read_with(&self, wait: Wait, interrupt: Option<&Interrupt>) -> Result<Option<LockGuard>> {
        // A writer's read is counted on its write hold: it must not wait for itself.
        if let Some(write) = self.handle.existing_state(Claim::Write)
            && write.held_by_current_thread()
            && let Some(guard) = self.handle.acquisition(&write).reenter()?
        {
            return Ok(Some(guard));
        }
        self.handle.acquire(Claim::Read, wait, interrupt)
    }

    fn write_with(&self, wait: Wait, interrupt: Option<&Interrupt>) -> Result<Option<WriteGuard>> {
        if self
            .handle
            .existing_state(Claim::Read)
            .is_some_and(|read| read.held_by_current_thread())
        {
            return Err(Error::WouldDeadlock(Deadlock::Upgrade));
        }
        Ok(self
            .handle
            .acquire(Claim::Write, wait, interrupt)?
            .map(|guard| WriteGuard {
                guard,
                handle: self.handle.clone(),
            }))
    }

    /// A read hold, waiting as long as it takes (behind a waiting writer too).
    pub fn read(&self) -> Result<LockGuard> {
        self.read_with(Wait::Forever, None)
            .map(|g| g.expect("an unbounded wait ends only with a hold or an error"))
    }

    /// [`read`](ReadWriteLock::read), ended early by `interrupt`.
    pub fn read_interruptibly(&self, interrupt: &Interrupt) -> Result<LockGuard> {
        self.read_with(Wait::Forever, Some(interrupt))
            .map(|g| g.expect("an unbounded wait ends only with a hold or an error"))
    }

    /// One attempt at a read hold: `None` while a writer holds or waits.
    pub fn try_read(&self) -> Result<Option<LockGuard>> {
        self.read_with(Wait::No, None)
    }

    /// Waits at most `timeout` for a read hold.
    pub fn try_read_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.read_with(Wait::from_timeout(timeout), None)
    }

    /// [`try_read_timeout`](ReadWriteLock::try_read_timeout), ended early by `interrupt`.
    pub fn try_read_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<LockGuard>> {
        self.read_with(Wait::from_timeout(timeout), Some(interrupt))
    }

    /// The write hold, waiting as long as it takes; while it waits, new readers wait
    /// behind it.
    ///
    /// # Errors
    /// [`Error::WouldDeadlock`] with [`Deadlock::Upgrade`] when the calling thread holds
    /// a read hold of it; the mutex's errors otherwise.
    pub fn write(&self) -> Result<WriteGuard> {
        self.write_with(Wait::Forever, None)
            .map(|g| g.expect("an unbounded wait ends only with a hold or an error"))
    }

    /// [`write`](ReadWriteLock::write), ended early by `interrupt`.
    pub fn write_interruptibly(&self, interrupt: &Interrupt) -> Result<WriteGuard> {
        self.write_with(Wait::Forever, Some(interrupt))
            .map(|g| g.expect("an unbounded wait ends only with a hold or an error"))
    }

    /// One attempt at the write hold.
    pub fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write_with(Wait::No, None)
    }

    /// Waits at most `timeout` for the write hold.
    pub fn try_write_timeout(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        self.write_with(Wait::from_timeout(timeout), None)
    }

    /// [`try_write_timeout`](ReadWriteLock::try_write_timeout), ended early by
    /// `interrupt`.
    pub fn try_write_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<WriteGuard>> {
        self.write_with(Wait::from_timeout(timeout), Some(interrupt))
    }

    /// Runs `f` under a read hold, released when `f` returns or panics (the result rules
    /// of [`Lock::with_lock`](crate::Lock::with_lock)).
    pub fn with_read<R>(&self, f: impl FnOnce(&LockGuard) -> R) -> Result<R> {
        run_then_release(self.read()?, f)
    }

    /// Runs `f` under the write hold, released when `f` returns or panics.
    pub fn with_write<R>(&self, f: impl FnOnce(&LockGuard) -> R) -> Result<R> {
        run_then_release(self.write()?.guard, f)
    }

    /// How many hold it now, readers and writer (asks the backend).
    pub fn holders(&self) -> Result<u32> {
        Ok(u32::try_from(self.inspect()?.holders.len()).unwrap_or(u32::MAX))
    }

    /// Who holds it now, readers and writer (asks the backend): each hold's kind, label
    /// and remaining lease.
    pub fn inspect(&self) -> Result<Holders> {
        self.handle.inspect(Claim::Read)
    }

    /// Ends every hold of the name, readers and writer, and any writer's waiting mark
    /// (administration): returns whether any was held.
    pub fn force_unlock(&self) -> Result<bool> {
        Ok(self
            .handle
            .client
            .backend
            .force_release_group(&self.handle.name, Claim::Write)?)
    }
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &self.handle.name)
            .field("lease", &self.handle.lease)
            .finish_non_exhaustive()
    }
}

/// The write hold of a [`ReadWriteLock`]: a [`LockGuard`] (through `Deref`) that can also
/// be [`downgrade`](WriteGuard::downgrade)d to a read hold. Released on drop.
#[must_use = "if unused the write lock is released immediately"]
#[clippy::has_significant_drop]
pub struct WriteGuard {
    guard: LockGuard,
    handle: Handle,
}

impl WriteGuard {
    /// Gives back this hold; the last hold releases the write lock (see
    /// [`LockGuard::unlock`]).
    pub fn unlock(self) -> Result<()> {
        self.guard.unlock()
    }

    /// The write hold as a plain [`LockGuard`] (released on its drop or
    /// [`unlock`](LockGuard::unlock)), for code that treats every hold alike; it can no
    /// longer be downgraded.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// The write hold turned into a read hold of the calling thread in one atomic step at
    /// the backend: no other writer gets in between, and readers may join at once. The
    /// read hold keeps the write hold's fencing token.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when other holds of this write hold (re-entries) are
    /// outstanding, or the calling thread already has a read hold of it of its own;
    /// [`Error::LockLost`] when the write hold is gone (nothing is held then);
    /// [`Error::Backend`] on failure: nothing is held then either (the write hold and the
    /// read hold the downgrade may have written are released, again in the background
    /// while that fails).
    pub fn downgrade(self) -> Result<LockGuard> {
        let read = self.handle.state(Claim::Read);
        if read.held_by_current_thread() {
            return Err(InvalidArgument::new(
                "downgrade",
                "the calling thread already holds a read hold of this lock",
            )
            .into());
        }
        let acquisition = self.handle.acquisition(&read);
        let (write, generation) = self.guard.hold();
        let write = write.clone();
        let client = &write.client;
        let (writer, fence) = write
            .with_current(generation, |h| {
                if h.count > 1 {
                    Err(InvalidArgument::new(
                        "downgrade",
                        "other holds of this write hold (re-entries) are outstanding",
                    )
                    .into())
                } else if !h.is_valid(client.backend.now()) {
                    Err(Error::LockLost)
                } else {
                    Ok((h.token, h.fence))
                }
            })
            .unwrap_or(Err(Error::LockLost))?;
        let reader = client.token_for_current_thread();
        let ttl = self
            .handle
            .lease
            .unwrap_or(client.watchdog.config().timeout);
        let answer =
            write
                .metrics
                .check(client.backend.downgrade(&write.name, &writer, &reader, ttl));
        match answer {
            Ok(Some(lease)) => {
                // The write hold ends here: the backend turned it into the read hold, so
                // there is nothing to release.
                self.guard.forget();
                if let Ok(Some(ended)) = write.end_hold(generation, true)
                    && let Some(signal) = ended.signal
                {
                    signal.end(false);
                }
                let lease = match (lease.fence(), fence) {
                    (None, Some(fence)) => lease.with_fence(fence),
                    _ => lease,
                };
                Ok(acquisition.install(reader, lease, None, false))
            }
            Ok(None) => {
                write.with_current(generation, |h| h.mark_lost());
                Err(Error::LockLost)
            }
            Err(e) if e.may_have_applied() => {
                // The downgrade may have been applied (its reply lost, or too few replicas
                // acknowledged it): the read hold it may have written is released, and so
                // is the write hold, which it may have turned into that read hold (so its
                // release finding nothing is no loss). Neither is left to its lease.
                let now = client.backend.now();
                read.undo(&reader, now + ttl);
                self.guard.forget();
                if let Ok(Some(ended)) = write.end_hold(generation, true) {
                    if let Some(signal) = ended.signal {
                        signal.end(false);
                    }
                    write.undo(&ended.token, ended.until);
                }
                Err(e.into())
            }
            // Refused, or never sent: the write hold is as it was, and the guard's drop
            // releases it.
            Err(e) => Err(e.into()),
        }
    }
}

impl Deref for WriteGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WriteGuard").field(&self.guard).finish()
    }
}
