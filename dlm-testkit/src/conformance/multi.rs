//! Multi-locks: every name of the set or none, no deadlock between overlapping sets taken
//! in any order, wake-ups by a release of the name waited for, a member's loss reported
//! with its name, one fencing token per name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{BackendErrorKind, Error, HoldState, Lock, LockClient};

use super::{PROMPT, assert_still_blocked, client};
use crate::counting::CountingBackend;
use crate::{Fixture, unique_name};

/// A failed or timed-out attempt at a set leaves no name of it held: one name held by
/// another client makes `try_lock` and `try_lock_timeout` of the set come back empty, and
/// the set's other names are free afterwards.
pub fn multi_lock_takes_every_name_or_none(f: &dyn Fixture) {
    let (a, b, c) = (
        unique_name("multi-a"),
        unique_name("multi-b"),
        unique_name("multi-c"),
    );
    let other = client(f);
    let held = other.get_lock(&b).unwrap().lock().unwrap();
    let set = client(f).get_multi_lock([&c, &a, &b]).unwrap();
    assert_eq!(set.names().collect::<Vec<_>>(), {
        let mut sorted = vec![a.as_str(), b.as_str(), c.as_str()];
        sorted.sort();
        sorted
    });
    assert!(
        set.try_lock().unwrap().is_none(),
        "a set with a taken name was granted"
    );
    let started = Instant::now();
    assert!(
        set.try_lock_timeout(Duration::from_millis(300))
            .unwrap()
            .is_none(),
        "a set with a taken name was granted"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "the timeout of the set was not waited out"
    );
    assert!(started.elapsed() < Duration::from_millis(300) + PROMPT);
    for name in [&a, &c] {
        let probe = client(f).get_lock(name).unwrap();
        assert!(
            probe.try_lock().unwrap().is_some(),
            "{name} stayed held after the set's attempt failed"
        );
    }
    held.unlock().unwrap();
    let guard = set.try_lock().unwrap().expect("every name is free now");
    assert!(guard.is_held());
    assert_eq!(guard.names().count(), 3);
    for name in [&a, &b, &c] {
        assert!(
            other.get_lock(name).unwrap().try_lock().unwrap().is_none(),
            "{name} is not held by the set"
        );
    }
    guard.unlock().unwrap();
    for name in [&a, &b, &c] {
        assert!(other.get_lock(name).unwrap().try_lock().unwrap().is_some());
    }
}

/// An empty set, a name given twice and a bad name are refused with a typed error before
/// any request reaches the backend.
pub fn multi_lock_refuses_bad_input_before_io(f: &dyn Fixture) {
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone()).build().unwrap();
    let name = unique_name("multi-bad");
    let bad: [Vec<String>; 3] = [
        vec![],
        vec![name.clone(), "other".into(), name.clone()],
        vec![name.clone(), "new\nline".into()],
    ];
    for names in bad {
        let e = c.get_multi_lock(&names).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(a) if ["names", "name"].contains(&a.argument())),
            "{names:?}: {e}"
        );
    }
    assert_eq!(counting.calls(), 0, "bad input reached the backend");
}

/// Two clients taking overlapping sets named in opposite orders, in a loop for 2 s: both
/// make progress, no attempt times out (no deadlock), and no name is ever held by both.
pub fn multi_locks_in_opposite_orders_never_deadlock(f: &dyn Fixture) {
    multi_locks_in_opposite_orders_for(f, Duration::from_secs(2));
}

/// [`multi_locks_in_opposite_orders_never_deadlock`] for `run_for`: the sets taken by
/// each side, which must both be above zero.
pub fn multi_locks_in_opposite_orders_for(f: &dyn Fixture, run_for: Duration) -> [u32; 2] {
    let (a, b) = (unique_name("multi-x"), unique_name("multi-y"));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(2));
    let sides: Vec<_> = [[a.clone(), b.clone()], [b, a]]
        .into_iter()
        .map(|names| {
            let set = client(f).get_multi_lock(&names).unwrap();
            let (inside, overlaps, start) = (inside.clone(), overlaps.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let until = Instant::now() + run_for;
                let (mut done, mut timed_out) = (0u32, 0u32);
                while Instant::now() < until {
                    match set.try_lock_timeout(Duration::from_secs(10)).unwrap() {
                        Some(guard) => {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            thread::yield_now();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            guard.unlock().unwrap();
                            done += 1;
                        }
                        None => timed_out += 1,
                    }
                }
                (done, timed_out)
            })
        })
        .collect();
    let results: Vec<(u32, u32)> = sides.into_iter().map(|s| s.join().unwrap()).collect();
    for (side, (done, timed_out)) in results.iter().enumerate() {
        assert_eq!(
            *timed_out, 0,
            "side {side} waited 10 s for its set: {results:?}"
        );
        assert!(*done > 0, "side {side} made no progress: {results:?}");
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "both sides held the set at once"
    );
    [results[0].0, results[1].0]
}

/// A set waiting for a name held by another client blocks, holds none of its other names
/// beyond those before it, and is woken by that name's release.
pub fn multi_lock_waits_and_is_woken_by_a_release(f: &dyn Fixture) {
    let (a, b) = (unique_name("multi-w1"), unique_name("multi-w2"));
    let held = client(f).get_lock(&b).unwrap().lock().unwrap();
    let set = client(f).get_multi_lock([&a, &b]).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let waiter = thread::spawn(move || {
        let guard = set.lock().unwrap();
        let got = Instant::now();
        tx.send(got).unwrap();
        guard.unlock().unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(300), "the set's lock()");
    let released = Instant::now();
    held.unlock().unwrap();
    let got = rx
        .recv_timeout(PROMPT)
        .expect("the set was not acquired after the release");
    waiter.join().unwrap();
    assert!(got >= released);
}

/// The loss of one name (broken by another client) is reported by the set's guard and its
/// lost signal, with the name; the other names are still released at unlock.
pub fn multi_lock_reports_which_member_was_lost(f: &dyn Fixture) {
    let (a, b) = (unique_name("multi-l1"), unique_name("multi-l2"));
    let holder = LockClient::builder(f.backend())
        .watchdog_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let guard = holder.get_multi_lock([&a, &b]).unwrap().lock().unwrap();
    let signal = guard.lost_signal();
    assert_eq!(
        signal.wait_timeout(Duration::from_millis(350)),
        HoldState::Held
    );
    assert!(guard.is_held());
    let (tx, rx) = crossbeam_channel::bounded(1);
    let watcher = {
        let signal = signal.clone();
        thread::spawn(move || tx.send(signal.wait()).unwrap())
    };
    assert!(client(f).get_lock(&b).unwrap().force_unlock().unwrap());
    let end = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the loss of a member was not signalled");
    watcher.join().unwrap();
    assert_eq!(end, HoldState::Lost);
    assert_eq!(signal.lost(), [b.as_str()]);
    assert_eq!(guard.lost(), [b.as_str()]);
    assert!(!guard.is_held());
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    // The member still held was released all the same.
    assert!(
        client(f)
            .get_lock(&a)
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some()
    );
}

/// Each name of a set gets its own fencing token, above the tokens of earlier holders of
/// that name; a set's release reads as `Released`.
pub fn multi_lock_gives_each_name_its_token(f: &dyn Fixture) {
    let (a, b) = (unique_name("multi-t1"), unique_name("multi-t2"));
    if !f.fencing() {
        let guard = client(f).get_multi_lock([&a, &b]).unwrap().lock().unwrap();
        let e = guard.fencing_tokens().unwrap_err();
        assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unsupported), "{e}");
        return;
    }
    let single = client(f);
    let mut before = HashMap::new();
    for name in [&a, &b] {
        let guard = single.get_lock(name).unwrap().lock().unwrap();
        before.insert(name.clone(), guard.fencing_token().unwrap());
    }
    let guard = client(f).get_multi_lock([&b, &a]).unwrap().lock().unwrap();
    let tokens = guard.fencing_tokens().unwrap();
    assert_eq!(tokens.len(), 2);
    for (name, token) in &tokens {
        assert!(
            *token > before[*name],
            "{name}: token {token:?} is not above the earlier holder's {:?}",
            before[*name]
        );
    }
    let signal = guard.lost_signal();
    guard.unlock().unwrap();
    assert_eq!(signal.state(), HoldState::Released);
}
