//! All-or-nothing holds of several names: [`MultiLock`], its guard and its lost signal.
//!
//! The names are taken one by one in one order, the same for every client (by their
//! bytes): two clients that want overlapping sets both wait for the smallest name they
//! share before either holds a larger one, so neither can hold what the other waits for
//! while waiting for what the other holds. Each member is an ordinary hold of the
//! client (re-entrant, renewed by the watchdog in its batched rounds, woken by releases
//! of the name it waits for); an attempt that does not get every name gives back those it
//! got before it returns.

use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_channel::Select;

use crate::acquire::Wait;
use crate::backend::FencingToken;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::interrupt::Interrupt;
use crate::lock::{DistributedLock, Lock};
use crate::lost::{HoldState, LostSignal};

/// Several named locks held together or not at all (Redisson's `RedissonMultiLock`,
/// Curator's `InterProcessMultiLock`), from
/// [`LockClient::get_multi_lock`](crate::LockClient::get_multi_lock).
///
/// It implements [`Lock`]: every acquisition returns a [`MultiLockGuard`] holding every
/// name, or holds none of them when it fails, times out or is interrupted; a timeout
/// covers the whole set. The names are taken in one canonical order (sorted by their
/// bytes), so clients that take overlapping sets in any order never deadlock; while it
/// waits for a name, an acquisition keeps the names before it (renewed as any hold) and
/// is woken by that name's release.
///
/// ```
/// use std::time::Duration;
/// use dlm_core::{Lock, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let transfer = LockClient::new(backend.clone()).get_multi_lock(["acct-9", "acct-4"])?;
/// let audit = LockClient::new(backend).get_multi_lock(["acct-4", "acct-7"])?;
///
/// let guard = transfer.lock()?;                   // both accounts, or neither
/// assert_eq!(guard.names().collect::<Vec<_>>(), ["acct-4", "acct-9"]);
/// // acct-4 is taken: the audit gets nothing, not even acct-7.
/// assert!(audit.try_lock_timeout(Duration::from_millis(20))?.is_none());
/// let tokens = guard.fencing_tokens()?;           // one per name, for the writes
/// assert_eq!(tokens.len(), 2);
/// guard.unlock()?;
/// assert!(audit.try_lock()?.is_some());
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// Sorted by name, no name twice, at least one.
    locks: Vec<DistributedLock>,
}

impl MultiLock {
    /// The set of `locks`, already in the canonical order (sorted by name) with at least
    /// one and no name twice: `LockClient::get_multi_lock` sorts and checks them.
    pub(crate) fn new(locks: Vec<DistributedLock>) -> MultiLock {
        debug_assert!(!locks.is_empty() && locks.windows(2).all(|w| w[0].name() < w[1].name()));
        MultiLock { locks }
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.locks.iter().map(DistributedLock::name)
    }

    /// Each name's lock, in the order they are taken.
    pub fn locks(&self) -> &[DistributedLock] {
        &self.locks
    }

    /// This set with a fixed lease for every name (see [`DistributedLock::with_lease`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease the client does not accept. No I/O.
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        let locks = self
            .locks
            .into_iter()
            .map(|l| l.with_lease(lease))
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiLock { locks })
    }

    /// Whether anyone holds any of the names now (asks the backend, one name at a time).
    pub fn is_any_locked(&self) -> Result<bool> {
        for lock in &self.locks {
            if lock.is_locked()? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn acquire(&self, wait: Wait, interrupt: Option<&Interrupt>) -> Result<Option<MultiLockGuard>> {
        loop {
            let mut guards = Vec::with_capacity(self.locks.len());
            for lock in &self.locks {
                // On `None` or an error, the names taken so far are given back as
                // `guards` drops.
                match lock.acquire(wait, interrupt)? {
                    Some(guard) => guards.push(guard),
                    None => return Ok(None),
                }
            }
            let guard = MultiLockGuard { guards };
            if guard.is_held() {
                return Ok(Some(guard));
            }
            // A name taken early ran out of its (fixed) lease while a later one was
            // waited for: give everything back and start again, while there is time.
            drop(guard);
            if let Wait::Until(deadline) = wait
                && Instant::now() >= deadline
            {
                return Ok(None);
            }
            if matches!(wait, Wait::No) {
                return Ok(None);
            }
        }
    }
}

impl Lock for MultiLock {
    type Guard = MultiLockGuard;

    fn lock(&self) -> Result<MultiLockGuard> {
        self.acquire(Wait::Forever, None)
            .map(|g| g.expect("an unbounded wait ends only with the locks or an error"))
    }

    fn lock_interruptibly(&self, interrupt: &Interrupt) -> Result<MultiLockGuard> {
        self.acquire(Wait::Forever, Some(interrupt))
            .map(|g| g.expect("an unbounded wait ends only with the locks or an error"))
    }

    fn try_lock(&self) -> Result<Option<MultiLockGuard>> {
        self.acquire(Wait::No, None)
    }

    fn try_lock_timeout(&self, timeout: Duration) -> Result<Option<MultiLockGuard>> {
        self.acquire(Wait::from_timeout(timeout), None)
    }

    fn try_lock_interruptibly(
        &self,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<MultiLockGuard>> {
        self.acquire(Wait::from_timeout(timeout), Some(interrupt))
    }

    /// Gives back one hold of every name, in the reverse order.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the calling thread holds none of them;
    /// [`Error::LockLost`] when any was lost; otherwise the first other failure (every
    /// name is given back all the same).
    fn unlock(&self) -> Result<()> {
        let results: Vec<Result<()>> = self.locks.iter().rev().map(Lock::unlock).collect();
        if results.iter().all(|r| matches!(r, Err(Error::NotHeld))) {
            return Err(Error::NotHeld);
        }
        first_failure(
            results
                .into_iter()
                .filter(|r| !matches!(r, Err(Error::NotHeld))),
        )
    }

    fn release(&self) -> Result<()> {
        first_failure(
            self.locks
                .iter()
                .rev()
                .map(Lock::release)
                .collect::<Vec<_>>(),
        )
    }
}

/// `Err(LockLost)` if any result is, else the first error, else `Ok`.
fn first_failure(results: impl IntoIterator<Item = Result<()>>) -> Result<()> {
    let mut first = Ok(());
    for result in results {
        match result {
            Err(Error::LockLost) => first = Err(Error::LockLost),
            Err(e) if first.is_ok() => first = Err(e),
            _ => {}
        }
    }
    first
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The hold of every name of a [`MultiLock`]: one [`LockGuard`] per name, in the
/// canonical order, released together when this guard is dropped (in the reverse order;
/// best effort, as a [`LockGuard`]'s drop).
#[must_use = "if unused the locks are released immediately"]
#[clippy::has_significant_drop]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The names held, in the canonical order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.guards.iter().map(LockGuard::name)
    }

    /// Each name's guard, in the canonical order (to extend one, or read its lease).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// `true` while every name is held (see [`LockGuard::is_held`]). No I/O.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// The names no longer held (lost, or run out of their lease). No I/O.
    pub fn lost(&self) -> Vec<&str> {
        self.guards
            .iter()
            .filter(|g| !g.is_held())
            .map(LockGuard::name)
            .collect()
    }

    /// `Ok(())` when every name is held, else [`Error::LockLost`].
    pub fn ensure_held(&self) -> Result<()> {
        if self.is_held() {
            Ok(())
        } else {
            Err(Error::LockLost)
        }
    }

    /// The earliest end of the members' leases, as this process knows them.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .expect("a multi-lock holds at least one name")
    }

    /// A signal that ends when any name is lost (or all are released).
    pub fn lost_signal(&self) -> MultiLostSignal {
        MultiLostSignal {
            members: self.guards.iter().map(LockGuard::lost_signal).collect(),
        }
    }

    /// Each name's fencing token (see [`LockGuard::fencing_token`]), in the canonical
    /// order: hand the resource of each name its own.
    ///
    /// # Errors
    /// What [`LockGuard::fencing_token`] returns for the first name that fails.
    pub fn fencing_tokens(&self) -> Result<Vec<(&str, FencingToken)>> {
        self.guards
            .iter()
            .map(|g| Ok((g.name(), g.fencing_token()?)))
            .collect()
    }

    /// Resets every name's lease to `ttl` from now (see [`LockGuard::extend`]).
    ///
    /// # Errors
    /// [`Error::LockLost`] when any name is no longer ours; otherwise the first failure.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        first_failure(
            self.guards
                .iter()
                .map(|g| g.extend(ttl))
                .collect::<Vec<_>>(),
        )
    }

    /// Gives back every name, in the reverse order.
    ///
    /// # Errors
    /// [`Error::LockLost`] when any name had been lost (the work was not exclusive);
    /// otherwise the first failure of a release (each name is released all the same; a
    /// transient failure is sent again in the background, as for [`LockGuard::unlock`]).
    pub fn unlock(mut self) -> Result<()> {
        let guards = std::mem::take(&mut self.guards);
        first_failure(
            guards
                .into_iter()
                .rev()
                .map(LockGuard::unlock)
                .collect::<Vec<_>>(),
        )
    }

    /// Keeps every hold without the guard (see [`LockGuard::into_hold`]); give them back
    /// with [`Lock::unlock`] on the [`MultiLock`].
    pub fn into_hold(mut self) {
        for guard in std::mem::take(&mut self.guards) {
            guard.into_hold();
        }
    }
}

impl crate::lock::sealed::Sealed for MultiLockGuard {
    fn describe(&self) -> String {
        format!("locks {:?}", self.names().collect::<Vec<_>>())
    }
}

impl crate::lock::HoldGuard for MultiLockGuard {
    fn is_held(&self) -> bool {
        MultiLockGuard::is_held(self)
    }

    fn unlock(self) -> Result<()> {
        MultiLockGuard::unlock(self)
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        while let Some(guard) = self.guards.pop() {
            drop(guard);
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

/// How a [`MultiLockGuard`]'s hold ends, for whoever must stop when any of its names is
/// lost: made by [`MultiLockGuard::lost_signal`]. [`Lost`](HoldState::Lost) as soon as
/// any name is, [`Released`](HoldState::Released) once every name is released, `Held`
/// otherwise. No I/O; cheap to clone.
#[derive(Clone)]
pub struct MultiLostSignal {
    members: Vec<LostSignal>,
}

impl MultiLostSignal {
    /// Where the hold of the set stands now.
    pub fn state(&self) -> HoldState {
        let states: Vec<HoldState> = self.members.iter().map(LostSignal::state).collect();
        if states.contains(&HoldState::Lost) {
            HoldState::Lost
        } else if states.iter().all(|s| *s == HoldState::Released) {
            HoldState::Released
        } else {
            HoldState::Held
        }
    }

    /// `true` once any name is lost.
    pub fn is_lost(&self) -> bool {
        self.state() == HoldState::Lost
    }

    /// The names lost so far.
    pub fn lost(&self) -> Vec<&str> {
        self.members
            .iter()
            .filter(|m| m.is_lost())
            .map(LostSignal::name)
            .collect()
    }

    /// Blocks until any name is lost or every name is released, and says which.
    pub fn wait(&self) -> HoldState {
        crate::lost::wait_until_over(|d| self.wait_once(d))
    }

    /// Like [`wait`](MultiLostSignal::wait), for at most `timeout`: `Held` when the hold
    /// outlasted it.
    pub fn wait_timeout(&self, timeout: Duration) -> HoldState {
        crate::lost::wait_at_most(timeout, |d| self.wait_once(d), || self.state())
    }

    /// One sleep: until a member still held ends, its lease runs out, or `deadline`.
    /// `Some` once the set's hold is over.
    fn wait_once(&self, deadline: Option<Instant>) -> Option<HoldState> {
        let state = self.state();
        if state != HoldState::Held {
            return Some(state);
        }
        let mut select = Select::new();
        let mut until = deadline;
        for member in &self.members {
            let Some(left) = member.held_for() else {
                continue; // released already: its channel is closed for good
            };
            select.recv(member.end_channel());
            if let Some(t) = left.and_then(|l| Instant::now().checked_add(l)) {
                until = Some(until.map_or(t, |u| u.min(t)));
            }
        }
        // Woken when a member ends or at `until`: the next look says how.
        match until {
            Some(until) => drop(select.ready_deadline(until)),
            None => drop(select.ready()),
        }
        None
    }
}

impl fmt::Debug for MultiLostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLostSignal")
            .field("members", &self.members)
            .finish()
    }
}
