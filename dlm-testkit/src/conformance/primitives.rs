//! Conformance cases of the semaphore and the read-write lock: admission (at most N
//! permits, readers beside readers, a writer alone, checked by the history checker under
//! 8 threads of 2 clients), a writer not starved by readers, leases (a leaked permit
//! comes back, the watchdog keeps a live one), wake-ups, the typed refusals (another
//! permit count, a second permit, an upgrade), downgrade, fencing order, and no key
//! left without an expiry. A backend that keeps neither runs only
//! [`unsupported_primitives_are_refused_at_the_call`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{Claim, LockName, WRITER_MARK};
use dlm_core::{BackendErrorKind, Deadlock, Error, LockClient, LockGuard, RetryPolicy};

use super::{PROMPT, assert_still_blocked, client, client_with_lease};
use crate::history::History;
use crate::{Fixture, unique_name};

/// Work inside a hold: long enough for holds of several threads to overlap on a backend
/// whose acquisition takes a few ms (etcd: with 2 ms, one permit too many went unseen in
/// 4 runs).
const WORK: Duration = Duration::from_millis(10);

/// The backend error kind of `e`, if it is a backend error.
fn kind(e: &Error) -> Option<BackendErrorKind> {
    e.backend().map(|b| b.kind())
}

/// A backend that keeps neither primitive refuses them with a typed error when the handle
/// is made (no I/O, no silent mutex in their place).
pub fn unsupported_primitives_are_refused_at_the_call(f: &dyn Fixture) {
    let c = client(f);
    let backend = f.backend();
    for (claim, made) in [
        (
            Claim::Permit { permits: 2 },
            c.get_semaphore("unsupported", 2).map(drop),
        ),
        (Claim::Write, c.get_rw_lock("unsupported").map(drop)),
    ] {
        if backend.supports(claim) {
            made.unwrap_or_else(|e| panic!("{claim}: supported, yet refused: {e}"));
        } else {
            let e = made.expect_err("an unsupported primitive was handed out");
            assert_eq!(kind(&e), Some(BackendErrorKind::Unsupported), "{e}");
        }
    }
}

/// Bad input is refused before any I/O: no permits, a bad name.
pub fn primitives_refuse_bad_input(f: &dyn Fixture) {
    let c = client(f);
    assert!(
        c.get_semaphore("jobs", 0)
            .unwrap_err()
            .is_invalid_argument()
    );
    assert!(c.get_semaphore("", 1).unwrap_err().is_invalid_argument());
    assert!(c.get_rw_lock("").unwrap_err().is_invalid_argument());
    assert!(
        c.get_semaphore("jobs", 1)
            .unwrap()
            .with_lease(Duration::ZERO)
            .unwrap_err()
            .is_invalid_argument()
    );
}

/// 8 threads of 2 clients take permits of a 3-permit semaphore: never more than 3
/// holders at once (history checker), and more than one at once (it is not a mutex).
pub fn semaphore_admits_at_most_its_permits(f: &dyn Fixture) {
    let name = unique_name("sem-admit");
    let history = Arc::new(History::new());
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let clients = [client(f), client(f)];
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let sem = clients[i % 2].get_semaphore(&name, 3).unwrap();
            let (history, inside, most) = (history.clone(), inside.clone(), most.clone());
            thread::spawn(move || {
                for _ in 0..15 {
                    let asked = Instant::now();
                    let g = sem.acquire().unwrap();
                    let hold = history.begin_asked(format!("thread {i}"), &g, asked);
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(WORK);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    history.end(hold, &g);
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = history.check();
    assert_eq!(report.holds, 120);
    report.assert_clean();
    let most = most.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&most),
        "{most} holders at once of a 3-permit semaphore"
    );
}

/// The permit count is fixed while a permit is held: another count is a `Conflict`, and
/// once every permit is back a new count is taken.
pub fn semaphore_permit_count_is_fixed_while_held(f: &dyn Fixture) {
    let name = unique_name("sem-count");
    let two = client(f).get_semaphore(&name, 2).unwrap();
    let three = client(f).get_semaphore(&name, 3).unwrap();
    let g = two.acquire().unwrap();
    let e = three
        .try_acquire()
        .expect_err("another permit count was accepted");
    assert_eq!(kind(&e), Some(BackendErrorKind::Conflict), "{e}");
    assert!(!e.is_transient());
    // Every backend's message names the semaphore and both counts.
    let said = e.to_string();
    assert!(
        said.contains(&format!(
            "the semaphore {name} is held with 2 permits, not 3"
        )),
        "the conflict does not name the semaphore and its counts: {said}"
    );
    g.unlock().unwrap();
    let g = three.try_acquire().unwrap().expect("a free semaphore");
    assert_eq!(
        kind(&two.try_acquire().unwrap_err()),
        Some(BackendErrorKind::Conflict)
    );
    g.unlock().unwrap();
}

/// A second permit asked for by a thread that holds one is refused at once; another
/// thread of the same client takes one.
pub fn semaphore_second_permit_on_a_thread_is_refused(f: &dyn Fixture) {
    let name = unique_name("sem-second");
    let sem = client(f).get_semaphore(&name, 2).unwrap();
    let g = sem.acquire().unwrap();
    assert!(sem.is_held_by_current_thread());
    assert!(matches!(
        sem.try_acquire(),
        Err(Error::WouldDeadlock(Deadlock::SecondPermit))
    ));
    let other = sem.clone();
    let from_another_thread = thread::spawn(move || other.try_acquire().unwrap().map(drop));
    assert!(from_another_thread.join().unwrap().is_some());
    assert_eq!(sem.holders().unwrap(), 1);
    g.unlock().unwrap();
    assert!(!sem.is_held_by_current_thread());
}

/// A permit whose holder vanished (a leaked guard, as a killed process leaves) comes back
/// when its lease ends, not before.
pub fn semaphore_leaked_permit_comes_back_with_its_lease(f: &dyn Fixture) {
    let name = unique_name("sem-leak");
    let lease = Duration::from_millis(300);
    let sem = client_with_lease(f, lease).get_semaphore(&name, 1).unwrap();
    std::mem::forget(sem.acquire().unwrap());
    let other = client(f).get_semaphore(&name, 1).unwrap();
    assert!(other.try_acquire().unwrap().is_none());
    let started = Instant::now();
    let g = other
        .try_acquire_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("a leaked permit kept beyond its lease");
    assert!(started.elapsed() < lease + PROMPT);
    g.unlock().unwrap();
}

/// The watchdog keeps a live permit for several times its timeout.
pub fn semaphore_watchdog_keeps_a_permit(f: &dyn Fixture) {
    let name = unique_name("sem-watchdog");
    let timeout = Duration::from_millis(300);
    let holder = LockClient::builder(f.backend())
        .watchdog_timeout(timeout)
        .build()
        .unwrap()
        .get_semaphore(&name, 1)
        .unwrap();
    let g = holder.acquire().unwrap();
    let other = client(f).get_semaphore(&name, 1).unwrap();
    assert!(
        other.try_acquire_timeout(timeout * 4).unwrap().is_none(),
        "the watchdog let the permit expire"
    );
    assert!(g.is_held());
    g.unlock().unwrap();
    assert!(other.try_acquire().unwrap().is_some());
}

/// A client whose waits poll only every 10 s: a prompt acquisition shows a wake-up.
fn slow_poller(f: &dyn Fixture) -> LockClient {
    let slow = RetryPolicy::new()
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .unwrap();
    LockClient::builder(f.backend())
        .retry(slow)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Runs `wait` on a thread, checks that it is blocked, runs `release`, and asserts that
/// the waiter got in promptly (a release wake-up, not a poll).
fn assert_woken(
    what: &str,
    wait: impl FnOnce() -> Option<LockGuard> + Send + 'static,
    release: impl FnOnce(),
) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let t = thread::spawn(move || {
        let got = wait();
        tx.send(Instant::now()).unwrap();
        got.unwrap_or_else(|| panic!("timed out")).unlock().unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(200), what);
    let released = Instant::now();
    release();
    let acquired = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    // Waits poll every 10 s, and a refused writer comes back after 1 s: only a wake-up
    // is this quick.
    assert!(
        acquired - released < Duration::from_millis(300),
        "{what}: took {:?} to notice the release",
        acquired - released
    );
    t.join().unwrap();
}

/// A released permit wakes a waiter at once.
pub fn semaphore_release_wakes_a_waiter(f: &dyn Fixture) {
    if !f.watch() {
        let name = LockName::new("x").unwrap();
        let watch = f.backend().watch_group(&name, Claim::Permit { permits: 1 });
        return assert!(watch.is_none(), "a fixture without hints gave a watch");
    }
    let name = unique_name("sem-wake");
    let held = client(f)
        .get_semaphore(&name, 1)
        .unwrap()
        .acquire()
        .unwrap();
    let waiter = slow_poller(f).get_semaphore(&name, 1).unwrap();
    assert_woken(
        "permit waiter",
        move || waiter.try_acquire_timeout(Duration::from_secs(20)).unwrap(),
        || held.unlock().unwrap(),
    );
}

/// Readers and writers of 8 threads of 2 clients: never a writer beside anyone (history
/// checker), and readers beside readers.
pub fn rw_readers_share_and_a_writer_is_alone(f: &dyn Fixture) {
    let name = unique_name("rw-admit");
    let history = Arc::new(History::new());
    let readers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let clients = [client(f), client(f)];
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let rw = clients[i % 2].get_rw_lock(&name).unwrap();
            let (history, readers, most) = (history.clone(), readers.clone(), most_readers.clone());
            thread::spawn(move || {
                for round in 0..12 {
                    if (i + round) % 4 == 0 {
                        let g = rw.write().unwrap();
                        let hold = history.begin(format!("writer {i}"), &g);
                        thread::sleep(WORK);
                        history.end(hold, &g);
                        g.unlock().unwrap();
                    } else {
                        let asked = Instant::now();
                        let g = rw.read().unwrap();
                        let hold = history.begin_asked(format!("reader {i}"), &g, asked);
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        thread::sleep(WORK * 2);
                        readers.fetch_sub(1, Ordering::SeqCst);
                        history.end(hold, &g);
                        g.unlock().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = history.check();
    assert_eq!(report.holds, 96);
    report.assert_clean();
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never held the lock together"
    );
}

/// Four threads keep the lock read-held without a gap (each reader takes its next hold
/// before another's ends); a writer that asks still gets in within a bound: new readers
/// wait behind it, the readers inside drain.
pub fn rw_a_writer_is_not_starved_by_readers(f: &dyn Fixture) {
    let name = unique_name("rw-starve");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let rw = client(f).get_rw_lock(&name).unwrap();
            let (stop, reads) = (stop.clone(), reads.clone());
            thread::spawn(move || {
                // Staggered so that some reader always holds.
                thread::sleep(Duration::from_millis(10 * i));
                while !stop.load(Ordering::Acquire) {
                    if let Some(g) = rw.try_read_timeout(Duration::from_millis(100)).unwrap() {
                        reads.fetch_add(1, Ordering::Relaxed);
                        thread::sleep(Duration::from_millis(40));
                        g.unlock().unwrap();
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reads.load(Ordering::Relaxed) < 8 {
        assert!(Instant::now() < deadline, "the readers did not get going");
        thread::sleep(Duration::from_millis(5));
    }
    let writer = client(f).get_rw_lock(&name).unwrap();
    let asked = Instant::now();
    let got = writer.try_write_timeout(Duration::from_secs(10)).unwrap();
    let waited = asked.elapsed();
    stop.store(true, Ordering::Release);
    let g = got.expect("the writer was starved by readers for 10 s");
    // One read hold (40 ms) plus the hand-over, with a wide margin for a loaded machine.
    assert!(waited < PROMPT, "the writer waited {waited:?}");
    drop(g);
    for t in readers {
        t.join().unwrap();
    }
}

/// A writer that gives up (a failed `try_write`) holds new readers back for at most
/// [`WRITER_MARK`].
pub fn rw_a_writer_that_gave_up_holds_readers_back_briefly(f: &dyn Fixture) {
    let name = unique_name("rw-gaveup");
    let reader = client(f).get_rw_lock(&name).unwrap();
    let r = reader.read().unwrap();
    let writer = client(f).get_rw_lock(&name).unwrap();
    assert!(writer.try_write().unwrap().is_none());
    let late = client(f).get_rw_lock(&name).unwrap();
    assert!(
        late.try_read().unwrap().is_none(),
        "a new reader got in while a writer waits"
    );
    let asked = Instant::now();
    let got = late
        .try_read_timeout(WRITER_MARK + Duration::from_secs(10))
        .unwrap()
        .expect("readers stayed blocked by a writer that gave up");
    assert!(asked.elapsed() < WRITER_MARK + PROMPT);
    drop((r, got));
}

/// Upgrade is refused with a typed error; re-entry counts; a writer's thread may read;
/// downgrade turns the write hold into a read hold at once, keeping its token.
pub fn rw_upgrade_is_refused_and_downgrade_keeps_the_hold(f: &dyn Fixture) {
    let name = unique_name("rw-grade");
    let rw = client(f).get_rw_lock(&name).unwrap();
    let other = client(f).get_rw_lock(&name).unwrap();
    let r1 = rw.read().unwrap();
    let r2 = rw.read().unwrap(); // counted on the first
    assert!(matches!(
        rw.try_write(),
        Err(Error::WouldDeadlock(Deadlock::Upgrade))
    ));
    drop((r1, r2));
    let w = rw.write().unwrap();
    let w_token = w.fencing_token().ok();
    let inner_read = rw.read().unwrap(); // a writer's thread may read
    assert_eq!(inner_read.claim(), Claim::Write);
    drop(inner_read);
    assert!(other.try_read().unwrap().is_none());
    let r = w.downgrade().unwrap();
    assert_eq!(r.claim(), Claim::Read);
    assert!(r.is_held());
    assert_eq!(r.fencing_token().ok(), w_token);
    let joined = other
        .try_read()
        .unwrap()
        .expect("a reader joins a downgraded hold");
    let third = client(f).get_rw_lock(&name).unwrap();
    assert!(
        third.try_write().unwrap().is_none(),
        "a writer beside readers"
    );
    drop(joined);
    r.unlock().unwrap();
    assert!(third.try_write_timeout(PROMPT).unwrap().is_some());
}

/// A released write wakes the waiting readers; the last reader's release wakes a waiting
/// writer.
pub fn rw_release_wakes_readers_and_writers(f: &dyn Fixture) {
    if !f.watch() {
        let watch = f
            .backend()
            .watch_group(&LockName::new("x").unwrap(), Claim::Read);
        return assert!(watch.is_none(), "a fixture without hints gave a watch");
    }
    let name = unique_name("rw-wake");
    let w = client(f).get_rw_lock(&name).unwrap().write().unwrap();
    let reader = slow_poller(f).get_rw_lock(&name).unwrap();
    assert_woken(
        "reader behind a writer",
        move || reader.try_read_timeout(Duration::from_secs(20)).unwrap(),
        || w.unlock().unwrap(),
    );
    let r = client(f).get_rw_lock(&name).unwrap().read().unwrap();
    let writer = slow_poller(f).get_rw_lock(&name).unwrap();
    assert_woken(
        "writer behind a reader",
        move || {
            writer
                .try_write_timeout(Duration::from_secs(20))
                .unwrap()
                .map(|w| w.downgrade().unwrap())
        },
        || r.unlock().unwrap(),
    );
}

/// Fencing tokens: each permit's larger than the permits' before it; a read's larger
/// than the writes' before it, a write's larger than everything before it.
pub fn primitive_tokens_increase(f: &dyn Fixture) {
    if !f.fencing() {
        let sem = client(f)
            .get_semaphore(&unique_name("sem-token"), 1)
            .unwrap();
        let e = sem.acquire().unwrap().fencing_token().unwrap_err();
        return assert_eq!(kind(&e), Some(BackendErrorKind::Unsupported), "{e}");
    }
    let sem = client(f)
        .get_semaphore(&unique_name("sem-token"), 2)
        .unwrap();
    let mut last = 0;
    for _ in 0..5 {
        let g = sem.acquire().unwrap();
        let t = g.fencing_token().unwrap().get();
        assert!(t > last, "permit token {t} after {last}");
        last = t;
    }
    let rw = client(f).get_rw_lock(&unique_name("rw-token")).unwrap();
    let mut last = 0;
    for round in 0..6 {
        let t = if round % 2 == 0 {
            rw.write().unwrap().fencing_token().unwrap().get()
        } else {
            rw.read().unwrap().fencing_token().unwrap().get()
        };
        assert!(t > last, "round {round}: token {t} after {last}");
        last = t;
    }
}

/// After holds, waits, a refused writer, a downgrade and releases, no key of the backend
/// is left without an expiry.
pub fn primitives_leave_no_key_without_expiry(f: &dyn Fixture) {
    let unexpiring = || f.keys_without_expiry().unwrap_or(0);
    let sem = client(f).get_semaphore(&unique_name("sem-ttl"), 2).unwrap();
    let rw = client(f).get_rw_lock(&unique_name("rw-ttl")).unwrap();
    let other = client(f).get_rw_lock(rw.name()).unwrap();
    let p = sem.acquire().unwrap();
    let _ = p.fencing_token();
    let r = rw.read().unwrap();
    assert!(other.try_write().unwrap().is_none()); // leaves the writer's mark
    assert_eq!(unexpiring(), 0);
    drop(r);
    let w = other.write().unwrap();
    let r = w.downgrade().unwrap();
    assert_eq!(unexpiring(), 0);
    drop((p, r));
    assert_eq!(unexpiring(), 0);
}
