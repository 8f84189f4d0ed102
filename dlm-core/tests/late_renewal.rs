//! A renewal whose reply comes back after the hold's lease ran out here does not bring the
//! hold back to life: the holder may already have been told that it lost the lock
//! (`is_held`, a lost signal) and stopped. Seen under load on Redis
//! (`hints_and_watchdog.rs::a_paused_server_makes_renewal_fail_and_the_guard_reports_the_loss`:
//! the lost signal fired, the server resumed within the drift allowance, the watchdog's
//! retried renewal succeeded, and `is_held` said `true` again).
//!
//! The backend is dlm-memory on a manual clock behind a wrapper whose extension reaches the
//! store at once but whose reply takes two seconds (the clock is advanced before it
//! returns).
use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::{Acquire, BackendError, Lease, LockBackend, LockName, OwnerToken};
use dlm_core::{Error, HoldState, Lock, LockClient};
use dlm_memory::{ManualClock, MemoryBackend};

#[derive(Debug)]
struct LateReply {
    inner: MemoryBackend,
    clock: ManualClock,
}

impl LockBackend for LateReply {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.inner.try_acquire(name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let extended = self.inner.extend(name, owner, ttl);
        self.clock.advance(Duration::from_secs(2)); // the reply is slow
        extended
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.inner.release(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.inner.force_release(name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.inner.inspect(name)
    }

    fn now(&self) -> std::time::Instant {
        self.inner.now()
    }
}

#[test]
fn an_extension_answered_after_the_lease_ran_out_leaves_the_hold_lost() {
    let clock = ManualClock::new();
    let backend = Arc::new(LateReply {
        inner: MemoryBackend::builder().clock(clock.clone()).build(),
        clock,
    });
    let client = LockClient::builder(backend)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = client.get_lock("job").unwrap().lock().unwrap();
    let signal = guard.lost_signal();
    // The store extends the lock to 10 s at once; the reply comes 2 s later, after the
    // 1 s lease ended here.
    assert!(matches!(
        guard.extend(Duration::from_secs(10)),
        Err(Error::LockLost)
    ));
    assert!(!guard.is_held(), "the hold came back to life");
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
    assert_eq!(signal.wait_timeout(Duration::ZERO), HoldState::Lost);
}
