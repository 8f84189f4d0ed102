//! No lock state is held across a backend call: while an extension or a release waits on
//! a slow server, the local questions (`is_held`, `hold_count`, a lost signal's state)
//! answer at once, the holding thread can take the lock again, and the watchdog renews
//! the client's other locks.
//!
//! The backend is dlm-memory behind a gate: the call the test picks stops at the backend
//! until the test opens the gate, so "while the call is stuck" is an ordering, not a
//! timing.
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dlm_core::backend::{
    Acquire, BackendError, Lease, LockBackend, LockName, OwnerToken, Renewal, Renewed, Watch,
};
use dlm_core::{HoldState, Lock, LockClient};
use dlm_memory::MemoryBackend;
use parking_lot::Mutex;

/// How long a test waits for something that should happen at once before it fails.
const PATIENCE: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `extend`: stops before the request reaches the store.
    Extend,
    /// `release`: the store releases, then the call stops before it returns (a slow
    /// reply).
    Release,
    /// `extend_many` (the watchdog's round): stops before the store renews anything.
    ExtendMany,
}

/// One closed gate: the first `op` on `name` tells `entered`, then waits for `open`.
#[derive(Debug)]
struct Gate {
    op: Op,
    name: String,
    entered: Sender<Vec<String>>,
    open: Receiver<()>,
}

/// The test's side of a gate.
struct GateControl {
    /// Receives the names of the call's locks when it stops at the gate.
    entered: Receiver<Vec<String>>,
    /// Dropping it opens the gate.
    open: Sender<()>,
}

/// dlm-memory with gates on chosen calls.
#[derive(Debug)]
struct Gated {
    inner: MemoryBackend,
    gates: Mutex<Vec<Gate>>,
}

impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated {
            inner: MemoryBackend::new(),
            gates: Mutex::new(Vec::new()),
        })
    }

    /// Closes a gate on the next `op` that concerns `name`.
    fn gate(&self, op: Op, name: &str) -> GateControl {
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        let (open, open_rx) = crossbeam_channel::bounded(0);
        self.gates.lock().push(Gate {
            op,
            name: name.to_owned(),
            entered: entered_tx,
            open: open_rx,
        });
        GateControl { entered, open }
    }

    /// Stops at the gate for `op` on any of `names`, if one is closed.
    fn pass(&self, op: Op, names: &[&LockName]) {
        let gate = {
            let mut gates = self.gates.lock();
            let at = gates
                .iter()
                .position(|g| g.op == op && names.iter().any(|n| n.as_str() == g.name));
            at.map(|i| gates.remove(i))
        };
        if let Some(gate) = gate {
            let _ = gate
                .entered
                .send(names.iter().map(|n| n.as_str().to_owned()).collect());
            // Returns when the test drops its sender.
            let _ = gate.open.recv();
        }
    }
}

impl LockBackend for Gated {
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
        self.pass(Op::Extend, &[name]);
        self.inner.extend(name, owner, ttl)
    }

    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        let names: Vec<&LockName> = renewals.iter().map(|r| r.name).collect();
        self.pass(Op::ExtendMany, &names);
        self.inner.extend_many(renewals, renewed)
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let released = self.inner.release(name, owner);
        self.pass(Op::Release, &[name]);
        released
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

    fn now(&self) -> Instant {
        self.inner.now()
    }
}

/// The median of `samples`.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[test]
fn is_held_answers_while_an_extension_waits_on_the_backend() {
    let backend = Gated::new();
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let lock = client.get_lock("extend-is-slow").unwrap();
    let guard = lock.lock().unwrap();
    let signal = guard.lost_signal();
    let gate = backend.gate(Op::Extend, "extend-is-slow");
    thread::scope(|s| {
        let extending = s.spawn(|| guard.extend(Duration::from_secs(120)));
        gate.entered
            .recv_timeout(PATIENCE)
            .expect("the extension reached the backend");
        // Ask from another thread, so that a blocked answer cannot hang the test.
        let (answer_tx, answer) = crossbeam_channel::bounded(1);
        let (guard, signal, lock) = (&guard, &signal, &lock);
        s.spawn(move || {
            let mut took = Vec::new();
            let mut held = true;
            for _ in 0..101 {
                let start = Instant::now();
                held &= guard.is_held();
                took.push(start.elapsed());
            }
            let state = signal.state();
            let count = lock.hold_count();
            let _ = answer_tx.send((held, state, count, median(took)));
        });
        let answered = answer.recv_timeout(PATIENCE);
        let extension_still_stuck = !extending.is_finished();
        drop(gate.open);
        let extended = extending.join().unwrap();

        let (held, state, count, took) =
            answered.expect("is_held blocked while an extension waited on the backend");
        assert!(extension_still_stuck, "answered only after the extension");
        assert!(held, "the lock is held while it is being extended");
        assert_eq!(state, HoldState::Held);
        assert_eq!(count, 0, "another thread holds no hold of it");
        eprintln!("is_held while an extension is stuck: median {took:?}");
        assert!(took < Duration::from_millis(1), "is_held took {took:?}");
        extended.expect("extended once the backend answered");
    });
    assert!(
        guard.valid_until() > Instant::now() + Duration::from_secs(90),
        "the extension's lease was recorded"
    );
    guard.unlock().unwrap();
}

#[test]
fn the_holding_thread_takes_the_lock_again_while_its_old_release_is_under_way() {
    let backend = Gated::new();
    let client = LockClient::new(backend.clone());
    let lock = client.get_lock("release-is-slow").unwrap();
    let gate = backend.gate(Op::Release, "release-is-slow");
    let rival = LockClient::new(backend.clone())
        .get_lock("release-is-slow")
        .unwrap();
    thread::scope(|s| {
        let (guard_tx, guard_rx) = crossbeam_channel::bounded(1);
        let (report_tx, report) = crossbeam_channel::bounded(1);
        // The holding thread: it acquires, hands its guard to another thread to release,
        // and while that release is stuck at the backend (the key already deleted, the
        // reply not back), asks about the lock and takes it again.
        let entered = gate.entered;
        let holder_lock = lock.clone();
        s.spawn(move || {
            let guard = holder_lock.lock().unwrap();
            let signal = guard.lost_signal();
            guard_tx.send(guard).unwrap();
            entered
                .recv_timeout(PATIENCE)
                .expect("the release reached the backend");
            let start = Instant::now();
            let count = holder_lock.hold_count();
            let held = holder_lock.is_held_by_current_thread();
            let took = start.elapsed();
            let state = signal.state();
            let again = holder_lock.try_lock().unwrap();
            let _ = report_tx.send((count, held, took, state, again, signal));
        });
        let releasing = s.spawn(move || guard_rx.recv().unwrap().unlock());
        let reported = report.recv_timeout(PATIENCE);
        let release_still_stuck = !releasing.is_finished();
        drop(gate.open);
        let released = releasing.join().unwrap();

        let (count, held, took, state, again, signal) =
            reported.expect("the holding thread blocked while its old release was under way");
        assert!(
            release_still_stuck,
            "answered only after the release returned"
        );
        assert_eq!((count, held), (0, false), "the old hold is over");
        eprintln!("hold_count while a release is stuck: {took:?}");
        assert_eq!(state, HoldState::Held, "the release is under way");
        let again = again.expect("the key was gone: the holding thread takes it again");
        released.expect("the old release succeeded");
        assert_eq!(signal.state(), HoldState::Released);
        // The old release (its own token) did not undo the new acquisition.
        assert!(again.is_held());
        assert!(lock.is_locked().unwrap(), "the new hold is at the backend");
        assert!(rival.try_lock().unwrap().is_none(), "and excludes others");
        again.unlock().unwrap();
    });
    assert!(rival.try_lock().unwrap().is_some());
}

#[test]
fn a_slow_release_does_not_hold_up_the_renewal_of_other_locks() {
    let backend = Gated::new();
    // Renewed every second; holds due within 125 ms of each other share a round.
    let client = LockClient::builder(backend.clone())
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let round = backend.gate(Op::ExtendMany, "slow-release");
    let release = backend.gate(Op::Release, "slow-release");
    // Acquired first: renewed first in the round, so its result is applied first.
    let slow = client.get_lock("slow-release").unwrap().lock().unwrap();
    let other = client.get_lock("renewed").unwrap().lock().unwrap();
    let before = other.valid_until();
    let names = round
        .entered
        .recv_timeout(PATIENCE)
        .expect("the watchdog's round reached the backend");
    assert_eq!(names, ["slow-release", "renewed"], "one round renews both");
    thread::scope(|s| {
        // While the round waits at the backend, `slow` is released; its release is stuck.
        let releasing = s.spawn(move || slow.unlock());
        release
            .entered
            .recv_timeout(PATIENCE)
            .expect("the release reached the backend");
        drop(round.open);
        // The round applies `slow`'s renewal (its hold is over: nothing to do), then
        // `other`'s, without waiting for the release.
        let deadline = Instant::now() + PATIENCE;
        while other.valid_until() <= before && Instant::now() < deadline {
            thread::yield_now();
        }
        let renewed = other.valid_until() > before;
        let release_still_stuck = !releasing.is_finished();
        drop(release.open);
        let released = releasing.join().unwrap();
        assert!(
            renewed,
            "the renewal of another lock waited for a slow release"
        );
        assert!(release_still_stuck);
        released.unwrap();
    });
    assert!(other.is_held());
    other.unlock().unwrap();
}
