use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holders, Lease,
    LockBackend, LockName, OwnerToken, Renewal, Renewed, Watch,
};

/// Wraps a backend and makes its requests fail as a network would, at the client's edge:
/// [`lose_replies`](FaultyBackend::lose_replies) lets the store apply a request and loses
/// its answer (the caller gets a [`Timeout`](BackendErrorKind::Timeout)), and
/// [`fail_next`](FaultyBackend::fail_next) fails requests before they are sent (an
/// [`Unavailable`](BackendErrorKind::Unavailable) that says it was never sent). The store
/// is the real one: what a lost reply leaves there is what the caller must undo.
///
/// Inspection (`inspect`, `inspect_group`), `watch` and the other local calls pass
/// through untouched, so a test sees the store as it is.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn LockBackend>,
    faults: Mutex<Faults>,
}

#[derive(Debug, Default)]
struct Faults {
    lose: usize,
    fail: usize,
}

impl FaultyBackend {
    /// `inner`, with no fault until one is asked for.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        FaultyBackend {
            inner,
            faults: Mutex::new(Faults::default()),
        }
    }

    /// The next `n` requests are applied by the store, and their replies lost.
    pub fn lose_replies(&self, n: usize) {
        self.faults.lock().lose = n;
    }

    /// The next `n` requests fail before they are sent.
    pub fn fail_next(&self, n: usize) {
        self.faults.lock().fail = n;
    }

    /// Faults still to come: (replies to lose, requests to fail).
    pub fn pending(&self) -> (usize, usize) {
        let f = self.faults.lock();
        (f.lose, f.fail)
    }

    /// Runs one request through the faults.
    fn request<T>(
        &self,
        call: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        {
            let mut f = self.faults.lock();
            if f.fail > 0 {
                f.fail -= 1;
                return Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    "injected: the request could not be sent",
                )
                .never_sent());
            }
        }
        let answer = call();
        let mut f = self.faults.lock();
        if f.lose > 0 {
            f.lose -= 1;
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                "injected: the reply was lost (the request was applied)",
            ));
        }
        answer
    }
}

impl LockBackend for FaultyBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.request(|| self.inner.try_acquire(name, owner, ttl))
    }

    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.request(|| self.inner.try_acquire_fenced(name, owner, ttl))
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.request(|| self.inner.extend(name, owner, ttl))
    }

    /// One request for the whole round: a fault takes every renewal of it.
    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        let failed = {
            let mut f = self.faults.lock();
            if f.fail > 0 {
                f.fail -= 1;
                true
            } else {
                false
            }
        };
        if failed {
            for i in 0..renewals.len() {
                renewed(
                    i,
                    Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        "injected: the request could not be sent",
                    )
                    .never_sent()),
                );
            }
            return;
        }
        // A lost reply loses the whole round's: decided before it is sent, and each
        // renewal's report forwarded (or replaced) as it comes, as the contract asks.
        let lost = {
            let mut f = self.faults.lock();
            let lost = f.lose > 0;
            f.lose = f.lose.saturating_sub(1);
            lost
        };
        self.inner.extend_many(renewals, &mut |i, r| {
            if lost {
                renewed(
                    i,
                    Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        "injected: the reply was lost (the request was applied)",
                    )),
                );
            } else {
                renewed(i, r);
            }
        });
    }

    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.request(|| self.inner.fence(name, owner))
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.request(|| self.inner.release(name, owner))
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.request(|| self.inner.force_release(name))
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.inner.inspect(name)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.inner.watch(name)
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner.wake_pending(name)
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn check_name(&self, name: &LockName) -> Result<(), dlm_core::InvalidArgument> {
        self.inner.check_name(name)
    }

    fn check_claim(&self, claim: Claim) -> Result<(), dlm_core::InvalidArgument> {
        self.inner.check_claim(claim)
    }

    fn supports(&self, claim: Claim) -> bool {
        self.inner.supports(claim)
    }

    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        self.request(|| self.inner.try_acquire_group(request))
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.request(|| self.inner.extend_group(name, claim, owner, ttl))
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.request(|| self.inner.release_group(name, claim, owner))
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.request(|| self.inner.fence_group(name, claim, owner))
    }

    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.inner.watch_group(name, claim)
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.request(|| self.inner.relabel_group(name, claim, owner, label))
    }

    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.inner.observe_group(name, claim)
    }

    fn supports_elections(&self) -> bool {
        self.inner.supports_elections()
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.request(|| self.inner.downgrade(name, writer, reader, ttl))
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.request(|| self.inner.force_release_group(name, claim))
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.inner.inspect_group(name, claim)
    }
}
