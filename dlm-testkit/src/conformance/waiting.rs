//! Conformance cases: waiting, release hints and hand-over (interrupts, wake-ups, a
//! release between a failed attempt and the wait, one release for sixteen waiters, turns
//! among local waiters, `try_lock` during a hand-over, a release that hands the lock to
//! a waiter of its own process).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use dlm_core::backend::{LockName, OwnerToken};
use dlm_core::{Error, Lock, LockClient, RetryPolicy, interrupt_pair};

use super::{PROMPT, assert_still_blocked, client, client_with_lease};
use crate::{CountingBackend, Fixture, unique_name};

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
    fn check_name(&self, name: &LockName) -> Result<(), dlm_core::InvalidArgument> {
        self.inner.check_name(name)
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

/// Threads of one process on one name, over one backend (so that a backend that hands
/// a released lock to a waiter of its own process does so): one holder at a time
/// (the history checker), fencing tokens in the order of the holds, and waiters whose
/// short waits end while the lock is being handed on (to them, perhaps) never keep it:
/// when everyone is done the lock is free.
pub fn hand_over_within_a_process_keeps_every_rule(f: &dyn Fixture) {
    const HOLDERS: usize = 4;
    const ROUNDS: usize = 100;
    const TIMID: usize = 3;
    let name = unique_name("hand-over");
    let backend = f.backend();
    let history = Arc::new(crate::history::History::new());
    let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let start = Arc::new(std::sync::Barrier::new(HOLDERS + TIMID));
    let done = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..HOLDERS {
        let lock = LockClient::new(backend.clone()).get_lock(&name).unwrap();
        let (history, tokens, start, done) =
            (history.clone(), tokens.clone(), start.clone(), done.clone());
        threads.push(thread::spawn(move || {
            start.wait();
            for _ in 0..ROUNDS {
                let g = lock.lock().unwrap();
                let hold = history.begin(format!("holder {t}"), &g);
                if let Ok(token) = g.fencing_token() {
                    tokens.lock().push(token);
                }
                history.end(hold, &g);
                g.unlock().unwrap();
            }
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let timid_holds = Arc::new(AtomicU64::new(0));
    for t in 0..TIMID {
        let lock = LockClient::new(backend.clone()).get_lock(&name).unwrap();
        let (history, tokens, start, done, timid_holds) = (
            history.clone(),
            tokens.clone(),
            start.clone(),
            done.clone(),
            timid_holds.clone(),
        );
        threads.push(thread::spawn(move || {
            start.wait();
            let mut wait = 0;
            while done.load(Ordering::SeqCst) < HOLDERS as u64 {
                // Waits of 0 to 3 ms: many end while a release is under way.
                wait = (wait + 1) % 4;
                if let Some(g) = lock.try_lock_timeout(Duration::from_millis(wait)).unwrap() {
                    let hold = history.begin(format!("timid {t}"), &g);
                    if let Ok(token) = g.fencing_token() {
                        tokens.lock().push(token);
                    }
                    history.end(hold, &g);
                    g.unlock().unwrap();
                    timid_holds.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let report = history.check();
    assert_eq!(
        report.holds as u64,
        (HOLDERS * ROUNDS) as u64 + timid_holds.load(Ordering::SeqCst)
    );
    report.assert_clean();
    let tokens = tokens.lock();
    if f.fencing() {
        assert_eq!(tokens.len(), report.holds, "every hold read its token");
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens out of the order of the holds: {tokens:?}"
        );
    }
    let lock = client(f).get_lock(&name).unwrap();
    assert_eq!(
        lock.remaining_lease().unwrap(),
        None,
        "a hold nobody owns was left behind"
    );
    assert_eq!(
        f.keys_without_expiry().unwrap_or(0),
        0,
        "every key dlm wrote has an expiry"
    );
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
    /// The store's hints, without the hand-over: the waiter behind the gate is woken to
    /// make its attempt (which the gate holds), never handed the lock while asleep.
    fn watch(&self, name: &LockName) -> Option<dlm_core::backend::Watch> {
        let inner = self.inner.watch(name)?;
        let receiver = inner.receiver().clone();
        Some(dlm_core::backend::Watch::with_unsubscribe(
            receiver,
            Box::new(WithoutHandover(inner)),
        ))
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
    fn check_name(&self, name: &LockName) -> Result<(), dlm_core::InvalidArgument> {
        self.inner.check_name(name)
    }
}

/// A store's [`Watch`](dlm_core::backend::Watch) that never offers to take the lock over.
struct WithoutHandover(dlm_core::backend::Watch);

impl dlm_core::backend::Unsubscribe for WithoutHandover {
    fn unsubscribe(self: Box<Self>, _pending_wake: bool) {
        // The store's watch sees the same channel, and passes on a pending wake-up itself.
        drop(self.0);
    }
    fn trying(&self, on: bool) {
        self.0.trying(on);
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
