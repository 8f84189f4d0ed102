use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use dlm_core::backend::{
    Acquire, BackendError, Claim, FencingToken, GroupRequest, Holders, Lease, LockBackend,
    LockName, OwnerToken, Renewal, Renewed, Watch,
};

/// Wraps a backend and counts the calls that reach it (`watch`, `watch_group` and
/// `supports` excluded: they are not requests to the store), the acquisitions that asked
/// for the fencing token with them ([`LockBackend::try_acquire_fenced`], or a fenced
/// [`GroupRequest`]), and records each renewal round ([`LockBackend::extend_many`]): how
/// many holds of each kind it renewed and how long it took. Every call, the groups'
/// included, is forwarded.
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn LockBackend>,
    calls: AtomicU64,
    acquisitions: AtomicU64,
    fenced: AtomicU64,
    extends: AtomicU64,
    rounds: Mutex<Vec<Round>>,
}

/// One call of [`LockBackend::extend_many`] seen by a [`CountingBackend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// How many holds it renewed (or tried to).
    pub holds: usize,
    /// How many of them were the mutex's ([`Claim::Exclusive`]); the others were
    /// permits, read or write holds.
    pub exclusive: usize,
    /// How many of them were renewed.
    pub renewed: usize,
    /// How long the call took.
    pub took: Duration,
}

impl CountingBackend {
    /// Counts the calls to `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        CountingBackend {
            inner,
            calls: AtomicU64::new(0),
            acquisitions: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            extends: AtomicU64::new(0),
            rounds: Mutex::new(Vec::new()),
        }
    }

    /// The renewal rounds so far, in order.
    pub fn rounds(&self) -> Vec<Round> {
        self.rounds.lock().clone()
    }

    /// Calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The acquisition attempts so far, of every kind ([`LockBackend::try_acquire`],
    /// [`LockBackend::try_acquire_fenced`], [`LockBackend::try_acquire_group`]; counted in
    /// [`calls`](Self::calls) too): the clean-up releases of failed attempts, and releases
    /// sent again in the background, are not among them.
    pub fn acquisitions(&self) -> u64 {
        self.acquisitions.load(Ordering::SeqCst)
    }

    /// The calls so far that were [`LockBackend::try_acquire_fenced`] (counted in
    /// [`calls`](Self::calls) too).
    pub fn fenced_acquisitions(&self) -> u64 {
        self.fenced.load(Ordering::SeqCst)
    }

    /// The renewals sent one at a time ([`LockBackend::extend`] and
    /// [`LockBackend::extend_group`], counted in [`calls`](Self::calls) too): a guard's
    /// [`extend`](dlm_core::LockGuard::extend), never the watchdog, which renews in rounds.
    pub fn single_extends(&self) -> u64 {
        self.extends.load(Ordering::SeqCst)
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
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(name, owner, ttl)
    }

    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.count();
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        self.fenced.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire_fenced(name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.count();
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(name, owner, ttl)
    }

    /// One call, however many renewals it carries.
    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        self.count();
        let start = Instant::now();
        let mut ok = 0;
        self.inner.extend_many(renewals, &mut |i, result| {
            if matches!(result, Ok(Some(_))) {
                ok += 1;
            }
            renewed(i, result);
        });
        self.rounds.lock().push(Round {
            holds: renewals.len(),
            exclusive: renewals
                .iter()
                .filter(|r| r.claim == Claim::Exclusive)
                .count(),
            renewed: ok,
            took: start.elapsed(),
        });
    }

    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.count();
        self.inner.fence(name, owner)
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
        self.count();
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        if request.fenced {
            self.fenced.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.try_acquire_group(request)
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.count();
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend_group(name, claim, owner, ttl)
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.count();
        self.inner.release_group(name, claim, owner)
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.count();
        self.inner.fence_group(name, claim, owner)
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
        self.count();
        self.inner.relabel_group(name, claim, owner, label)
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
        self.count();
        self.inner.downgrade(name, writer, reader, ttl)
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.count();
        self.inner.force_release_group(name, claim)
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.count();
        self.inner.inspect_group(name, claim)
    }
}
