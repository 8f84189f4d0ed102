//! The conformance suite: what every backend must do, as one `pub fn` per case.
//!
//! Each case takes a [`Fixture`] and panics on a violation. Timing assertions use wide
//! margins (they run on loaded 2-core machines); where a case must know that a thread is
//! blocked, it checks that the thread has not finished within a bounded wait instead of
//! sleeping.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use dlm_core::backend::{LockName, OwnerToken};
use dlm_core::{
    BackendErrorKind, Error, HoldState, Lock, LockClient, RetryPolicy, TokenDraw, interrupt_pair,
};

use crate::history::History;
use crate::{CountingBackend, Fixture, unique_name};

/// Generous bound for "returns promptly" on a loaded CI machine.
const PROMPT: Duration = Duration::from_secs(2);

fn client(f: &dyn Fixture) -> LockClient {
    LockClient::builder(f.backend()).build().unwrap()
}

fn client_with_lease(f: &dyn Fixture, lease: Duration) -> LockClient {
    LockClient::builder(f.backend())
        .lease(lease)
        .build()
        .unwrap()
}

/// Asserts that `rx` receives nothing for `within`: the thread behind it is blocked.
fn assert_still_blocked<T>(rx: &crossbeam_channel::Receiver<T>, within: Duration, what: &str) {
    match rx.recv_timeout(within) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(_) => panic!("{what}: finished while it should still be blocked"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: thread died"),
    }
}

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

/// An interrupt ends a blocked wait with `Interrupted` within 100 ms.
pub fn interrupt_wakes_a_waiter(f: &dyn Fixture) {
    let name = unique_name("interrupt");
    let _held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let waiter = client(f).get_lock(&name).unwrap();
    let (interrupter, interrupt) = interrupt_pair();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let t = thread::spawn(move || {
        let r = waiter.lock_interruptibly(&interrupt);
        tx.send((r.map(drop), Instant::now())).unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(200), "interruptible waiter");
    let fired = Instant::now();
    interrupter.interrupt();
    let (result, woke) = rx.recv_timeout(PROMPT).expect("the interrupt was not seen");
    assert!(matches!(result, Err(Error::Interrupted)), "{result:?}");
    let latency = woke - fired;
    assert!(
        latency < Duration::from_millis(100),
        "interrupt took {latency:?}"
    );
    t.join().unwrap();
    // An interrupt that fired before the call is seen at once.
    let lock = client(f).get_lock(&name).unwrap();
    let (i2, interrupt2) = interrupt_pair();
    i2.interrupt();
    assert!(matches!(
        lock.try_lock_interruptibly(Duration::from_secs(5), &interrupt2),
        Err(Error::Interrupted)
    ));
}

/// A waiter wakes within 50 ms of a release, even with a 10 s backoff, when the backend
/// sends release hints.
pub fn release_wakes_a_waiter(f: &dyn Fixture) {
    let name = unique_name("wake");
    let backend = f.backend();
    if !f.watch() {
        assert!(backend.watch(&LockName::new(&name).unwrap()).is_none());
        return;
    }
    let held = client(f).get_lock(&name).unwrap().lock().unwrap();
    let slow = RetryPolicy::new()
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .unwrap();
    let waiter = LockClient::builder(f.backend())
        .retry(slow)
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let t = thread::spawn(move || {
        let got = waiter.try_lock_timeout(Duration::from_secs(20)).unwrap();
        tx.send(Instant::now()).unwrap();
        got.expect("waiter timed out").unlock().unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(200), "waiter");
    let released = Instant::now();
    held.unlock().unwrap();
    let acquired = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let latency = acquired - released;
    assert!(
        latency < Duration::from_millis(50),
        "waiter took {latency:?} to notice the release"
    );
    t.join().unwrap();
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

/// Fencing tokens strictly increase over successive acquisitions, across clients and
/// threads, whether or not the holds in between read theirs, and re-entrant holds share
/// theirs. A backend without fencing says so with `Unsupported`.
pub fn fencing_tokens_strictly_increase(f: &dyn Fixture) {
    let name = unique_name("fence");
    if !f.fencing() {
        let g = client(f).get_lock(&name).unwrap().lock().unwrap();
        let e = g.fencing_token().unwrap_err();
        assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unsupported), "{e}");
        assert!(
            g.is_held(),
            "asking for a token that does not exist lost nothing"
        );
        return;
    }
    let clients = [client(f), client(f)];
    let mut last = None;
    for i in 0..12 {
        let g = clients[i % 2].get_lock(&name).unwrap().lock().unwrap();
        if i % 3 == 1 {
            continue; // a hold that never reads its token
        }
        let token = g.fencing_token().expect("no fencing token");
        assert!(Some(token) > last, "token {token} after {last:?}");
        last = Some(token);
    }
    // Concurrent holders record their tokens in acquisition order.
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let lock = client(f).get_lock(&name).unwrap();
            let order = order.clone();
            thread::spawn(move || {
                for _ in 0..20 {
                    let g = lock.lock().unwrap();
                    order.lock().push(g.fencing_token().unwrap());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let order = order.lock();
    assert_eq!(order.len(), 80);
    assert!(order[0] > last.unwrap());
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {order:?}"
    );
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

/// A backend wrapper that releases a given guard right after the first attempt that
/// finds the lock held: the release lands between a waiter's failed try and its wait.
#[derive(Debug)]
struct ReleaseAfterFirstHeld {
    inner: Arc<dyn dlm_core::backend::LockBackend>,
    guard: parking_lot::Mutex<Option<dlm_core::LockGuard>>,
}

impl dlm_core::backend::LockBackend for ReleaseAfterFirstHeld {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<dlm_core::backend::Acquire, dlm_core::BackendError> {
        let r = self.inner.try_acquire(name, owner, ttl);
        if matches!(r, Ok(dlm_core::backend::Acquire::Held { .. }))
            && let Some(g) = self.guard.lock().take()
        {
            g.unlock().unwrap();
        }
        r
    }
    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<dlm_core::backend::Lease>, dlm_core::BackendError> {
        self.inner.extend(name, owner, ttl)
    }
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<dlm_core::FencingToken>, dlm_core::BackendError> {
        self.inner.fence(name, owner)
    }
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, dlm_core::BackendError> {
        self.inner.release(name, owner)
    }
    fn force_release(&self, name: &LockName) -> Result<bool, dlm_core::BackendError> {
        self.inner.force_release(name)
    }
    fn now(&self) -> Instant {
        self.inner.now()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, dlm_core::BackendError> {
        self.inner.inspect(name)
    }
    fn watch(&self, name: &LockName) -> Option<dlm_core::backend::Watch> {
        self.inner.watch(name)
    }
}

/// A release between a waiter's failed attempt and its wait is not lost: the waiter takes
/// the lock at once, not after its (10 s) backoff or the holder's (30 s) lease. (Backends
/// with release hints only: without them a waiter sleeps until its backoff.)
pub fn release_between_failed_try_and_wait_is_not_lost(f: &dyn Fixture) {
    if !f.watch() {
        // Without release hints the waiter sleeps until its backoff or the lease's end:
        // the window is a hint's to close.
        return assert!(
            f.backend()
                .watch(&LockName::new(&unique_name("w")).unwrap())
                .is_none()
        );
    }
    let name = unique_name("window");
    let holder = client_with_lease(f, Duration::from_secs(30))
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let backend = Arc::new(ReleaseAfterFirstHeld {
        inner: f.backend(),
        guard: parking_lot::Mutex::new(Some(holder)),
    });
    let slow = RetryPolicy::new()
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .unwrap();
    let waiter = LockClient::builder(backend.clone())
        .retry(slow)
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap();
    let t = Instant::now();
    let got = waiter.try_lock_timeout(Duration::from_secs(20)).unwrap();
    assert!(got.is_some());
    assert!(
        backend.guard.lock().is_none(),
        "the holder was never released"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the release in the window cost {:?}",
        t.elapsed()
    );
}

/// Sixteen waiters (one process: one shared backend), one release: one of them takes the
/// lock and the others keep sleeping; waiting threads send no requests.
pub fn one_release_wakes_one_of_sixteen_waiters(f: &dyn Fixture) {
    if !f.watch() {
        return assert!(
            f.backend()
                .watch(&LockName::new(&unique_name("w")).unwrap())
                .is_none()
        );
    }
    let name = unique_name("herd");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let holder = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let (won_tx, won_rx) = crossbeam_channel::unbounded();
    let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let lock = LockClient::builder(counting.clone())
                .build()
                .unwrap()
                .get_lock(&name)
                .unwrap();
            let (won_tx, go_rx) = (won_tx.clone(), go_rx.clone());
            thread::spawn(move || {
                let g = lock.try_lock_timeout(Duration::from_secs(60)).unwrap();
                let g = g.expect("waiter gave up");
                won_tx.send(()).unwrap();
                // Keep the lock until told to pass it on.
                go_rx.recv().unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    // Each waiter makes two attempts (before and after subscribing), then sleeps.
    let deadline = Instant::now() + Duration::from_secs(20);
    while counting.calls() < 1 + 32 {
        assert!(Instant::now() < deadline, "waiters never settled");
        thread::sleep(Duration::from_millis(5));
    }
    let settled = counting.calls();
    assert!(
        matches!(
            won_rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout)
        ),
        "a waiter took a held lock"
    );
    assert_eq!(counting.calls(), settled, "waiting threads sent requests");
    holder.unlock().unwrap();
    won_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("nobody woke");
    assert!(
        matches!(
            won_rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout)
        ),
        "two winners"
    );
    let after = counting.calls() - settled;
    assert!(after <= 4, "{after} requests for one hand-over");
    for _ in 0..16 {
        go_tx.send(()).unwrap();
    }
    for _ in 1..16 {
        won_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a waiter starved");
    }
    for w in waiters {
        w.join().unwrap();
    }
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

/// Threads of one process are served in turn: a thread that releases and asks again at
/// once queues behind the waiter its release woke instead of barging past it. Four
/// threads queue up behind a holder, then take the lock 25 times each; while all four are
/// still at it, the same thread may take the lock twice in a row only rarely (a thread
/// that barges does so on most of its turns).
pub fn local_waiters_are_served_in_turn(f: &dyn Fixture) {
    if !f.watch() {
        // No release hints: no local queue to keep in order, and no hand-over to wait for.
        let backend = f.backend();
        let name = LockName::new(&unique_name("turns")).unwrap();
        assert!(backend.watch(&name).is_none());
        assert!(!backend.wake_pending(&name));
        return;
    }
    const THREADS: usize = 4;
    const EACH: usize = 25;
    let name = unique_name("turns");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let client = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let holder = client.get_lock(&name).unwrap().lock().unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let lock = client.get_lock(&name).unwrap();
            let order = order.clone();
            thread::spawn(move || {
                for _ in 0..EACH {
                    let guard = lock
                        .try_lock_timeout(Duration::from_secs(30))
                        .unwrap()
                        .expect("a waiter starved");
                    order.lock().push(t);
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    // Each thread makes two attempts (before and after subscribing), then sleeps.
    let deadline = Instant::now() + Duration::from_secs(20);
    while counting.calls() < 1 + 2 * THREADS as u64 {
        assert!(Instant::now() < deadline, "the threads never queued up");
        thread::sleep(Duration::from_millis(2));
    }
    holder.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let order = order.lock();
    // Up to the first thread's last acquisition, every thread still wants the lock.
    let mut taken = [0; THREADS];
    let all_in = order
        .iter()
        .position(|&t| {
            taken[t] += 1;
            taken[t] == EACH
        })
        .expect("every thread finished");
    let repeats = order[..=all_in].windows(2).filter(|w| w[0] == w[1]).count();
    assert!(
        repeats * 10 <= all_in,
        "{repeats} of {all_in} acquisitions went to the thread that had just released: {order:?}"
    );
}

/// Kleppmann's scenario: client 1 takes the lock and pauses past its lease; client 2 takes
/// it and writes; client 1 wakes and writes. The resource, checking fencing tokens,
/// refuses client 1's write.
pub fn a_paused_holder_is_fenced_off(f: &dyn Fixture) {
    let name = unique_name("pause");
    let lease = Duration::from_millis(300);
    let first = client_with_lease(f, lease).get_lock(&name).unwrap();
    let g1 = first.lock().unwrap();
    let t1 = match g1.fencing_token() {
        Ok(t1) => t1,
        Err(e) => return assert!(!f.fencing(), "no fencing token: {e}"),
    };
    let resource = dlm_core::FencedResource::new(Vec::new());
    resource
        .write(t1, |log| log.push("client 1, before the pause"))
        .unwrap();
    // Client 1 is paused (it does nothing) while its lease runs out; client 2 takes over.
    let g2 = client(f)
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("client 2 never got the lock");
    let t2 = g2.fencing_token().unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    resource.write(t2, |log| log.push("client 2")).unwrap();
    // Client 1 wakes up and writes as if it still held the lock.
    let refused = resource.write(t1, |log| log.push("client 1, after the pause"));
    assert_eq!(
        refused,
        Err(dlm_core::StaleToken {
            presented: t1,
            highest: t2
        })
    );
    assert!(
        g1.is_expired(),
        "client 1 could have known: its lease had run out"
    );
    assert_eq!(
        resource.read(|log| log.clone()),
        ["client 1, before the pause", "client 2"]
    );
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

/// A backend that lets its first `pass` acquisition attempts through and holds every
/// later one until the gate opens (to freeze a woken waiter in the middle of a
/// hand-over).
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn dlm_core::backend::LockBackend>,
    pass: u64,
    attempts: AtomicU64,
    /// Attempts that have returned.
    finished: AtomicU64,
    open: parking_lot::Mutex<bool>,
    opened: parking_lot::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

impl dlm_core::backend::LockBackend for Gate {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<dlm_core::backend::Acquire, dlm_core::BackendError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) >= self.pass {
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
        }
        let result = self.inner.try_acquire(name, owner, ttl);
        self.finished.fetch_add(1, Ordering::SeqCst);
        result
    }
    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<dlm_core::backend::Lease>, dlm_core::BackendError> {
        self.inner.extend(name, owner, ttl)
    }
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<dlm_core::FencingToken>, dlm_core::BackendError> {
        self.inner.fence(name, owner)
    }
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, dlm_core::BackendError> {
        self.inner.release(name, owner)
    }
    fn force_release(&self, name: &LockName) -> Result<bool, dlm_core::BackendError> {
        self.inner.force_release(name)
    }
    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, dlm_core::BackendError> {
        self.inner.inspect(name)
    }
    fn watch(&self, name: &LockName) -> Option<dlm_core::backend::Watch> {
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
}

/// `try_lock` never queues: while a waiter of this process has been woken by a release
/// and has not made its attempt yet (a hand-over in progress, which a blocking `lock`
/// would wait behind), `try_lock` still makes its one attempt at once, and takes the lock
/// if it is free.
pub fn try_lock_never_queues(f: &dyn Fixture) {
    let name = unique_name("no-queue");
    // One backend for the three threads: its waiters are this process's.
    let backend = f.backend();
    let holder = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let gate = Arc::new(Gate {
        inner: backend.clone(),
        pass: 2, // before and after subscribing; the attempt after its wake-up waits
        attempts: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        open: parking_lot::Mutex::new(false),
        opened: parking_lot::Condvar::new(),
    });
    let waiter = LockClient::builder(gate.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let counting = Arc::new(CountingBackend::new(backend.clone()));
    let newcomer = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let held = holder.get_lock(&name).unwrap().lock().unwrap();
    let lock = waiter.get_lock(&name).unwrap();
    let waiting = thread::spawn(move || {
        lock.try_lock_timeout(Duration::from_secs(30))
            .unwrap()
            .map(|g| g.unlock())
    });
    // Both attempts must have *returned* (found the lock held) before the release: an
    // attempt still at the server when the lock is released can take it directly, and
    // then nobody is left to wake (seen in CI under load, on Redlock over TLS).
    let deadline = Instant::now() + PROMPT * 5;
    while gate.finished.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the waiter never started waiting"
        );
        thread::sleep(Duration::from_millis(1));
    }
    held.unlock().unwrap();
    if f.watch() {
        // The release woke the waiter, which is stuck at the gate: a hand-over is pending.
        let deadline = Instant::now() + PROMPT * 5;
        while gate.attempts.load(Ordering::SeqCst) < 3 {
            assert!(Instant::now() < deadline, "the release woke nobody");
            thread::sleep(Duration::from_millis(1));
        }
        assert!(backend.wake_pending(&LockName::new(&name).unwrap()));
    }
    let start = Instant::now();
    let taken = newcomer.get_lock(&name).unwrap().try_lock().unwrap();
    assert!(start.elapsed() < PROMPT);
    assert_eq!(counting.calls(), 1, "try_lock made other than one attempt");
    let taken = taken.expect("try_lock queued behind a pending hand-over");
    gate.open();
    taken.unlock().unwrap();
    let waited = waiting.join().unwrap();
    assert!(
        matches!(waited, Some(Ok(()))),
        "the waiter did not get the lock after: {waited:?}"
    );
}

/// A holder that lost its lock never gets a token afterwards: its first read of the token
/// after its lease ran out (and another holder took the lock) is `LockLost`, never a
/// token. After a force release under a lease it still believes in, a backend that draws
/// tokens on demand answers `LockLost` too (and the guard then knows it lost the lock); one
/// that handed the token out with the acquisition may give that token, which is older than
/// the next holder's.
pub fn a_token_read_after_the_lock_was_lost_is_an_error(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("lost-token");
    let lease = Duration::from_millis(300);
    let first = client_with_lease(f, lease).get_lock(&name).unwrap();
    let g1 = first.lock().unwrap();
    let g2 = client(f)
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("the lease ran out, the lock is free");
    match g1.fencing_token() {
        Err(Error::LockLost) => {}
        other => panic!("a token read after the lease ran out: {other:?}"),
    }
    let t2 = g2.fencing_token().unwrap();
    drop(g2);

    let held = client(f).get_lock(&name).unwrap();
    let g3 = held.lock().unwrap();
    assert!(client(f).get_lock(&name).unwrap().force_unlock().unwrap());
    let g4 = client(f).get_lock(&name).unwrap().lock().unwrap();
    let t4 = g4.fencing_token().unwrap();
    assert!(t4 > t2, "token {t4} after {t2}");
    match g3.fencing_token() {
        Err(Error::LockLost) => assert!(!g3.is_held(), "the guard learnt nothing"),
        Ok(t3) => assert!(
            t3 < t4,
            "the old holder's token {t3} is not older than {t4}"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// One token per hold: read twice, through a re-entrant guard, or from another thread, it
/// is the same (and the later reads do no I/O); the next acquisition gets a larger one.
pub fn the_token_is_stable_within_a_hold(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("stable-token");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = c.get_lock(&name).unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let t = inner.fencing_token().unwrap();
    let calls = counting.calls();
    assert_eq!(outer.fencing_token().unwrap(), t);
    assert_eq!(inner.fencing_token().unwrap(), t);
    assert_eq!(lock.lock().unwrap().fencing_token().unwrap(), t);
    let moved = thread::spawn(move || inner.fencing_token().unwrap())
        .join()
        .unwrap();
    assert_eq!(moved, t);
    assert_eq!(counting.calls(), calls, "a second read did I/O");
    outer.unlock().unwrap();
    let next = lock.lock().unwrap();
    let t2 = next.fencing_token().unwrap();
    assert!(t2 > t, "token {t2} after {t}");
    assert_eq!(next.fencing_token().unwrap(), t2);
}

/// Fencing costs nothing until it is used: acquisitions (fresh, contended, re-entrant)
/// whose tokens are never read write no fencing key; the first read writes one.
pub fn an_unread_token_writes_no_fencing_key(f: &dyn Fixture) {
    let Some(before) = f.fencing_keys() else {
        return;
    };
    let names: Vec<String> = (0..20).map(|_| unique_name("unread")).collect();
    let (a, b) = (client(f), client(f));
    for name in &names {
        let g = a.get_lock(name).unwrap().lock().unwrap();
        let again = a.get_lock(name).unwrap().lock().unwrap();
        assert!(b.get_lock(name).unwrap().try_lock().unwrap().is_none());
        drop(again);
        g.unlock().unwrap();
        let g = b.get_lock(name).unwrap().lock().unwrap();
        g.unlock().unwrap();
    }
    assert_eq!(
        f.fencing_keys(),
        Some(before),
        "acquisitions whose tokens were never read wrote fencing keys"
    );
    if f.fencing() {
        let g = a.get_lock(&names[0]).unwrap().lock().unwrap();
        g.fencing_token().unwrap();
        assert!(f.fencing_keys() > Some(before), "the read wrote no key");
    }
}

/// A client over `counting` with a fixed lease, drawing tokens as `draw` says.
fn counted_client(counting: &Arc<CountingBackend>, draw: TokenDraw) -> LockClient {
    LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .token_draw(draw)
        .build()
        .unwrap()
}

/// After a hold that read its token, the next acquisition of the lock by the same client
/// (through a new handle too) draws the token with it: the token is known right after
/// acquiring, with no request but the acquisition, and reading it does no I/O. Tokens
/// drawn so still increase across holders (another client holds and reads in between).
pub fn a_read_token_comes_with_the_next_acquisition(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("predicted");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let a = counted_client(&counting, TokenDraw::Predicted);
    let other = client(f);
    let g = a.get_lock(&name).unwrap().lock().unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        0,
        "nothing to predict from: the first hold draws when read"
    );
    let mut last = g.fencing_token().unwrap();
    g.unlock().unwrap();
    let lock = a.get_lock(&name).unwrap();
    for round in 1..=3 {
        let g = other.get_lock(&name).unwrap().lock().unwrap();
        let t = g.fencing_token().unwrap();
        assert!(t > last, "token {t} after {last}");
        last = t;
        g.unlock().unwrap();
        // Once through the kept handle, once through a new one.
        let calls = counting.calls();
        let g = if round % 2 == 0 {
            lock.lock().unwrap()
        } else {
            a.get_lock(&name).unwrap().lock().unwrap()
        };
        assert_eq!(counting.fenced_acquisitions(), round, "round {round}");
        let t = g
            .known_fencing_token()
            .expect("the token came with the acquisition");
        assert_eq!(g.fencing_token().unwrap(), t);
        assert_eq!(counting.calls(), calls + 1, "more than the acquisition");
        assert!(t > last, "token {t} after {last}");
        last = t;
        g.unlock().unwrap();
    }
}

/// A token drawn with the acquisition and never read is released with the lock: the
/// lock is free afterwards, the store holds the same fencing keys as before and no key
/// without expiry, and the next acquisition goes back to drawing on read. A later read
/// still gets a larger token.
pub fn a_mispredicted_draw_is_released_with_the_lock(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("mispredicted");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let a = counted_client(&counting, TokenDraw::Predicted);
    let lock = a.get_lock(&name).unwrap();
    let g = lock.lock().unwrap();
    let t1 = g.fencing_token().unwrap();
    g.unlock().unwrap();
    let keys = f.fencing_keys();
    // Predicted a read, and not read.
    let g = lock.lock().unwrap();
    assert_eq!(counting.fenced_acquisitions(), 1);
    let drawn = g.known_fencing_token().expect("drawn with the acquisition");
    assert!(drawn > t1, "token {drawn} after {t1}");
    g.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "released with the lock");
    assert_eq!(f.fencing_keys(), keys, "the unused draw left fencing keys");
    assert_eq!(
        f.keys_without_expiry().unwrap_or(0),
        0,
        "a key without expiry"
    );
    // The prediction is cleared: draw on read again.
    let g = lock.lock().unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        1,
        "still drawn with the acquisition"
    );
    let t3 = g.fencing_token().unwrap();
    assert!(t3 > drawn, "token {t3} after {drawn}");
    g.unlock().unwrap();
    assert_eq!(
        f.keys_without_expiry().unwrap_or(0),
        0,
        "a key without expiry"
    );
}

/// `TokenDraw::AtAcquisition` draws with every acquisition (the first one too) and
/// `TokenDraw::WhenRead` with none, whatever was read before; tokens increase either way.
pub fn token_draw_settings_are_followed(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("token-draw");
    let eager = Arc::new(CountingBackend::new(f.backend()));
    let lazy = Arc::new(CountingBackend::new(f.backend()));
    let (e, l) = (
        counted_client(&eager, TokenDraw::AtAcquisition),
        counted_client(&lazy, TokenDraw::WhenRead),
    );
    let mut last = None;
    for i in 0..3 {
        let g = e.get_lock(&name).unwrap().lock().unwrap();
        let t = g.known_fencing_token().expect("drawn with the acquisition");
        assert!(Some(t) > last, "token {t} after {last:?}");
        last = Some(t);
        if i == 1 {
            // Read once; the other holds leave theirs unread, and each next acquisition
            // draws all the same.
            assert_eq!(g.fencing_token().unwrap(), t);
        }
        g.unlock().unwrap();
        let g = l.get_lock(&name).unwrap().lock().unwrap();
        let t = g.fencing_token().unwrap();
        assert!(Some(t) > last, "token {t} after {last:?}");
        last = Some(t);
        g.unlock().unwrap();
    }
    assert_eq!(eager.fenced_acquisitions(), 3);
    assert_eq!(lazy.fenced_acquisitions(), 0);
}
