//! Conformance cases: leases, the watchdog and the lost signal (expiry, extension,
//! renewal up to the maximum hold, a lost lock signalled, a released one not).

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use dlm_core::{Error, HoldState, Lock, LockClient};

use super::{client, client_with_lease};
use crate::{Fixture, unique_name};

/// A lock whose holder neither releases nor extends is free after its lease.
pub fn expiry_frees_the_lock(f: &dyn Fixture) {
    let name = unique_name("expiry");
    let lease = Duration::from_millis(300);
    let holder = client_with_lease(f, lease).get_lock(&name).unwrap();
    let guard = holder.lock().unwrap();
    let t = Instant::now();
    let other = client(f).get_lock(&name).unwrap();
    let got = other.try_lock_timeout(Duration::from_secs(10)).unwrap();
    assert!(got.is_some(), "the lease never expired");
    assert!(
        t.elapsed() >= lease - Duration::from_millis(50),
        "acquired after {:?}, before the lease of {lease:?} ran out",
        t.elapsed()
    );
    assert!(guard.is_expired());
    assert!(!guard.is_held());
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert!(
        other.is_locked().unwrap(),
        "the late unlock freed the new holder's lock"
    );
}

/// `extend` keeps the lock beyond its original lease.
pub fn extend_prolongs_the_lease(f: &dyn Fixture) {
    let name = unique_name("extend");
    let holder = client_with_lease(f, Duration::from_millis(300))
        .get_lock(&name)
        .unwrap();
    let guard = holder.lock().unwrap();
    let before = guard.valid_until();
    guard.extend(Duration::from_secs(30)).unwrap();
    assert!(guard.valid_until() > before + Duration::from_secs(20));
    let other = client(f).get_lock(&name).unwrap();
    assert!(
        other
            .try_lock_timeout(Duration::from_millis(800))
            .unwrap()
            .is_none(),
        "the extended lock expired with its original lease"
    );
    assert!(holder.remaining_lease().unwrap().unwrap() > Duration::from_secs(20));
    guard.unlock().unwrap();
}

/// Extending after the lease ran out fails with `LockLost` and never re-creates the lock.
pub fn extend_after_expiry_fails_and_does_not_recreate(f: &dyn Fixture) {
    let name = unique_name("extend-late");
    let lease = Duration::from_millis(200);
    let holder = client_with_lease(f, lease).get_lock(&name).unwrap();
    let guard = holder.lock().unwrap();
    // Wait for the expiry by observing it, not by sleeping a guess.
    let deadline = Instant::now() + Duration::from_secs(10);
    while holder.is_locked().unwrap() {
        assert!(Instant::now() < deadline, "the lease never expired");
        thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(
        guard.extend(Duration::from_secs(10)),
        Err(Error::LockLost)
    ));
    assert!(!guard.is_held());
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
    assert!(
        !holder.is_locked().unwrap(),
        "extend re-created an expired lock"
    );
    // And after someone else took it, extend does not touch their lock.
    let other = client(f).get_lock(&name).unwrap();
    let theirs = other.lock().unwrap();
    assert!(matches!(
        guard.extend(Duration::from_secs(10)),
        Err(Error::LockLost)
    ));
    assert!(theirs.is_held());
    theirs.unlock().unwrap();
}

/// A guard that is leaked (never dropped) still frees the lock when its lease ends.
pub fn leaked_guard_expires(f: &dyn Fixture) {
    let name = unique_name("leak");
    let lease = Duration::from_millis(300);
    let lock = client_with_lease(f, lease).get_lock(&name).unwrap();
    std::mem::forget(lock.lock().unwrap());
    let other = client(f).get_lock(&name).unwrap();
    assert!(other.try_lock().unwrap().is_none());
    assert!(
        other
            .try_lock_timeout(Duration::from_secs(10))
            .unwrap()
            .is_some(),
        "a leaked guard kept the lock beyond its lease"
    );
}

fn watchdog_client(f: &dyn Fixture, timeout: Duration) -> LockClient {
    LockClient::builder(f.backend())
        .watchdog_timeout(timeout)
        .build()
        .unwrap()
}

/// Without an explicit lease, the watchdog keeps a lock for three times its timeout (and
/// more) while the holder works.
pub fn watchdog_keeps_the_lock_while_held(f: &dyn Fixture) {
    let name = unique_name("watchdog");
    let timeout = Duration::from_millis(300);
    let holder = watchdog_client(f, timeout).get_lock(&name).unwrap();
    assert_eq!(holder.lease(), None);
    let guard = holder.lock().unwrap();
    let other = client(f).get_lock(&name).unwrap();
    assert!(
        other.try_lock_timeout(timeout * 4).unwrap().is_none(),
        "the watchdog let the lock expire"
    );
    assert!(guard.is_held());
    let remaining = other.remaining_lease().unwrap().expect("held");
    assert!(
        remaining <= timeout,
        "lease {remaining:?} longer than the timeout"
    );
    guard.unlock().unwrap();
    // Unlocked: free at once, and no renewal brings it back.
    assert!(
        other.try_lock().unwrap().is_some(),
        "still held after unlock"
    );
}

/// Renewal ends after the client's maximum hold time; the lease then runs out. This bounds
/// a guard that is leaked (never dropped): here it is also `mem::forget`-ed, with its
/// client and handle gone.
pub fn watchdog_respects_max_hold(f: &dyn Fixture) {
    let name = unique_name("max-hold");
    let c = LockClient::builder(f.backend())
        .watchdog_timeout(Duration::from_millis(200))
        .max_hold(Duration::from_millis(500))
        .build()
        .unwrap();
    let guard = c.get_lock(&name).unwrap().lock().unwrap();
    let leaked = c.get_lock(&unique_name("leaked")).unwrap();
    let leaked_name = leaked.name().to_owned();
    std::mem::forget(leaked.lock().unwrap());
    drop((c, leaked));
    let t = Instant::now();
    let other = client(f).get_lock(&name).unwrap();
    let got = other.try_lock_timeout(Duration::from_secs(10)).unwrap();
    assert!(got.is_some(), "renewed beyond the maximum hold");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "expired after {:?}, before the maximum hold",
        t.elapsed()
    );
    assert!(!guard.is_held());
    let leaked = client(f).get_lock(&leaked_name).unwrap();
    assert!(
        leaked
            .try_lock_timeout(Duration::from_secs(5))
            .unwrap()
            .is_some(),
        "a leaked guard was renewed beyond the maximum hold"
    );
}

/// A lock that disappears under a watchdog-renewed holder is reported: the guard's lost
/// signal says `Lost` (and wakes a thread waiting on it), `is_held` turns false,
/// `ensure_held` fails.
pub fn a_lost_lock_is_signalled(f: &dyn Fixture) {
    let name = unique_name("lost");
    let guard = watchdog_client(f, Duration::from_millis(300))
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let signal = guard.lost_signal();
    // Held across several renewals (every 100 ms).
    assert_eq!(
        signal.wait_timeout(Duration::from_millis(350)),
        HoldState::Held
    );
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || done_tx.send(signal.wait()).unwrap())
    };
    assert!(client(f).get_lock(&name).unwrap().force_unlock().unwrap());
    let end = done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the loss was not signalled");
    waiter.join().unwrap();
    assert_eq!(end, HoldState::Lost);
    assert!(signal.is_lost());
    assert_eq!(guard.lost_signal().state(), HoldState::Lost);
    assert!(!guard.is_held());
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert_eq!(signal.state(), HoldState::Lost, "lost stays lost");
}

/// The end of a hold by its holder reads as `Released`, never as lost: not while an
/// inner re-entrant hold is given back, but when the last one is; a fixed lease that runs
/// out before the holder lets go reads as `Lost`.
pub fn a_released_lock_is_not_reported_lost(f: &dyn Fixture) {
    let lock = client(f).get_lock(&unique_name("released")).unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let signal = inner.lost_signal();
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || done_tx.send(signal.wait()).unwrap())
    };
    inner.unlock().unwrap();
    assert_eq!(signal.state(), HoldState::Held, "an outer hold remains");
    assert!(matches!(
        done_rx.recv_timeout(Duration::from_millis(100)),
        Err(RecvTimeoutError::Timeout)
    ));
    outer.unlock().unwrap();
    let end = done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the release was not signalled");
    waiter.join().unwrap();
    assert_eq!(end, HoldState::Released);
    assert!(!signal.is_lost());

    // A fixed lease that runs out: lost, seen by a waiter without any renewal or I/O.
    let short = client_with_lease(f, Duration::from_millis(200))
        .get_lock(&unique_name("expires"))
        .unwrap();
    let guard = short.lock().unwrap();
    let signal = guard.lost_signal();
    let start = Instant::now();
    assert_eq!(signal.wait_timeout(Duration::from_secs(5)), HoldState::Lost);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // (The server's key may outlive the local validity by the drift allowance: the
    // release may still find it.)
    let _ = guard.unlock();
    assert_eq!(signal.state(), HoldState::Lost, "lost stays lost");
}
