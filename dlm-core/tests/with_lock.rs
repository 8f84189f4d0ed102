//! The closure helpers: `with_lock` and `try_with_lock` release on return and on panic,
//! report a lease lost during the closure, and hand back the result of work that ran
//! under the lock even when only the release fails.
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use dlm_core::{BackendErrorKind, Error, Lock, LockClient};
use dlm_memory::MemoryBackend;

#[test]
fn with_lock_holds_during_the_closure_and_releases_after() {
    let backend = MemoryBackend::new();
    let a = LockClient::new(backend.clone());
    let b = LockClient::new(backend);
    let lock = a.get_lock("job").unwrap();
    let other = b.get_lock("job").unwrap();
    let seen = lock
        .with_lock(|guard| {
            assert!(guard.is_held());
            assert!(
                other.try_lock().unwrap().is_none(),
                "held during the closure"
            );
            "done"
        })
        .unwrap();
    assert_eq!(seen, "done");
    assert!(!lock.is_locked().unwrap(), "released after the closure");
}

#[test]
fn a_panic_in_the_closure_releases_the_lock() {
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.get_lock("panics").unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        lock.with_lock(|_| panic!("the work failed")).unwrap();
    }));
    assert!(outcome.is_err());
    assert!(!lock.is_locked().unwrap(), "released during the unwind");
    assert_eq!(lock.hold_count(), 0);
}

#[test]
fn try_with_lock_does_not_run_the_closure_when_the_lock_is_taken() {
    let backend = MemoryBackend::new();
    let a = LockClient::new(backend.clone());
    let b = LockClient::new(backend);
    let held = a.get_lock("taken").unwrap().lock().unwrap();
    let mut ran = false;
    let r = b
        .get_lock("taken")
        .unwrap()
        .try_with_lock(Duration::from_millis(20), |_| ran = true)
        .unwrap();
    assert!(r.is_none() && !ran);
    drop(held);
    let r = b
        .get_lock("taken")
        .unwrap()
        .try_with_lock(Duration::ZERO, |g| g.fencing_token())
        .unwrap();
    assert!(r.expect("free now").is_ok());
}

#[test]
fn a_lease_lost_during_the_closure_is_reported() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let lock = client.get_lock("lost").unwrap();
    let err = lock
        .with_lock(|_| {
            assert!(backend.expire_now("lost"));
        })
        .expect_err("the lease was lost meanwhile");
    assert!(matches!(err, Error::LockLost), "{err:?}");
}

#[test]
fn work_that_ran_under_the_lock_keeps_its_result_when_only_the_release_fails() {
    let backend = MemoryBackend::new();
    // Before, the failed release was the result and the retry ran the work again once
    // the lease had run out (5 s).
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = client.get_lock("run-once").unwrap();
    let mut runs = 0;
    // A "run once" job that retries transient errors, as a caller would write it.
    let outcome = loop {
        match lock.with_lock(|guard| {
            runs += 1;
            assert!(guard.is_held());
            // The release after the work cannot reach the store.
            backend.faults().fail_next(1, BackendErrorKind::Unavailable);
            "done"
        }) {
            Err(e) if e.is_transient() && runs < 2 => continue,
            other => break other,
        }
    };
    assert_eq!(outcome.unwrap(), "done");
    assert_eq!(runs, 1, "the work ran once");
    // The failed release left the lock to its lease.
    assert!(lock.is_locked().unwrap());
    assert_eq!(lock.hold_count(), 0);
    assert!(lock.force_unlock().unwrap());

    let r = lock.try_with_lock(Duration::ZERO, |_| {
        backend.faults().fail_next(1, BackendErrorKind::Timeout);
        7
    });
    assert_eq!(r.unwrap(), Some(7));
}

#[test]
fn a_lease_found_lost_during_the_work_is_reported_even_when_the_release_fails() {
    let backend = MemoryBackend::new();
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let lock = client.get_lock("lost-then-unreachable").unwrap();
    let err = lock
        .with_lock(|guard| {
            assert!(backend.expire_now("lost-then-unreachable"));
            assert!(matches!(
                guard.extend(Duration::from_secs(60)),
                Err(Error::LockLost)
            ));
            backend.faults().fail_next(1, BackendErrorKind::Unavailable);
        })
        .expect_err("the work was not exclusive");
    assert!(matches!(err, Error::LockLost), "{err:?}");
}
