//! A request of a failed attempt that reaches the store late can only touch that
//! attempt's key: the front gives each attempt its own owner token.
//!
//! The backend is dlm-memory behind a wrapper that plays a lost reply: the first
//! acquisition lands in the store but the call fails with a timeout, and the backend's
//! undo of it (as Redlock undoes a failed round, with requests that may still be in flight)
//! is held back until the test lets it through, after the acquisition that won. With one
//! token for every attempt of an acquisition, that late undo deleted the winner's key: the
//! holder believed it held the lock while another client took it.
use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Lease, LockBackend, LockName, OwnerToken, Watch,
};
use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;
use parking_lot::Mutex;

/// dlm-memory whose first acquisition's reply is lost, and whose undo of it is late.
#[derive(Debug)]
struct LostReply {
    inner: MemoryBackend,
    lost_one: Mutex<bool>,
    late_undo: Mutex<Option<(LockName, OwnerToken)>>,
}

impl LostReply {
    fn new() -> Arc<LostReply> {
        Arc::new(LostReply {
            inner: MemoryBackend::new(),
            lost_one: Mutex::new(false),
            late_undo: Mutex::new(None),
        })
    }

    /// The held-back undo reaches the store now.
    fn deliver_late_undo(&self) {
        let (name, owner) = self.late_undo.lock().take().expect("an undo was held back");
        let _ = self.inner.release(&name, &owner).unwrap();
    }
}

impl LockBackend for LostReply {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let outcome = self.inner.try_acquire(name, owner, ttl)?;
        let mut lost_one = self.lost_one.lock();
        if !*lost_one && matches!(outcome, Acquire::Acquired(_)) {
            // Landed, but the reply is lost; the backend's undo of it is on its way.
            *lost_one = true;
            *self.late_undo.lock() = Some((name.clone(), *owner));
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                "the reply was lost",
            ));
        }
        Ok(outcome)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.inner.extend(name, owner, ttl)
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

    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.inner.watch(name)
    }
}

#[test]
fn a_late_undo_of_a_failed_attempt_leaves_the_winning_attempts_key_alone() {
    let backend = LostReply::new();
    let holder = LockClient::new(backend.clone());
    let guard = holder
        .get_lock("late-undo")
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("the retry after the lost reply wins");
    // The undo of the first attempt arrives after the second attempt won.
    backend.deliver_late_undo();
    let name = LockName::new("late-undo").unwrap();
    assert!(
        backend.inspect(&name).unwrap().is_some(),
        "the late undo deleted the winner's key"
    );
    let other = LockClient::new(backend.clone());
    assert!(
        other
            .get_lock("late-undo")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none(),
        "another client got a lock that is held"
    );
    assert!(guard.is_held());
    guard.unlock().unwrap();
    assert_eq!(backend.inspect(&name).unwrap(), None, "nothing left behind");
}
