//! Clocks the memory backend measures expiry with.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A monotonic clock. Expiry in the memory backend follows it.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real monotonic clock, [`Instant::now`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to: expiry tests become deterministic, without
/// sleeping. Cloning shares the clock.
///
/// The store and the guards agree on it: the memory backend reports it as its clock
/// ([`LockBackend::now`](dlm_core::backend::LockBackend::now)), so a guard whose lease the clock
/// has passed says [`is_held`](dlm_core::LockGuard::is_held) `false` and its
/// [`LostSignal`](dlm_core::LostSignal) says lost, while real time passing expires
/// nothing. Waits (`try_lock_timeout`) and the watchdog's schedule stay in real time.
///
/// ```
/// use std::time::Duration;
/// use dlm_memory::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now() - t0, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl ManualClock {
    /// A clock standing at the current instant.
    pub fn new() -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Moves the clock forward by `by`.
    ///
    /// # Panics
    /// If the clock would overflow `Instant`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now = now.checked_add(by).expect("manual clock overflow");
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}
