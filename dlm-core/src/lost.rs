//! How a hold ends, for whoever must stop when its lock is lost.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hold::LockShared;
use crate::signal::{Ending, Signal};

/// Where a hold stands, as a [`LostSignal`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldState {
    /// Held, as far as this process knows: not released, no renewal or extension found it
    /// gone, and its lease has not run out.
    Held,
    /// Lost: a watchdog renewal or an [`extend`](crate::LockGuard::extend) found the lock
    /// gone (expired, force-released, lost by the backend), renewals failed until the
    /// lease ran out, or a fixed lease ran out before the holder let go. Whatever the lock
    /// protected may have been entered by someone else since.
    Lost,
    /// Released by its holder (the last guard unlocked or dropped) while still held.
    Released,
}

/// Tells whoever watches one hold (another thread, a worker pool) that the lock is lost,
/// or that the holder let go: made by [`LockGuard::lost_signal`](crate::LockGuard::lost_signal).
///
/// "Lost" and "released" are distinct states ([`HoldState`]), so stopping work because
/// the lock is gone is never confused with the holder having finished. Local knowledge,
/// no I/O: a loss is known when a renewal or an extension finds the lock gone, or when the
/// lease runs out. Cheap to clone; `Send` and `Sync`.
///
/// ```
/// use std::time::Duration;
/// use dlm_core::{HoldState, Lock, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let lock = LockClient::new(backend.clone()).get_lock("batch")?;
/// let guard = lock.lock()?;
/// let signal = guard.lost_signal();
/// let worker = std::thread::spawn(move || {
///     // ... work, and stop when the lock is lost (or the holder is done) ...
///     signal.wait()
/// });
/// // Someone else breaks the lock; the next renewal or extension finds it gone.
/// LockClient::new(backend).get_lock("batch")?.force_unlock()?;
/// assert!(guard.extend(Duration::from_secs(30)).is_err());
/// assert_eq!(worker.join().unwrap(), HoldState::Lost);
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct LostSignal {
    lock: Arc<LockShared>,
    generation: u64,
    ending: Ending,
}

impl LostSignal {
    /// A signal of hold `generation` of `lock`, made from its [`Signal`].
    pub(crate) fn new(lock: Arc<LockShared>, generation: u64, signal: &Signal) -> LostSignal {
        LostSignal {
            lock,
            generation,
            ending: signal.watcher(),
        }
    }

    /// A signal of a hold that is already over, ended as `lost` says.
    pub(crate) fn ended(lock: Arc<LockShared>, generation: u64, lost: bool) -> LostSignal {
        LostSignal {
            lock,
            generation,
            ending: Signal::ended(lost),
        }
    }

    /// Where the hold stands now (no I/O).
    pub fn state(&self) -> HoldState {
        self.current().0
    }

    /// `true` once the hold is [`Lost`](HoldState::Lost).
    pub fn is_lost(&self) -> bool {
        self.state() == HoldState::Lost
    }

    /// Blocks until the hold is over and says how: [`Lost`](HoldState::Lost) or
    /// [`Released`](HoldState::Released), never `Held`.
    pub fn wait(&self) -> HoldState {
        wait_until_over(|d| self.wait_once(d))
    }

    /// Like [`wait`](LostSignal::wait), for at most `timeout`: `Held` when the hold
    /// outlasted it.
    pub fn wait_timeout(&self, timeout: Duration) -> HoldState {
        wait_at_most(timeout, |d| self.wait_once(d), || self.state())
    }

    /// The name of the lock.
    pub(crate) fn name(&self) -> &str {
        self.lock.name.as_str()
    }

    /// `None` once the hold is over; while held, how long until its lease runs out
    /// (`None` inside: its release is under way).
    pub(crate) fn held_for(&self) -> Option<Option<Duration>> {
        match self.current() {
            (HoldState::Held, left) => Some(left),
            _ => None,
        }
    }

    /// The channel that disconnects when the hold ends.
    pub(crate) fn end_channel(&self) -> &crossbeam_channel::Receiver<()> {
        self.ending.receiver()
    }

    /// The state, and while held, how long until the lease runs out.
    fn current(&self) -> (HoldState, Option<Duration>) {
        let state = self.lock.state.lock();
        if let Some(h) = state
            .holding
            .as_ref()
            .filter(|h| h.generation == self.generation)
        {
            let now = self.lock.client.backend.now();
            return if h.is_valid(now) {
                (HoldState::Held, Some(h.lease.valid_until() - now))
            } else {
                (HoldState::Lost, None)
            };
        }
        drop(state);
        match self.ending.verdict() {
            Some(false) => (HoldState::Released, None),
            Some(true) => (HoldState::Lost, None),
            // Not ended yet: its release is under way (the wait ends with it).
            None => (HoldState::Held, None),
        }
    }

    /// One sleep: until the hold ends, its lease runs out, or `deadline`. `Some` once the
    /// hold is over.
    fn wait_once(&self, deadline: Option<Instant>) -> Option<HoldState> {
        let (state, left) = self.current();
        let left = match (state, left) {
            (HoldState::Held, Some(left)) => left,
            (HoldState::Held, None) => Duration::MAX,
            (end, _) => return Some(end),
        };
        let until = match (Instant::now().checked_add(left), deadline) {
            (Some(t), Some(d)) => t.min(d),
            (Some(t), None) => t,
            (None, Some(d)) => d,
            (None, None) => Instant::now() + Duration::from_secs(3600),
        };
        // Woken when the hold ends or at `until`: the next look says how.
        self.ending.wait_until(until);
        None
    }
}

/// Sleeps in `wait_once` steps (each: `Some` once the hold is over, `None` after a
/// wake-up) until the hold is over.
pub(crate) fn wait_until_over(
    mut wait_once: impl FnMut(Option<Instant>) -> Option<HoldState>,
) -> HoldState {
    loop {
        if let Some(end) = wait_once(None) {
            return end;
        }
    }
}

/// [`wait_until_over`] for at most `timeout`; then `state()` (`Held` when the hold
/// outlasted it).
pub(crate) fn wait_at_most(
    timeout: Duration,
    mut wait_once: impl FnMut(Option<Instant>) -> Option<HoldState>,
    state: impl Fn() -> HoldState,
) -> HoldState {
    let Some(deadline) = Instant::now().checked_add(timeout) else {
        return wait_until_over(wait_once);
    };
    loop {
        if let Some(end) = wait_once(Some(deadline)) {
            return end;
        }
        if Instant::now() >= deadline {
            return state();
        }
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lock", &self.lock.name)
            .field("state", &self.state())
            .finish()
    }
}
