//! A watchdog renewal that crosses its holder's release is not released a second time by
//! the watchdog: the holder's own release takes care of the store (it deletes a renewal
//! applied before it; one applied after it finds nothing, as renewals never re-create a
//! hold). A second release from the watchdog could reach the store first, and the
//! holder's `unlock` would then find nothing and report a lock it held to the end as lost.
//! Seen once in CI on Redis Cluster, where a renewal round takes long enough to cross an
//! `unlock`.
//!
//! The backend is dlm-memory behind a wrapper that holds the renewal's reply back until
//! the holder's release has started, and holds that release back until a second release
//! of the same token arrives (or, when none comes, half a second).
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::Mutex;

use dlm_core::backend::{Acquire, BackendError, Lease, LockBackend, LockName, OwnerToken};
use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;

#[derive(Debug)]
struct Crossing {
    inner: MemoryBackend,
    /// Told when a renewal has been applied at the store (its reply held back).
    renewed: Sender<()>,
    /// Told when the first release starts: the held-back renewal reply goes back then.
    release_started: (Sender<()>, Receiver<()>),
    /// Told by every release after the first.
    later_release: (Sender<()>, Receiver<()>),
    releases: Mutex<u32>,
}

impl LockBackend for Crossing {
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
        let _ = self.renewed.send(());
        let _ = self.release_started.1.recv_timeout(Duration::from_secs(10));
        extended
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let first = {
            let mut n = self.releases.lock();
            *n += 1;
            *n == 1
        };
        if first {
            self.release_started.0.send(()).unwrap();
            // A release of the same token from elsewhere would arrive within
            // microseconds of the renewal's reply.
            let _ = self
                .later_release
                .1
                .recv_timeout(Duration::from_millis(500));
        } else {
            self.later_release.0.send(()).unwrap();
        }
        self.inner.release(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.inner.force_release(name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.inner.inspect(name)
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }
}

#[test]
fn a_renewal_that_crosses_the_release_leaves_the_release_to_its_holder() {
    let (renewed, renewal_applied) = unbounded();
    let backend = Arc::new(Crossing {
        inner: MemoryBackend::new(),
        renewed,
        release_started: bounded(1),
        later_release: unbounded(),
        releases: Mutex::new(0),
    });
    let client = LockClient::builder(backend.clone())
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = client.get_lock("job").unwrap();
    let guard = lock.lock().unwrap();
    // The first renewal is applied at the store; its reply waits for the release.
    renewal_applied
        .recv_timeout(Duration::from_secs(10))
        .expect("the watchdog renewed the lock");
    guard
        .unlock()
        .expect("the holder kept the lock to the end: its release must find it");
    assert_eq!(*backend.releases.lock(), 1, "the hold was released twice");
    assert!(
        client
            .get_lock("job")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some(),
        "the lock stayed held after its release"
    );
}
