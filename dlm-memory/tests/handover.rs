//! A release handing the lock to a waiting thread of the same store, in the same step:
//! the waiter holds it without a request of its own, with a larger token; and when that
//! step's reply is lost, the waiter undoes what it may have been given.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{LockBackend, LockName};
use dlm_core::{Lock, LockClient};
use dlm_memory::MemoryBackend;

/// Waits until a waiter of `name` is asleep offering to take the lock over.
fn until_offered(backend: &MemoryBackend, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.offers(name) == 0 {
        assert!(Instant::now() < deadline, "the waiter never went to sleep");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A holder of "job" and a thread of another client of the same store asleep waiting
/// for it (offering to take it over). The waiter sends the fencing token it gets, then
/// keeps the lock until `go`.
struct Scene {
    backend: MemoryBackend,
    held: dlm_core::LockGuard,
    first: dlm_core::FencingToken,
    taken: crossbeam_channel::Receiver<dlm_core::FencingToken>,
    go: crossbeam_channel::Sender<()>,
    waiting: thread::JoinHandle<()>,
}

impl Scene {
    fn new() -> Scene {
        let backend = MemoryBackend::new();
        let shared = Arc::new(backend.clone());
        let held = LockClient::new(shared.clone())
            .get_lock("job")
            .unwrap()
            .lock()
            .unwrap();
        let first = held.fencing_token().unwrap();
        let lock = LockClient::new(shared).get_lock("job").unwrap();
        let (tx, taken) = crossbeam_channel::bounded(1);
        let (go, release) = crossbeam_channel::bounded::<()>(1);
        let waiting = thread::spawn(move || {
            let g = lock
                .try_lock_timeout(Duration::from_secs(30))
                .unwrap()
                .unwrap();
            tx.send(g.fencing_token().unwrap()).unwrap();
            release.recv().unwrap();
            g.unlock().unwrap();
        });
        until_offered(&backend, "job");
        Scene {
            backend,
            held,
            first,
            taken,
            go,
            waiting,
        }
    }

    /// Lets the waiter release, and returns whether the lock is free afterwards.
    fn end_parts(
        backend: MemoryBackend,
        go: crossbeam_channel::Sender<()>,
        waiting: thread::JoinHandle<()>,
    ) -> bool {
        go.send(()).unwrap();
        waiting.join().unwrap();
        backend
            .inspect(&LockName::new("job").unwrap())
            .unwrap()
            .is_none()
    }
}

#[test]
fn a_release_hands_the_lock_to_a_sleeping_waiter_without_its_own_attempt() {
    let scene = Scene::new();
    let calls = scene.backend.faults().calls();
    let first = scene.first;
    scene.held.unlock().unwrap();
    let second = scene
        .taken
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter took it");
    assert_eq!(
        scene.backend.faults().calls() - calls,
        1,
        "the release handed it over: the waiter sent nothing"
    );
    assert!(second > first, "token {second} after {first}");
    let Scene {
        backend,
        go,
        waiting,
        ..
    } = scene;
    assert!(Scene::end_parts(backend, go, waiting));
}

#[test]
fn a_hand_over_whose_reply_was_lost_leaves_no_hold_nobody_owns() {
    let scene = Scene::new();
    let first = scene.first;
    // The hand-over is applied and its reply lost: the releasing holder gets an error,
    // the waiter does not know whether its token holds the lock.
    scene.backend.faults().lose_replies(1);
    assert!(scene.held.unlock().is_err(), "the release's reply was lost");
    let second = scene
        .taken
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter undid its token and took the lock afresh");
    assert!(second > first, "token {second} after {first}");
    let Scene {
        backend,
        go,
        waiting,
        ..
    } = scene;
    assert!(
        Scene::end_parts(backend, go, waiting),
        "the token the hand-over may have given is not left holding the lock"
    );
}

/// A store whose releases hand the lock over in two steps with a pause between them,
/// held open by the test: the claim of the successor, then (once the test lets it go)
/// the grant. It shows what a waiter does when its wait ends in between.
#[derive(Debug)]
struct Paused {
    inner: MemoryBackend,
    waiters: dlm_core::backend::WaitList,
    claimed: crossbeam_channel::Sender<()>,
    go: crossbeam_channel::Receiver<()>,
    /// Release, then decline the successor instead of handing the lock over.
    decline: bool,
}

impl LockBackend for Paused {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &dlm_core::backend::OwnerToken,
        ttl: Duration,
    ) -> Result<dlm_core::backend::Acquire, dlm_core::BackendError> {
        self.inner.try_acquire(name, owner, ttl)
    }
    fn extend(
        &self,
        name: &LockName,
        owner: &dlm_core::backend::OwnerToken,
        ttl: Duration,
    ) -> Result<Option<dlm_core::backend::Lease>, dlm_core::BackendError> {
        self.inner.extend(name, owner, ttl)
    }
    fn release(
        &self,
        name: &LockName,
        owner: &dlm_core::backend::OwnerToken,
    ) -> Result<bool, dlm_core::BackendError> {
        let Some(next) = self.waiters.successor() else {
            let released = self.inner.release(name, owner)?;
            self.waiters.notify_one();
            return Ok(released);
        };
        self.claimed.send(()).unwrap();
        self.go.recv().unwrap();
        // Nobody else contends here: a release and an acquisition stand for the one step.
        assert!(self.inner.release(name, owner)?);
        if self.decline {
            next.decline();
            return Ok(true);
        }
        match self.inner.try_acquire(name, next.owner(), next.ttl())? {
            dlm_core::backend::Acquire::Acquired(lease) => next.grant(lease),
            _ => next.decline(),
        }
        Ok(true)
    }
    fn force_release(&self, name: &LockName) -> Result<bool, dlm_core::BackendError> {
        self.inner.force_release(name)
    }
    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, dlm_core::BackendError> {
        self.inner.inspect(name)
    }
    fn watch(&self, _name: &LockName) -> Option<dlm_core::backend::Watch> {
        Some(self.waiters.subscribe())
    }
    fn wake_pending(&self, _name: &LockName) -> bool {
        self.waiters.wake_pending()
    }
}

/// A holder and a waiter over a [`Paused`] store; the holder's release, made on another
/// thread, has claimed the waiter as its successor and waits for the test's go.
struct Handing {
    store: Arc<Paused>,
    go: crossbeam_channel::Sender<()>,
    releasing: thread::JoinHandle<()>,
}

fn handing(waiter: impl FnOnce(LockClient) + Send + 'static) -> (Handing, thread::JoinHandle<()>) {
    handing_with(false, waiter)
}

fn handing_with(
    decline: bool,
    waiter: impl FnOnce(LockClient) + Send + 'static,
) -> (Handing, thread::JoinHandle<()>) {
    let (claimed_tx, claimed) = crossbeam_channel::bounded(1);
    let (go, go_rx) = crossbeam_channel::bounded(1);
    let store = Arc::new(Paused {
        inner: MemoryBackend::new(),
        waiters: dlm_core::backend::WaitList::new(),
        claimed: claimed_tx,
        go: go_rx,
        decline,
    });
    let held = LockClient::new(store.clone())
        .get_lock("job")
        .unwrap()
        .lock()
        .unwrap();
    let client = LockClient::new(store.clone());
    let waiting = thread::spawn(move || waiter(client));
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.waiters.offers() == 0 {
        assert!(Instant::now() < deadline, "the waiter never went to sleep");
        thread::sleep(Duration::from_millis(1));
    }
    let releasing = thread::spawn(move || held.unlock().unwrap());
    claimed
        .recv_timeout(Duration::from_secs(10))
        .expect("the release claimed the waiter");
    (
        Handing {
            store,
            go,
            releasing,
        },
        waiting,
    )
}

/// A waiter with a wait of 100 ms, its release paused by the test past that wait, then
/// let go (handing the lock over, or declining): whether the waiter came back with the
/// lock. It must not come back before the release is settled (it would leave a lock
/// handed to it to a token nobody owns), and the lock is free afterwards.
fn a_wait_that_ends_during_the_release(decline: bool) -> bool {
    const WAIT: Duration = Duration::from_millis(100);
    let (result_tx, result) = crossbeam_channel::bounded(1);
    let (h, waiting) = handing_with(decline, move |client| {
        let g = client
            .get_lock("job")
            .unwrap()
            .try_lock_timeout(WAIT)
            .unwrap();
        result_tx.send(g.is_some()).unwrap();
        if let Some(g) = g {
            g.unlock().unwrap();
        }
    });
    assert!(
        result.recv_timeout(WAIT * 3).is_err(),
        "the waiter left while the release was under way"
    );
    h.go.send(()).unwrap();
    let took = result.recv_timeout(Duration::from_secs(10)).unwrap();
    waiting.join().unwrap();
    h.releasing.join().unwrap();
    assert_eq!(
        h.store.inspect(&LockName::new("job").unwrap()).unwrap(),
        None
    );
    took
}

#[test]
fn a_wait_that_ends_while_the_lock_is_handed_to_it_returns_the_lock() {
    assert!(
        a_wait_that_ends_during_the_release(false),
        "granted before it left: the waiter holds the lock"
    );
}

#[test]
fn a_wait_that_ends_while_its_hand_over_is_declined_still_takes_a_free_lock() {
    // Released, nothing handed over: the lock is free, and the waiter, whose time ran out
    // meanwhile, looks once more before it gives up (the release's wake-up is its own,
    // not a hand-over to someone else that it must let go first).
    assert!(
        a_wait_that_ends_during_the_release(true),
        "the free lock was taken by its last look"
    );
}

#[test]
fn an_interrupt_while_the_lock_is_handed_over_gives_it_back() {
    let (interrupter, interrupt) = dlm_core::interrupt_pair();
    let (result_tx, result) = crossbeam_channel::bounded(1);
    let (h, waiting) = handing(move |client| {
        let r = client
            .get_lock("job")
            .unwrap()
            .lock_interruptibly(&interrupt);
        result_tx
            .send(matches!(r, Err(dlm_core::Error::Interrupted)))
            .unwrap();
    });
    interrupter.interrupt();
    assert!(
        result.recv_timeout(Duration::from_millis(300)).is_err(),
        "the waiter left while the lock was being handed to it"
    );
    h.go.send(()).unwrap();
    assert!(
        result.recv_timeout(Duration::from_secs(10)).unwrap(),
        "interrupted"
    );
    waiting.join().unwrap();
    h.releasing.join().unwrap();
    assert_eq!(
        h.store.inspect(&LockName::new("job").unwrap()).unwrap(),
        None,
        "the interrupted waiter gave back the lock it was handed"
    );
}
