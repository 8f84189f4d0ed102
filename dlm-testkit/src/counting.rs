use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlm_core::{Acquire, BackendError, Lease, LockBackend, LockName, OwnerToken, Watch};

/// Wraps a backend and counts the calls that reach it (`watch` excluded: it is not a
/// request to the store).
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn LockBackend>,
    calls: AtomicU64,
}

impl CountingBackend {
    /// Counts the calls to `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        CountingBackend {
            inner,
            calls: AtomicU64::new(0),
        }
    }

    /// Calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl LockBackend for CountingBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.count();
        self.inner.try_acquire(name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.count();
        self.inner.extend(name, owner, ttl)
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.count();
        self.inner.release(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.count();
        self.inner.force_release(name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.count();
        self.inner.inspect(name)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.inner.watch(name)
    }

    /// Not counted: no request.
    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner.wake_pending(name)
    }
}
