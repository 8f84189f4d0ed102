//! The watchdog judges each renewal of a round when the backend reports it, by that
//! moment on the backend's clock: not by the round's end. A renewal that comes back after
//! its hold's lease ran out is not applied (the hold is lost, as its holder may already
//! have been told) and the hold it renewed at the store is released, so that nobody waits
//! for a hold that nobody owns.
//!
//! The store is dlm-memory on a manual clock; a wrapper reports the first round's two
//! renewals at two moments of that clock, one before the holds' leases end and one after.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, Claim, GroupRequest, Holders, Lease, LockBackend, LockName, OwnerToken,
    Renewal, Renewed,
};
use dlm_core::{HoldState, Lock, LockClient};
use dlm_memory::{ManualClock, MemoryBackend};

const WATCHDOG: Duration = Duration::from_millis(300);

/// dlm-memory on a manual clock whose first renewal round is slow: the clock moves half a
/// lease before the store renews, the first renewal is reported then, and the clock moves
/// past the holds' old leases (not past the new ones) before the others are reported.
#[derive(Debug)]
struct SlowFirstRound {
    inner: MemoryBackend,
    clock: ManualClock,
    first: AtomicBool,
}

impl LockBackend for SlowFirstRound {
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
        self.inner.extend(name, owner, ttl)
    }

    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        if !self.first.swap(false, Ordering::SeqCst) {
            return self.inner.extend_many(renewals, renewed);
        }
        self.clock.advance(WATCHDOG / 2);
        let mut answers = Vec::new();
        self.inner
            .extend_many(renewals, &mut |i, r| answers.push((i, r)));
        let mut answers = answers.into_iter();
        let (i, first) = answers.next().expect("a renewal");
        renewed(i, first);
        // Past the old leases (WATCHDOG after the acquisitions), short of the new ones.
        self.clock.advance(WATCHDOG * 6 / 10);
        for (i, r) in answers {
            renewed(i, r);
        }
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

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn supports(&self, claim: Claim) -> bool {
        self.inner.supports(claim)
    }

    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        self.inner.try_acquire_group(request)
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.inner.extend_group(name, claim, owner, ttl)
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.inner.release_group(name, claim, owner)
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.inner.inspect_group(name, claim)
    }
}

#[test]
fn each_renewal_is_judged_when_it_comes_back_and_a_late_one_is_released() {
    let clock = ManualClock::new();
    let inner = MemoryBackend::builder().clock(clock.clone()).build();
    let backend = Arc::new(SlowFirstRound {
        inner: inner.clone(),
        clock,
        first: AtomicBool::new(true),
    });
    let client = LockClient::builder(backend)
        .watchdog_timeout(WATCHDOG)
        .build()
        .unwrap();
    // A mutex hold and a read hold, in the same first round.
    let early = client.get_lock("early").unwrap().lock().unwrap();
    let late = client.get_rw_lock("late").unwrap().read().unwrap();
    let late_signal = late.lost_signal();
    let start = Instant::now();
    while late_signal.state() == HoldState::Held {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the first round never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reported in time: applied, whatever the round did after it.
    assert!(
        early.is_held(),
        "a renewal reported in time was not applied"
    );
    assert_eq!(early.lost_signal().state(), HoldState::Held);
    // Reported after its lease ended here: lost, and released at the store (where it was
    // renewed, until after the manual clock's present).
    assert_eq!(late_signal.state(), HoldState::Lost);
    let names = LockName::new("late").unwrap();
    let start = Instant::now();
    while !inner.inspect_group(&names, Claim::Read).unwrap().is_free() {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the late renewal's hold was left at the store"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(late);
    early.unlock().unwrap();
}
