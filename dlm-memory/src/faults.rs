//! The fault knobs of a store: calls that fail, replies lost after the call took effect,
//! slow calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind};
use parking_lot::Mutex;

/// Fault knobs of a [`MemoryBackend`](crate::MemoryBackend), to exercise the error paths of code that uses
/// locks. Every backend call (except `watch`) passes through them.
#[derive(Debug, Default)]
pub struct Faults {
    fail_next: Mutex<Option<(u64, BackendErrorKind)>>,
    /// Replies still to lose (an atomic: every call reads it).
    lose_replies: AtomicU64,
    delay: Mutex<Duration>,
    calls: AtomicU64,
}

impl Faults {
    /// Makes the next `n` calls fail with an error of `kind`.
    pub fn fail_next(&self, n: u64, kind: BackendErrorKind) {
        *self.fail_next.lock() = (n > 0).then_some((n, kind));
    }

    /// Makes the next `n` calls take effect and then fail with a
    /// [`Timeout`](BackendErrorKind::Timeout), as when a reply is lost on its way back:
    /// the store has done what was asked, the caller does not know it.
    pub fn lose_replies(&self, n: u64) {
        self.lose_replies.store(n, Ordering::SeqCst);
    }

    /// Makes every call take at least `delay` (zero: no delay), like a slow network.
    pub fn delay_calls(&self, delay: Duration) {
        *self.delay.lock() = delay;
    }

    /// How many calls the store has received (failed ones included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub(crate) fn before_call(&self) -> Result<(), BackendError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let delay = *self.delay.lock();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut fail = self.fail_next.lock();
        if let Some((n, kind)) = *fail {
            *fail = (n > 1).then_some((n - 1, kind));
            return Err(BackendError::new(kind, "injected fault").never_sent());
        }
        Ok(())
    }

    pub(crate) fn after_call(&self) -> Result<(), BackendError> {
        if self.lose_replies.load(Ordering::Relaxed) > 0
            && self
                .lose_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                "injected fault: the reply was lost (the call took effect)",
            ));
        }
        Ok(())
    }
}
