//! The closure helpers: `with_lock` and `try_with_lock` release on return and on panic,
//! and report a lease lost during the closure.
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use dlm_core::{Error, Lock, LockClient};
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
    assert!(r.expect("free now").is_some());
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
