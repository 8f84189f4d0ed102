//! The metrics of the front (`dlm_core::metric_names`), seen by a recording recorder
//! (metrics-util's `DebuggingRecorder`) on the memory backend: every metric, with its
//! values. Each test builds its clients inside `with_local_recorder`, so the handles are
//! that test's recorder's and tests do not see each other's counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, Lease, LockBackend, LockName, OwnerToken, Watch};
use dlm_core::metric_names as names;
use dlm_core::{
    BackendError, BackendErrorKind, Error, Lock, LockClient, LockClientBuilder, interrupt_pair,
};
use dlm_memory::{ManualClock, MemoryBackend};
use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A metric's name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

/// A recorder and what it recorded so far. The debugging recorder's snapshots are deltas
/// (counters are reset, histograms drained), so they are added up here.
struct Recorded {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
    counters: HashMap<Id, u64>,
    histograms: HashMap<Id, Vec<f64>>,
    units: HashMap<String, Option<Unit>>,
}

impl Recorded {
    fn new() -> Recorded {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Recorded {
            recorder,
            snapshotter,
            counters: HashMap::new(),
            histograms: HashMap::new(),
            units: HashMap::new(),
        }
    }

    /// Builds `b` with this recorder in place.
    fn build(&self, b: LockClientBuilder) -> LockClient {
        metrics::with_local_recorder(&self.recorder, || b.build().unwrap())
    }

    fn take(&mut self) {
        for (key, unit, description, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let (name, labels) = key.into_parts();
            let mut labels: Vec<(String, String)> = labels
                .into_iter()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let name = name.as_str().to_owned();
            assert!(description.is_some(), "{name} is not described");
            self.units.insert(name.clone(), unit);
            let id = (name, labels);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.counters.entry(id).or_default() += n;
                }
                (MetricKind::Histogram, DebugValue::Histogram(v)) => {
                    self.histograms
                        .entry(id)
                        .or_default()
                        .extend(v.into_iter().map(|x| x.into_inner()));
                }
                other => panic!("unexpected metric {id:?}: {other:?}"),
            }
        }
    }

    /// The counter `name` with exactly `labels` (besides `backend="memory"`).
    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.take();
        let id = id(name, labels);
        *self
            .counters
            .get(&id)
            .unwrap_or_else(|| panic!("no counter {id:?}; have {:?}", self.counters.keys()))
    }

    /// The values of histogram `name` (labels: `backend="memory"` only).
    fn histogram(&mut self, name: &str) -> Vec<f64> {
        self.take();
        let id = id(name, &[]);
        self.histograms
            .get(&id)
            .unwrap_or_else(|| panic!("no histogram {id:?}"))
            .clone()
    }

    /// Every counter with a value above zero, with its value.
    fn nonzero(&mut self) -> Vec<(Id, u64)> {
        self.take();
        let mut v: Vec<_> = self
            .counters
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(id, n)| (id.clone(), *n))
            .collect();
        v.sort();
        v
    }

    /// Waits (at most 10 s) until `counter(name, labels)` reaches `n`.
    fn wait_for(&mut self, name: &str, labels: &[(&str, &str)], n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.counter(name, labels) < n {
            assert!(
                Instant::now() < deadline,
                "{name} {labels:?} stayed below {n}"
            );
            thread::sleep(Duration::from_millis(2));
        }
    }
}

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .chain([(names::BACKEND.to_owned(), "memory".to_owned())])
        .collect();
    l.sort();
    (name.to_owned(), l)
}

const ACQUIRED: &[(&str, &str)] = &[(names::OUTCOME, "acquired")];
const TIMED_OUT: &[(&str, &str)] = &[(names::OUTCOME, "timed_out")];
const INTERRUPTED: &[(&str, &str)] = &[(names::OUTCOME, "interrupted")];
const FAILED: &[(&str, &str)] = &[(names::OUTCOME, "failed")];
const OK: &[(&str, &str)] = &[(names::OUTCOME, "ok")];
const NOT_OK: &[(&str, &str)] = &[(names::OUTCOME, "failed")];

fn fixed(backend: Arc<MemoryBackend>) -> LockClientBuilder {
    LockClient::builder(backend).lease(Duration::from_secs(30))
}

#[test]
fn an_acquisition_counts_once_with_its_wait_and_hold_time_and_reentry_is_not_counted() {
    let mut r = Recorded::new();
    let client = r.build(LockClient::builder(MemoryBackend::new()));
    let lock = client.get_lock("m-acquired").unwrap();
    let outer = Instant::now();
    let guard = lock.lock().unwrap();
    let again = lock.lock().unwrap(); // re-entry: local, not an acquisition
    thread::sleep(Duration::from_millis(20)); // a hold of at least 20 ms, to measure
    drop(again);
    guard.unlock().unwrap();
    let span = outer.elapsed().as_secs_f64();

    assert_eq!(r.counter(names::ACQUISITIONS, ACQUIRED), 1);
    for outcome in [TIMED_OUT, INTERRUPTED, FAILED] {
        assert_eq!(r.counter(names::ACQUISITIONS, outcome), 0);
    }
    let wait = r.histogram(names::ACQUIRE_WAIT);
    assert_eq!(wait.len(), 1);
    assert!(
        wait[0] >= 0.0 && wait[0] < span,
        "wait {wait:?}, span {span}"
    );
    let hold = r.histogram(names::HOLD);
    assert_eq!(hold.len(), 1, "one hold (the re-entry is part of it)");
    assert!(
        hold[0] >= 0.020 && hold[0] <= span,
        "hold {hold:?}, span {span}"
    );
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 0);
    assert_eq!(
        r.nonzero(),
        vec![(id(names::ACQUISITIONS, ACQUIRED), 1)],
        "nothing else counted"
    );
    // Described once, with units.
    assert_eq!(r.units[names::ACQUIRE_WAIT], Some(Unit::Seconds));
    assert_eq!(r.units[names::HOLD], Some(Unit::Seconds));
    assert_eq!(r.units[names::ACQUISITIONS], Some(Unit::Count));
}

#[test]
fn a_timed_out_acquisition_counts_once_as_timed_out() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let holder = r.build(fixed(backend.clone()));
    let other = r.build(fixed(backend));
    let guard = holder.get_lock("m-timeout").unwrap().lock().unwrap();
    let lock = other.get_lock("m-timeout").unwrap();
    assert!(
        lock.try_lock_timeout(Duration::from_millis(30))
            .unwrap()
            .is_none()
    );
    assert_eq!(r.counter(names::ACQUISITIONS, TIMED_OUT), 1);
    assert!(lock.try_lock().unwrap().is_none()); // one attempt, held: timed out too
    assert_eq!(r.counter(names::ACQUISITIONS, TIMED_OUT), 2);
    assert_eq!(
        r.counter(names::ACQUISITIONS, ACQUIRED),
        1,
        "the holder's only"
    );
    assert_eq!(r.counter(names::ACQUISITIONS, FAILED), 0);
    assert_eq!(
        r.histogram(names::ACQUIRE_WAIT).len(),
        1,
        "the holder's only"
    );
    drop(guard);
}

#[test]
fn interrupted_acquisitions_count_as_interrupted() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let holder = r.build(fixed(backend.clone()));
    let other = r.build(fixed(backend.clone()));
    let _guard = holder.get_lock("m-int").unwrap().lock().unwrap();
    let lock = other.get_lock("m-int").unwrap();

    // Interrupted before the call.
    let (interrupter, interrupt) = interrupt_pair();
    interrupter.interrupt();
    assert!(matches!(
        lock.lock_interruptibly(&interrupt),
        Err(Error::Interrupted)
    ));
    assert_eq!(r.counter(names::ACQUISITIONS, INTERRUPTED), 1);

    // Interrupted while it waits (subscribed: its attempts are over).
    let (interrupter, interrupt) = interrupt_pair();
    let waiter = thread::spawn(move || lock.lock_interruptibly(&interrupt).map(drop));
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.watchers("m-int") == 0 {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        thread::yield_now();
    }
    interrupter.interrupt();
    assert!(matches!(waiter.join().unwrap(), Err(Error::Interrupted)));
    assert_eq!(r.counter(names::ACQUISITIONS, INTERRUPTED), 2);
    assert_eq!(r.counter(names::ACQUISITIONS, TIMED_OUT), 0);
    assert_eq!(r.counter(names::ACQUISITIONS, FAILED), 0);
}

#[test]
fn backend_errors_count_by_kind_and_a_failed_acquisition_once() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let client = r.build(fixed(backend.clone()));
    let lock = client.get_lock("m-err").unwrap();

    // Not transient: the acquisition fails. The injected fault says the request was
    // never sent, so there is nothing to clean up (no release is sent).
    backend.faults().fail_next(2, BackendErrorKind::Auth);
    assert!(lock.lock().is_err());
    assert_eq!(r.counter(names::ACQUISITIONS, FAILED), 1);
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "auth")]),
        1
    );
    backend.faults().fail_next(0, BackendErrorKind::Auth);
    // A reply lost after the store took it: the clean-up release is sent (and counted
    // nowhere: it succeeds).
    backend.faults().lose_replies(1);
    assert!(lock.try_lock().is_err());
    assert_eq!(r.counter(names::ACQUISITIONS, FAILED), 2);
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "timeout")]),
        1
    );
    assert!(
        !lock.is_locked().unwrap(),
        "the lost reply's grant was left"
    );

    // Transient, then fine: retried within the wait, acquired; each error counts.
    backend.faults().fail_next(3, BackendErrorKind::Unavailable);
    let guard = lock.lock().unwrap();
    assert_eq!(r.counter(names::ACQUISITIONS, ACQUIRED), 1);
    assert_eq!(r.counter(names::ACQUISITIONS, FAILED), 2);
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "unavailable")]),
        3
    );

    // A failing release and a failing inspection count too.
    backend.faults().fail_next(1, BackendErrorKind::NoQuorum);
    assert!(lock.is_locked().is_err());
    backend.faults().fail_next(1, BackendErrorKind::Timeout);
    assert!(guard.unlock().is_err());
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "no_quorum")]),
        1
    );
    // The lost reply's and the release's (sent again in the background, which succeeds).
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "timeout")]),
        2
    );
    assert_eq!(client.flush_releases(Duration::from_secs(5)), 0);
    assert!(
        !lock.is_locked().unwrap(),
        "the failed release was not sent again"
    );
    assert_eq!(
        r.histogram(names::HOLD).len(),
        1,
        "a release, if a failed one"
    );
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 0);
}

/// The memory backend, counting the acquisition attempts that have returned.
#[derive(Debug)]
struct Answered {
    inner: MemoryBackend,
    attempts: AtomicU64,
}

impl LockBackend for Answered {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let r = self.inner.try_acquire(name, owner, ttl);
        self.attempts.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.inner.extend(name, owner, ttl)
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
    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.inner.watch(name)
    }
    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner.wake_pending(name)
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

#[test]
fn a_release_hint_that_wakes_a_waiter_counts_one_handover_wakeup() {
    let mut r = Recorded::new();
    let backend = Arc::new(Answered {
        inner: MemoryBackend::new(),
        attempts: AtomicU64::new(0),
    });
    let holder = r.build(LockClient::builder(backend.clone()).lease(Duration::from_secs(30)));
    let other = r.build(LockClient::builder(backend.clone()).lease(Duration::from_secs(30)));
    let guard = holder.get_lock("m-wake").unwrap().lock().unwrap();
    let lock = other.get_lock("m-wake").unwrap();
    let before = backend.attempts.load(Ordering::SeqCst);
    let waiter = thread::spawn(move || lock.lock().map(|g| g.unlock()));
    // It attempts, subscribes, attempts again, then sleeps until the hint (the holder's
    // lease is 30 s). Once its second attempt has returned, it makes no request before
    // the hint: a release now reaches it as a hint, which it waits for.
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.attempts.load(Ordering::SeqCst) < before + 2 {
        assert!(Instant::now() < deadline, "the waiter never settled");
        thread::yield_now();
    }
    assert_eq!(r.counter(names::HANDOVER_WAKEUPS, &[]), 0);
    guard.unlock().unwrap();
    waiter.join().unwrap().unwrap().unwrap();
    assert_eq!(r.counter(names::HANDOVER_WAKEUPS, &[]), 1);
    assert_eq!(r.counter(names::ACQUISITIONS, ACQUIRED), 2);
    let wait = r.histogram(names::ACQUIRE_WAIT);
    assert_eq!(wait.len(), 2);
}

#[test]
fn renewals_count_ok_and_failed_and_a_lost_lock_counts_once() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let client =
        r.build(LockClient::builder(backend.clone()).watchdog_timeout(Duration::from_millis(600)));
    let guard = client.get_lock("m-renew").unwrap().lock().unwrap();
    // The watchdog renews every 200 ms (a lease of 600 ms: room for a slow machine).
    r.wait_for(names::RENEWALS, OK, 2);
    guard.extend(Duration::from_millis(600)).unwrap();
    let ok = r.counter(names::RENEWALS, OK);
    assert!(ok >= 3, "{ok}");

    // Gone (as if its lease ran out at the server): the next renewal finds it gone.
    assert!(backend.expire_now("m-renew"));
    r.wait_for(names::LOCKS_LOST, &[], 1);
    assert_eq!(r.counter(names::RENEWALS, NOT_OK), 1);
    assert!(!guard.is_held());
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 1, "counted once");
    assert_eq!(r.histogram(names::HOLD).len(), 1);
}

#[test]
fn a_failed_extension_counts_as_a_failed_renewal_and_an_error_of_its_kind() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    // A fixed lease: no watchdog, so the injected fault meets the extension.
    let client = r.build(fixed(backend.clone()));
    let guard = client.get_lock("m-extend").unwrap().lock().unwrap();
    backend.faults().fail_next(1, BackendErrorKind::Busy);
    assert!(guard.extend(Duration::from_secs(30)).is_err());
    assert_eq!(r.counter(names::RENEWALS, NOT_OK), 1);
    assert_eq!(r.counter(names::RENEWALS, OK), 0);
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "busy")]),
        1
    );
    assert!(guard.is_held(), "an error is not a loss");
    guard.extend(Duration::from_secs(30)).unwrap();
    assert_eq!(r.counter(names::RENEWALS, OK), 1);
    guard.unlock().unwrap();
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 0);
}

#[test]
fn renewals_that_fail_until_the_lease_ends_lose_the_lock_once() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let client =
        r.build(LockClient::builder(backend.clone()).watchdog_timeout(Duration::from_millis(60)));
    let guard = client.get_lock("m-fail").unwrap().lock().unwrap();
    backend
        .faults()
        .fail_next(u64::MAX, BackendErrorKind::Unavailable);
    r.wait_for(names::LOCKS_LOST, &[], 1);
    let failed = r.counter(names::RENEWALS, NOT_OK);
    assert!(failed >= 1);
    assert_eq!(
        r.counter(names::BACKEND_ERRORS, &[(names::KIND, "unavailable")]),
        failed,
        "one error per failed renewal"
    );
    backend.faults().fail_next(0, BackendErrorKind::Unavailable);
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 1);
}

#[test]
fn a_lease_that_ran_out_before_the_release_counts_as_lost() {
    let mut r = Recorded::new();
    let clock = ManualClock::new();
    let backend = Arc::new(MemoryBackend::builder().clock(clock.clone()).build());
    let client = r.build(LockClient::builder(backend).lease(Duration::from_secs(1)));
    let lock = client.get_lock("m-expired").unwrap();
    let guard = lock.lock().unwrap();
    clock.advance(Duration::from_secs(2));
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 1);

    // Re-entry after the lease ran out drops the old hold (lost) and acquires afresh.
    let old = lock.lock().unwrap();
    clock.advance(Duration::from_secs(2));
    let new = lock.lock().unwrap();
    assert_eq!(r.counter(names::LOCKS_LOST, &[]), 2);
    assert_eq!(r.counter(names::ACQUISITIONS, ACQUIRED), 3);
    assert!(matches!(old.unlock(), Err(Error::LockLost)));
    new.unlock().unwrap();
    assert_eq!(
        r.counter(names::LOCKS_LOST, &[]),
        2,
        "the stale guard counts no more"
    );
}

#[test]
fn lock_names_are_a_label_only_when_asked_for() {
    let mut r = Recorded::new();
    let backend = Arc::new(MemoryBackend::new());
    let named = r.build(fixed(backend.clone()).metrics_lock_names(true));
    // A lock's own metrics are registered when its first handle is made.
    let lock = metrics::with_local_recorder(&r.recorder, || named.get_lock("m-named").unwrap());
    lock.lock().unwrap().unlock().unwrap();
    assert_eq!(
        r.counter(
            names::ACQUISITIONS,
            &[(names::OUTCOME, "acquired"), (names::LOCK, "m-named")]
        ),
        1
    );
    let plain = r.build(fixed(backend));
    plain
        .get_lock("m-plain")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    assert_eq!(r.counter(names::ACQUISITIONS, ACQUIRED), 1);
    assert!(
        r.counters
            .keys()
            .all(|(_, labels)| labels.iter().all(|(_, v)| v != "m-plain")),
        "a name label without the option"
    );
}

#[test]
fn metrics_off_registers_nothing() {
    let mut r = Recorded::new();
    let client = r.build(LockClient::builder(MemoryBackend::new()).metrics(false));
    client
        .get_lock("m-off")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    r.take();
    assert!(r.counters.is_empty() && r.histograms.is_empty());
}

#[test]
fn a_client_built_before_the_recorder_reports_nothing_to_it() {
    let early = LockClient::new(MemoryBackend::new());
    let mut r = Recorded::new();
    metrics::with_local_recorder(&r.recorder, || {
        early
            .get_lock("m-early")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    });
    r.take();
    assert!(r.counters.is_empty());
}
