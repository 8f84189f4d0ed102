//! Deterministic expiry with a manual clock, and the front's error paths driven by the
//! memory backend's fault knobs.

use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_core::{Error, HoldState, Lock, LockClient, RetryPolicy, interrupt_pair};
use dlm_memory::{ManualClock, MemoryBackend};

fn fast_retry() -> RetryPolicy {
    RetryPolicy::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .unwrap()
}

#[test]
fn manual_clock_expires_exactly_at_the_lease_end() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let holder = LockClient::builder(std::sync::Arc::new(backend.clone()))
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let other = LockClient::new(backend);
    let guard = holder.get_lock("job").unwrap().lock().unwrap();
    let lock = other.get_lock("job").unwrap();
    clock.advance(Duration::from_millis(9_999));
    assert!(
        lock.try_lock().unwrap().is_none(),
        "expired before its lease"
    );
    assert_eq!(
        lock.remaining_lease().unwrap(),
        Some(Duration::from_millis(1))
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(lock.remaining_lease().unwrap(), None);
    let next = lock.try_lock().unwrap().expect("not free after the lease");
    assert!(matches!(
        guard.extend(Duration::from_secs(5)),
        Err(Error::LockLost)
    ));
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert!(next.is_held());
}

#[test]
fn fencing_tokens_come_from_one_counter_and_can_be_switched_off() {
    let backend = MemoryBackend::new();
    let c = LockClient::new(backend);
    let tokens: Vec<u64> = (0..3)
        .map(|_| {
            let g = c.get_lock("a").unwrap().lock().unwrap();
            g.fencing_token().unwrap().get()
        })
        .collect();
    assert_eq!(tokens, [1, 2, 3]);
    let b = c.get_lock("b").unwrap().lock().unwrap();
    assert_eq!(
        b.fencing_token().unwrap().get(),
        4,
        "one counter for every name of the store"
    );
    let plain = LockClient::new(MemoryBackend::builder().fencing(false).build());
    assert_eq!(
        plain
            .get_lock("a")
            .unwrap()
            .lock()
            .unwrap()
            .fencing_token()
            .unwrap_err()
            .backend_kind(),
        Some(dlm_core::BackendErrorKind::Unsupported)
    );
}

#[test]
fn a_name_takes_memory_only_while_it_is_held_or_waited_for() {
    // A batch job that locks each item once must not grow the store: 100,000 names, then
    // nothing is left; tokens still increase for a name that comes back.
    let backend = MemoryBackend::new();
    let c = LockClient::builder(std::sync::Arc::new(backend.clone()))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut last = 0;
    for i in 0..100_000 {
        let g = c.get_lock(&format!("order:{i}")).unwrap().lock().unwrap();
        let t = g.fencing_token().unwrap().get();
        assert!(t > last);
        last = t;
    }
    assert_eq!(backend.names(), 0, "released names left state behind");
    let again = c.get_lock("order:7").unwrap().lock().unwrap();
    assert!(again.fencing_token().unwrap().get() > last);
    assert_eq!(backend.names(), 1);
    drop(again);
    // A waiter that gives up leaves its entry until the next look at that name or a sweep.
    let held = c.get_lock("busy").unwrap().lock().unwrap();
    let other = LockClient::new(backend.clone());
    let waited = other
        .get_lock("busy")
        .unwrap()
        .try_lock_timeout(Duration::from_millis(20))
        .unwrap();
    assert!(waited.is_none());
    drop(held);
    assert_eq!(backend.names(), 0);
    // Leases that simply run out are forgotten too.
    let clock = ManualClock::new();
    let timed = MemoryBackend::builder().clock(clock.clone()).build();
    let tc = LockClient::builder(std::sync::Arc::new(timed.clone()))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    for i in 0..1000 {
        tc.get_lock(&format!("expiring:{i}"))
            .unwrap()
            .lock()
            .unwrap()
            .into_hold();
    }
    assert_eq!(timed.names(), 1000);
    clock.advance(Duration::from_secs(2));
    // Each expired name goes when it is next looked at, and all of them when the store
    // has grown to twice what it held at its last sweep (memory stays within twice the
    // names held at once, plus 64).
    let probe = dlm_core::LockName::new("expiring:3").unwrap();
    assert_eq!(timed.inspect(&probe).unwrap(), None);
    assert_eq!(timed.names(), 999);
    for i in 0..1100 {
        tc.get_lock(&format!("fresh:{i}"))
            .unwrap()
            .lock()
            .unwrap()
            .into_hold();
    }
    assert_eq!(timed.names(), 1100, "expired names were not swept");
}

#[test]
fn a_transient_error_is_retried_within_the_wait() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next(3, BackendErrorKind::Unavailable);
    let c = LockClient::builder(std::sync::Arc::new(backend.clone()))
        .retry(fast_retry())
        .build()
        .unwrap();
    let g = c
        .get_lock("x")
        .unwrap()
        .try_lock_timeout(Duration::from_secs(5));
    let g = g.unwrap().expect("not acquired after the errors");
    // The injected failures say the requests were never sent: nothing to clean up. Three
    // failures, then the success.
    assert_eq!(
        backend.faults().calls(),
        4,
        "three failures, then the success"
    );
    g.unlock().unwrap();

    // A reply lost after the store took the lock: the front releases that attempt's hold
    // before the next attempt (which would otherwise find the lock held by itself).
    let calls = backend.faults().calls();
    backend.faults().lose_replies(1);
    let g = c
        .get_lock("x")
        .unwrap()
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("not acquired after the lost reply");
    assert_eq!(
        backend.faults().calls() - calls,
        3,
        "the attempt whose reply was lost, its release, the next attempt"
    );
    g.unlock().unwrap();
}

#[test]
fn try_lock_reports_a_transient_error_instead_of_contention() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next(1, BackendErrorKind::Timeout);
    let c = LockClient::new(backend);
    let e = c.get_lock("x").unwrap().try_lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Timeout));
}

#[test]
fn a_permanent_error_is_returned_at_once() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next(100, BackendErrorKind::Auth);
    let c = LockClient::builder(std::sync::Arc::new(backend.clone()))
        .retry(fast_retry())
        .build()
        .unwrap();
    let e = c.get_lock("x").unwrap().lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth));
    // One attempt; it was never sent, so there is no clean-up release.
    assert_eq!(backend.faults().calls(), 1);
}

#[test]
fn lock_on_a_dead_backend_gives_up_after_the_error_timeout() {
    let backend = MemoryBackend::new();
    backend
        .faults()
        .fail_next(u64::MAX, BackendErrorKind::Unavailable);
    let c = LockClient::builder(std::sync::Arc::new(backend))
        .retry(fast_retry().error_timeout(Duration::from_millis(200)))
        .build()
        .unwrap();
    let t = Instant::now();
    let e = c.get_lock("x").unwrap().lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unavailable));
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_bounded_wait_on_a_failing_backend_returns_the_error_not_none() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next(u64::MAX, BackendErrorKind::Busy);
    let c = LockClient::builder(std::sync::Arc::new(backend))
        .retry(fast_retry())
        .build()
        .unwrap();
    let r = c
        .get_lock("x")
        .unwrap()
        .try_lock_timeout(Duration::from_millis(100));
    assert_eq!(r.unwrap_err().backend_kind(), Some(BackendErrorKind::Busy));
}

#[test]
fn unlock_failure_is_reported_and_drop_does_not_panic() {
    let backend = MemoryBackend::new();
    let c = LockClient::new(backend.clone());
    let lock = c.get_lock("x").unwrap();
    let g = lock.lock().unwrap();
    backend.faults().fail_next(1, BackendErrorKind::Unavailable);
    let e = g.unlock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unavailable));
    // The release failed transiently: it is sent again in the background, and the lock
    // is free once it went through (not at the end of its 30 s lease).
    assert_eq!(c.flush_releases(Duration::from_secs(5)), 0);
    assert!(!lock.is_locked().unwrap());
    let g = lock.lock().unwrap();
    backend.faults().fail_next(1, BackendErrorKind::Unavailable);
    drop(g); // logged, not panicking
}

#[test]
fn an_acquisition_that_lands_after_an_interrupt_is_undone() {
    let backend = MemoryBackend::new();
    backend.faults().delay_calls(Duration::from_millis(300));
    let c = LockClient::new(backend.clone());
    let lock = c.get_lock("x").unwrap();
    let (interrupter, interrupt) = interrupt_pair();
    let t = thread::spawn(move || lock.lock_interruptibly(&interrupt).map(drop));
    // The attempt is in flight (it takes 300 ms); interrupt it.
    while backend.faults().calls() == 0 {
        thread::yield_now();
    }
    interrupter.interrupt();
    assert!(matches!(t.join().unwrap(), Err(Error::Interrupted)));
    backend.faults().delay_calls(Duration::ZERO);
    assert!(
        !c.get_lock("x").unwrap().is_locked().unwrap(),
        "the late acquisition was kept"
    );
}

#[test]
fn waiters_unsubscribe_when_they_stop_waiting() {
    let backend = MemoryBackend::new();
    let holder = LockClient::new(backend.clone());
    let g = holder.get_lock("x").unwrap().lock().unwrap();
    let other = LockClient::new(backend.clone());
    assert!(
        other
            .get_lock("x")
            .unwrap()
            .try_lock_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    assert_eq!(
        backend.watchers("x"),
        0,
        "a timed-out waiter stayed subscribed"
    );
    drop(g);
}

#[test]
fn one_release_wakes_one_of_many_waiters() {
    let backend = MemoryBackend::new();
    let holder = LockClient::new(backend.clone());
    let g = holder.get_lock("x").unwrap().lock().unwrap();
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let lock = LockClient::new(backend.clone()).get_lock("x").unwrap();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    while backend.watchers("x") < 16 {
        thread::yield_now();
    }
    let before = backend.faults().calls();
    g.unlock().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    // Each waiter wakes once, when its turn comes: one attempt and one release each, plus
    // the holder's release; no thundering herd of retries.
    let calls = backend.faults().calls() - before;
    assert!(calls <= 1 + 16 * 2 + 4, "{calls} calls for 16 hand-overs");
    assert_eq!(backend.watchers("x"), 0);
}

#[test]
fn a_manual_clock_moves_the_guards_view_with_the_store() {
    // The guard judges its lease on the backend's clock: after the clock passes the
    // lease, the old guard knows it is no longer held (before, it said `is_held() ==
    // true` while the store had given the lock to someone else).
    let clock = ManualClock::new();
    let backend = std::sync::Arc::new(MemoryBackend::builder().clock(clock.clone()).build());
    let holder = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = holder.get_lock("job").unwrap().lock().unwrap();
    let signal = guard.lost_signal();
    clock.advance(Duration::from_millis(999));
    assert!(guard.is_held() && !guard.is_expired());
    assert_eq!(signal.state(), HoldState::Held);
    clock.advance(Duration::from_millis(1));
    assert!(
        !guard.is_held(),
        "the store's lease is over, the guard's too"
    );
    assert!(guard.is_expired());
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
    assert_eq!(signal.state(), HoldState::Lost);
    assert!(!holder.get_lock("job").unwrap().is_held_by_current_thread());
    let next = LockClient::new(backend.clone())
        .get_lock("job")
        .unwrap()
        .try_lock()
        .unwrap();
    assert!(next.is_some_and(|g| g.is_held()));

    // And real time does not expire a lease the manual clock has not reached.
    let guard = holder.get_lock("other").unwrap().lock().unwrap();
    thread::sleep(Duration::from_millis(1_100)); // more than the lease, in real time
    assert!(
        guard.is_held(),
        "expired on the real clock, not the store's"
    );
    assert!(
        LockClient::new(backend)
            .get_lock("other")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none()
    );
}
