//! The load: clients x threads taking, re-entering and releasing the hot locks, writing
//! through a fenced resource at both ends of every hold, and counting what happened.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{FencedResource, Lock, LockClient};
use dlm_testkit::history::History;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{LEASE, LOCKS, THREADS, Target};

/// What the load threads count.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) holds: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) errors: Mutex<BTreeMap<String, u64>>,
    /// Writes accepted from a holder older than one already accepted: (hold start, write).
    pub(crate) stale: Mutex<Vec<(Instant, Instant)>>,
    /// Failures that are bugs whatever the faults (a permanent error, re-entry wrong).
    pub(crate) fatal: Mutex<Vec<String>>,
}

impl Counters {
    fn error(&self, what: String) {
        *self.errors.lock().entry(what).or_default() += 1;
    }
}

/// The newest accepted writer of a resource, by the start of its hold.
#[derive(Default)]
struct Newest(Option<Instant>);

pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    history: Arc<History>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl Load {
    pub(crate) fn start(target: &dyn Target, seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let history = Arc::new(History::new());
        let resources: Arc<Vec<FencedResource<Newest>>> =
            Arc::new((0..LOCKS).map(|_| FencedResource::default()).collect());
        let mut workers = Vec::new();
        for c in 0..target.clients() {
            let client = LockClient::builder(target.backend())
                .watchdog_timeout(LEASE)
                .build()
                .unwrap();
            for t in 0..THREADS {
                let (client, stop, counters, history, resources) = (
                    client.clone(),
                    stop.clone(),
                    counters.clone(),
                    history.clone(),
                    resources.clone(),
                );
                let rng = StdRng::seed_from_u64(seed ^ ((c * THREADS + t) as u64 + 1) << 32);
                workers.push(thread::spawn(move || {
                    work(
                        &format!("client {c} thread {t}"),
                        &client,
                        &stop,
                        &counters,
                        &history,
                        &resources,
                        rng,
                    )
                }));
            }
        }
        Load {
            stop,
            counters,
            history,
            workers,
        }
    }

    fn holds(&self) -> u64 {
        self.counters.holds.load(Ordering::Relaxed)
    }

    /// Whether `n` more holds complete within `within`.
    pub(crate) fn progresses(&self, n: u64, within: Duration) -> bool {
        let target = self.holds() + n;
        let deadline = Instant::now() + within;
        while self.holds() < target {
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
        true
    }

    pub(crate) fn stop(self) -> (Arc<Counters>, Arc<History>) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            if w.join().is_err() {
                self.counters
                    .fatal
                    .lock()
                    .push("a load thread panicked".into());
            }
        }
        (self.counters, self.history)
    }
}

fn work(
    owner: &str,
    client: &LockClient,
    stop: &AtomicBool,
    counters: &Counters,
    history: &History,
    resources: &[FencedResource<Newest>],
    mut rng: StdRng,
) {
    while !stop.load(Ordering::Relaxed) {
        let i = rng.random_range(0..LOCKS);
        let lock = client.get_lock(&format!("soak-{i}")).expect("a valid name");
        let got = match rng.random_range(0..10) {
            0..=6 => lock.try_lock_timeout(Duration::from_millis(rng.random_range(10..500))),
            7 => lock.lock().map(Some),
            _ => lock.try_lock(),
        };
        let guard = match got {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                match e.backend_kind() {
                    Some(kind) if kind.is_transient() => counters.error(format!("{kind:?}")),
                    _ => counters.fatal.lock().push(format!("{owner}: acquire: {e}")),
                }
                continue;
            }
        };
        let hold = history.begin(owner, &guard);
        // Read once, at the start of the hold (drawn then: the history read it), and
        // written with at the end too, without checking that the lock is still held.
        let token = guard.fencing_token().ok();
        let from = Instant::now();
        let write = |counters: &Counters| {
            let Some(token) = token else {
                return;
            };
            counters.writes.fetch_add(1, Ordering::Relaxed);
            match resources[i].write(token, |newest| {
                if newest.0.is_some_and(|n| from < n) {
                    return true;
                }
                newest.0 = Some(from);
                false
            }) {
                Ok(true) => counters.stale.lock().push((from, Instant::now())),
                Ok(false) => {}
                Err(_) => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        write(counters);
        if rng.random_bool(0.1) {
            // Re-entry: no I/O, so it must succeed (while the lease lasts) with the same
            // token.
            match lock.try_lock() {
                Ok(Some(again)) if again.fencing_token().ok() == token => {}
                Ok(Some(_)) => counters
                    .fatal
                    .lock()
                    .push(format!("{owner}: re-entry changed the token")),
                Ok(None) => counters
                    .fatal
                    .lock()
                    .push(format!("{owner}: re-entry refused")),
                Err(e) => counters.error(format!("re-entry: {e}")),
            }
        }
        let pause = match rng.random_range(0..1000) {
            0..=897 => Duration::ZERO,
            898..=997 => Duration::from_millis(rng.random_range(1..20)),
            _ => Duration::from_millis(rng.random_range(500..3000)),
        };
        sleep_unless(stop, pause);
        write(counters);
        history.end(hold, &guard);
        match guard.unlock() {
            Ok(()) => {}
            Err(dlm_core::Error::LockLost) => counters.error("lost".into()),
            Err(e) => match e.backend_kind() {
                Some(kind) if kind.is_transient() => counters.error(format!("release {kind:?}")),
                _ => counters.fatal.lock().push(format!("{owner}: release: {e}")),
            },
        }
        counters.holds.fetch_add(1, Ordering::Relaxed);
    }
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}
