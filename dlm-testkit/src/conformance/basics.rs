//! Conformance cases: mutual exclusion and the basics (attempts and deadlines, ownership
//! and release, re-entrancy, introspection, bad input).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{LockName, OwnerToken};
use dlm_core::{Error, Lock, LockClient};

use super::{PROMPT, assert_still_blocked, client, client_with_lease};
use crate::history::History;
use crate::{CountingBackend, Fixture, unique_name};

/// 4 clients x 2 threads increment a counter with a separate read and write (lost updates
/// appear without mutual exclusion), a flag detects overlapping critical sections, and the
/// [`History`] checker finds no overlapping holds and no token out of order.
pub fn mutual_exclusion_no_lost_updates(f: &dyn Fixture) {
    const CLIENTS: usize = 4;
    const THREADS_PER_CLIENT: usize = 2;
    const ROUNDS: u64 = 100;
    let name = unique_name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS * THREADS_PER_CLIENT));
    let history = Arc::new(History::new());
    let mut handles = Vec::new();
    for c in 0..CLIENTS {
        let lock = client(f).get_lock(&name).unwrap();
        for t in 0..THREADS_PER_CLIENT {
            let (lock, counter, inside, start, history) = (
                lock.clone(),
                counter.clone(),
                inside.clone(),
                start.clone(),
                history.clone(),
            );
            handles.push(thread::spawn(move || {
                start.wait();
                for _ in 0..ROUNDS {
                    let guard = lock.lock().unwrap();
                    let hold = history.begin(format!("client {c} thread {t}"), &guard);
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two holders inside the critical section"
                    );
                    let v = counter.load(Ordering::SeqCst);
                    thread::yield_now();
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    history.end(hold, &guard);
                    guard.unlock().unwrap();
                }
            }));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        (CLIENTS * THREADS_PER_CLIENT) as u64 * ROUNDS,
        "lost updates: mutual exclusion failed"
    );
    let report = history.check();
    assert_eq!(
        report.holds as u64,
        (CLIENTS * THREADS_PER_CLIENT) as u64 * ROUNDS
    );
    report.assert_clean();
}

/// `try_lock` on a held lock returns `Ok(None)` at once.
pub fn try_lock_never_blocks(f: &dyn Fixture) {
    let name = unique_name("trylock");
    let _held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let other = client(f).get_lock(&name).unwrap();
    let t = Instant::now();
    assert!(other.try_lock().unwrap().is_none());
    assert!(other.try_lock_timeout(Duration::ZERO).unwrap().is_none());
    assert!(
        t.elapsed() < PROMPT,
        "try_lock blocked for {:?}",
        t.elapsed()
    );
}

/// `try_lock_timeout` waits about its timeout, then gives up with `Ok(None)`.
pub fn try_lock_timeout_honours_its_timeout(f: &dyn Fixture) {
    let name = unique_name("timeout");
    let _held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let other = client(f).get_lock(&name).unwrap();
    let timeout = Duration::from_millis(300);
    let t = Instant::now();
    assert!(other.try_lock_timeout(timeout).unwrap().is_none());
    let took = t.elapsed();
    assert!(took >= timeout, "gave up early, after {took:?}");
    assert!(took < timeout + PROMPT, "overran its timeout: {took:?}");
}

/// A zero timeout makes exactly one request.
pub fn zero_timeout_is_exactly_one_attempt(f: &dyn Fixture) {
    let name = unique_name("zero");
    let _held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let other = LockClient::builder(counting.clone()).build().unwrap();
    let lock = other.get_lock(&name).unwrap();
    assert!(lock.try_lock_timeout(Duration::ZERO).unwrap().is_none());
    assert_eq!(counting.calls(), 1);
    assert!(lock.try_lock().unwrap().is_none());
    assert_eq!(counting.calls(), 2);
}

/// `Duration::MAX` means "forever": no overflow, and the wait ends when the lock frees.
pub fn unbounded_timeout_waits_without_overflow(f: &dyn Fixture) {
    let name = unique_name("forever");
    let held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let other = client(f).get_lock(&name).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let waiter = thread::spawn(move || {
        let got = other.try_lock_timeout(Duration::MAX).map(|g| g.is_some());
        tx.send(got).unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(200), "waiter with Duration::MAX");
    held.unlock().unwrap();
    assert!(rx.recv_timeout(PROMPT * 5).unwrap().unwrap());
    waiter.join().unwrap();
}

/// A lock can be taken again, by anyone, after it was unlocked.
pub fn lock_again_after_unlock(f: &dyn Fixture) {
    let name = unique_name("again");
    let (a, b) = (client(f), client(f));
    for _ in 0..3 {
        a.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
        b.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
    }
    assert!(!a.get_lock(&name).unwrap().is_locked().unwrap());
}

/// Only the owner can release: another client's `unlock` is `NotHeld`, and the backend
/// refuses a release with a foreign token.
pub fn release_by_non_owner_is_refused(f: &dyn Fixture) {
    let name = unique_name("foreign");
    let owner = client(f).get_lock(&name).unwrap();
    let guard = owner.lock().unwrap();
    let stranger = client(f).get_lock(&name).unwrap();
    assert!(matches!(stranger.unlock(), Err(Error::NotHeld)));
    let backend = f.backend();
    let lock_name = LockName::new(&name).unwrap();
    assert!(
        !backend
            .release(&lock_name, &OwnerToken::random_for_tests(1))
            .unwrap()
    );
    assert!(
        backend
            .extend(
                &lock_name,
                &OwnerToken::random_for_tests(1),
                Duration::from_secs(5)
            )
            .unwrap()
            .is_none()
    );
    assert!(
        stranger.try_lock().unwrap().is_none(),
        "the stranger freed it"
    );
    guard.unlock().unwrap();
}

/// Unlocking twice: the second is `NotHeld`.
pub fn double_unlock_is_not_held(f: &dyn Fixture) {
    let name = unique_name("double");
    let lock = client(f).get_lock(&name).unwrap();
    assert!(matches!(lock.unlock(), Err(Error::NotHeld)));
    lock.lock().unwrap().into_hold();
    lock.unlock().unwrap();
    assert!(matches!(lock.unlock(), Err(Error::NotHeld)));
    assert!(!lock.is_locked().unwrap());
}

/// The holding thread acquires again without blocking; both holds share the token.
pub fn reentrant_same_thread(f: &dyn Fixture) {
    let name = unique_name("reentrant");
    let c = client(f);
    let lock = c.get_lock(&name).unwrap();
    let outer = lock.lock().unwrap();
    let t = Instant::now();
    let inner = lock
        .try_lock()
        .unwrap()
        .expect("re-entrant try_lock failed");
    let via_other_handle = c.get_lock(&name).unwrap().lock().unwrap();
    assert!(t.elapsed() < PROMPT);
    assert_eq!(lock.hold_count(), 3);
    assert!(lock.is_held_by_current_thread());
    assert_eq!(inner.fencing_token().ok(), outer.fencing_token().ok());
    drop(via_other_handle);
    drop(inner);
    outer.unlock().unwrap();
    assert_eq!(lock.hold_count(), 0);
    assert!(!lock.is_locked().unwrap());
}

/// Another thread of the same client does not share the hold: it blocks.
pub fn reentrant_other_thread_blocks(f: &dyn Fixture) {
    let name = unique_name("reentrant-thread");
    let lock = client(f).get_lock(&name).unwrap();
    let guard = lock.lock().unwrap();
    let other = lock.clone();
    let (tried, waited) = thread::spawn(move || {
        assert!(!other.is_held_by_current_thread());
        assert_eq!(other.hold_count(), 0);
        let tried = other.try_lock().unwrap().is_some();
        let waited = other
            .try_lock_timeout(Duration::from_millis(200))
            .unwrap()
            .is_some();
        (tried, waited)
    })
    .join()
    .unwrap();
    assert!(!tried && !waited, "another thread shared the hold");
    guard.unlock().unwrap();
}

/// Giving back one of two holds keeps the lock; the last one frees it.
pub fn reentrant_partial_unlock_keeps_the_lock(f: &dyn Fixture) {
    let name = unique_name("partial");
    let lock = client(f).get_lock(&name).unwrap();
    let stranger = client(f).get_lock(&name).unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    inner.unlock().unwrap();
    assert_eq!(lock.hold_count(), 1);
    assert!(outer.is_held());
    assert!(
        stranger.try_lock().unwrap().is_none(),
        "a partial unlock freed the lock"
    );
    outer.unlock().unwrap();
    assert!(stranger.try_lock().unwrap().is_some());
}

/// With re-entrancy off, a second acquisition by the holding thread is contention.
pub fn non_reentrant_mode_refuses_second_hold(f: &dyn Fixture) {
    let name = unique_name("non-reentrant");
    let c = LockClient::builder(f.backend())
        .reentrant(false)
        .build()
        .unwrap();
    let lock = c.get_lock(&name).unwrap();
    let guard = lock.lock().unwrap();
    assert!(lock.try_lock().unwrap().is_none());
    assert!(
        lock.try_lock_timeout(Duration::from_millis(100))
            .unwrap()
            .is_none()
    );
    assert_eq!(lock.hold_count(), 1);
    guard.unlock().unwrap();
    assert!(lock.try_lock().unwrap().is_some());
}

/// A guard dropped while its thread panics releases the lock.
pub fn guard_dropped_during_panic_releases(f: &dyn Fixture) {
    let name = unique_name("panic");
    let lock = client(f).get_lock(&name).unwrap();
    let result = thread::spawn(move || {
        let _guard = lock.lock().unwrap();
        panic!("deliberate panic inside the critical section");
    })
    .join();
    assert!(result.is_err());
    let other = client(f).get_lock(&name).unwrap();
    assert!(
        other.try_lock().unwrap().is_some(),
        "the panic left the lock held"
    );
}

/// A guard is `Send`: it can be unlocked on another thread.
pub fn guard_moves_to_another_thread(f: &dyn Fixture) {
    let name = unique_name("send");
    let lock = client(f).get_lock(&name).unwrap();
    let guard = lock.lock().unwrap();
    thread::spawn(move || guard.unlock().unwrap())
        .join()
        .unwrap();
    assert!(!lock.is_locked().unwrap());
    assert_eq!(lock.hold_count(), 0);
}

/// `force_unlock` frees a lock whoever holds it; the holder's unlock then reports the loss.
pub fn force_unlock_frees_and_the_holder_learns(f: &dyn Fixture) {
    let name = unique_name("force");
    let guard = client(f).get_lock(&name).unwrap().lock().unwrap();
    let admin = client(f).get_lock(&name).unwrap();
    assert!(admin.force_unlock().unwrap());
    assert!(
        !admin.force_unlock().unwrap(),
        "a free lock reported as held"
    );
    let next = client(f).get_lock(&name).unwrap().try_lock().unwrap();
    assert!(next.is_some());
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert!(
        next.unwrap().is_held(),
        "the old holder's unlock freed the new holder"
    );
}

/// `is_locked`, `remaining_lease`, `hold_count`, `is_held_by_current_thread`.
pub fn introspection(f: &dyn Fixture) {
    let name = unique_name("inspect");
    let lock = client_with_lease(f, Duration::from_secs(20))
        .get_lock(&name)
        .unwrap();
    let observer = client(f).get_lock(&name).unwrap();
    assert!(!observer.is_locked().unwrap());
    assert_eq!(observer.remaining_lease().unwrap(), None);
    let guard = lock.lock().unwrap();
    assert!(observer.is_locked().unwrap());
    let remaining = observer.remaining_lease().unwrap().unwrap();
    assert!(remaining > Duration::from_secs(10) && remaining <= Duration::from_secs(20));
    assert!(lock.is_held_by_current_thread());
    assert!(!observer.is_held_by_current_thread());
    assert_eq!(observer.hold_count(), 0);
    assert!(guard.valid_until() > Instant::now() + Duration::from_secs(10));
    assert_eq!(guard.name(), name);
    guard.unlock().unwrap();
    assert!(!observer.is_locked().unwrap());
}

/// Bad arguments are rejected with `InvalidArgument` before any request is made.
pub fn bad_input_is_rejected_before_io(f: &dyn Fixture) {
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone()).build().unwrap();
    let long = "x".repeat(dlm_core::MAX_NAME_LEN + 1);
    for bad in ["", long.as_str(), "nul\0byte", "new\nline"] {
        let e = c.get_lock(bad).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(a) if a.argument() == "name"),
            "{e}"
        );
    }
    let lock = c.get_lock(&unique_name("bad")).unwrap();
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_secs(25 * 3600),
        Duration::MAX,
    ] {
        let e = lock.clone().with_lease(bad).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(a) if a.argument() == "lease"),
            "{e}"
        );
    }
    let guard = lock.lock().unwrap();
    let before = counting.calls();
    let e = guard.extend(Duration::ZERO).unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
    assert!(
        guard
            .extend(Duration::MAX)
            .unwrap_err()
            .is_invalid_argument()
    );
    assert_eq!(
        counting.calls(),
        before,
        "a rejected argument reached the backend"
    );
    assert!(
        LockClient::builder(f.backend())
            .lease(Duration::ZERO)
            .build()
            .is_err()
    );
    // Lua-looking and key-looking names are just names.
    let tricky = ["x:fence", "}{", "return redis.call('FLUSHALL')", "日本語"];
    let holders: Vec<_> = tricky
        .iter()
        .map(|n| c.get_lock(&format!("{}{n}", unique_name("t"))).unwrap())
        .collect();
    for h in &holders {
        h.try_lock().unwrap().unwrap().unlock().unwrap();
    }
    guard.unlock().unwrap();
}

/// The blog's IDGenerator test: threads of separate clients draw IDs from a shared,
/// unsynchronised counter under the lock for a while; no ID may be drawn twice.
pub fn id_generator_has_no_duplicates(f: &dyn Fixture) {
    let name = unique_name("idgen");
    let run_for = Duration::from_millis(700);
    let next_id = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(parking_lot::Mutex::new(HashSet::new()));
    let duplicates = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let lock = client(f).get_lock(&name).unwrap();
            let (next_id, seen, duplicates) = (next_id.clone(), seen.clone(), duplicates.clone());
            thread::spawn(move || {
                let end = Instant::now() + run_for;
                while Instant::now() < end {
                    let Some(guard) = lock.try_lock_timeout(Duration::from_secs(3)).unwrap() else {
                        continue;
                    };
                    let id = next_id.load(Ordering::SeqCst);
                    thread::yield_now();
                    next_id.store(id + 1, Ordering::SeqCst);
                    drop(guard);
                    if !seen.lock().insert(id) {
                        duplicates.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let ids = seen.lock().len();
    assert!(ids > 10, "only {ids} ids drawn");
    assert_eq!(duplicates.load(Ordering::SeqCst), 0, "duplicate ids drawn");
}

/// `try_acquire` is idempotent for its owner (a retry after a lost reply must not block its
/// own sender): the same owner gets the lock again, with the lease refreshed to the new
/// TTL, and a fencing token not older than the first; another owner is still refused.
pub fn acquire_is_idempotent_for_its_owner(f: &dyn Fixture) {
    let backend = f.backend();
    let name = LockName::new(&unique_name("again")).unwrap();
    let (owner, other) = (
        OwnerToken::random_for_tests(1),
        OwnerToken::random_for_tests(2),
    );
    let first = match backend
        .try_acquire(&name, &owner, Duration::from_secs(2))
        .unwrap()
    {
        dlm_core::backend::Acquire::Acquired(lease) => lease,
        other => panic!("a free lock: {other:?}"),
    };
    let again = match backend
        .try_acquire(&name, &owner, Duration::from_secs(60))
        .unwrap()
    {
        dlm_core::backend::Acquire::Acquired(lease) => lease,
        other => panic!("its own lock, asked again: {other:?}"),
    };
    assert!(again.valid_until() > first.valid_until());
    let remaining = backend.inspect(&name).unwrap().expect("held");
    assert!(
        remaining > Duration::from_secs(30),
        "the lease was not refreshed: {remaining:?} left"
    );
    if let (Some(a), Some(b)) = (first.fence(), again.fence()) {
        // Tokens handed out with every lease (such a backend need not implement `fence`:
        // the front never asks it).
        assert!(b >= a, "token {b} after {a}");
    } else if f.fencing() {
        // Tokens drawn on demand: `fence`, and the token drawn with the acquisition.
        let drawn = backend.fence(&name, &owner).unwrap().expect("its own lock");
        assert!(first.fence().is_none_or(|t| drawn >= t));
        let again = match backend
            .try_acquire(&name, &owner, Duration::from_secs(60))
            .unwrap()
        {
            dlm_core::backend::Acquire::Acquired(lease) => lease,
            other => panic!("its own lock, asked again: {other:?}"),
        };
        let after = backend.fence(&name, &owner).unwrap().expect("its own lock");
        assert!(after >= drawn && again.fence().is_none_or(|t| t >= drawn));
        assert_eq!(backend.fence(&name, &other).unwrap(), None, "not its lock");
        match backend
            .try_acquire_fenced(&name, &owner, Duration::from_secs(60))
            .unwrap()
        {
            dlm_core::backend::Acquire::Acquired(lease) => {
                assert!(lease.fence().is_none_or(|t| t >= after));
            }
            other => panic!("its own lock, asked again with its token: {other:?}"),
        }
    }
    assert!(matches!(
        backend
            .try_acquire(&name, &other, Duration::from_secs(2))
            .unwrap(),
        dlm_core::backend::Acquire::Held { .. }
    ));
    assert!(backend.release(&name, &owner).unwrap());
}

/// `Lock::release` (Java's `Releasable::release`) gives back every hold of the calling
/// thread at once; with nothing held it does nothing (no I/O).
pub fn release_gives_back_every_hold(f: &dyn Fixture) {
    let name = unique_name("release");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone()).build().unwrap();
    let lock = c.get_lock(&name).unwrap();
    for _ in 0..3 {
        lock.lock().unwrap().into_hold();
    }
    assert_eq!(lock.hold_count(), 3);
    lock.release().unwrap();
    assert_eq!(lock.hold_count(), 0);
    assert!(!lock.is_held_by_current_thread());
    let other = client(f).get_lock(&name).unwrap();
    let taken = other.try_lock().unwrap().expect("free after release()");
    let calls = counting.calls();
    lock.release().unwrap();
    assert_eq!(
        counting.calls(),
        calls,
        "release() with nothing held did I/O"
    );
    assert!(matches!(lock.unlock(), Err(Error::NotHeld)));
    taken.unlock().unwrap();
}

/// Re-entry by the holding thread is counted locally: no request reaches the backend.
pub fn reentry_does_no_io(f: &dyn Fixture) {
    let name = unique_name("reentry");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = c.get_lock(&name).unwrap();
    let outer = lock.lock().unwrap();
    let calls = counting.calls();
    let inner: Vec<_> = (0..10).map(|_| lock.lock().unwrap()).collect();
    assert!(lock.try_lock().unwrap().is_some_and(|g| {
        g.into_hold();
        true
    }));
    assert_eq!(counting.calls(), calls, "re-entry reached the backend");
    assert_eq!(lock.hold_count(), 12);
    lock.unlock().unwrap();
    drop(inner);
    assert_eq!(counting.calls(), calls, "giving back inner holds did I/O");
    outer.unlock().unwrap();
    assert_eq!(counting.calls(), calls + 1, "the last hold releases once");
}
