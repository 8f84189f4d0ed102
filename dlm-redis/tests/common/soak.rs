//! The soak harness: clients x threads taking hot locks in a loop while a test injects
//! faults, every hold recorded for the history checker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_core::{Lock, LockClient};
use dlm_testkit::history::History;
use parking_lot::Mutex;

/// Threads that lock and unlock `locks` hot names until stopped.
pub struct Soak {
    history: Arc<History>,
    holds: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Set once the last fault has healed; holds beginning after it count per thread.
    healed: Arc<Mutex<Option<Instant>>>,
    after: Arc<Vec<AtomicU64>>,
    workers: Vec<thread::JoinHandle<()>>,
}

/// What the soak's threads take.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // each soak binary uses some
pub enum Take {
    /// The mutex.
    Mutex,
    /// Permits of a semaphore with this many.
    Permits(u32),
    /// A read-write lock: one hold in four a write, the others reads.
    ReadWrite,
}

/// What a finished soak did.
pub struct Outcome {
    pub holds: u64,
    pub errors: u64,
}

impl Soak {
    /// Starts `clients` clients (one backend from `backend()` each, watchdog leases of
    /// `lease`) with `threads` threads each. A failed call must be transient (it may only
    /// happen while a fault lasts); a panic in a worker fails [`Soak::finish`].
    pub fn start(
        clients: usize,
        threads: usize,
        locks: u64,
        lease: Duration,
        backend: impl Fn() -> Arc<dyn LockBackend>,
    ) -> Soak {
        Soak::start_taking(Take::Mutex, clients, threads, locks, lease, backend)
    }

    /// [`Soak::start`] with the threads taking `take`'s holds (their checks by the
    /// history checker: at most N permit holders, no writer beside anyone).
    pub fn start_taking(
        take: Take,
        clients: usize,
        threads: usize,
        locks: u64,
        lease: Duration,
        backend: impl Fn() -> Arc<dyn LockBackend>,
    ) -> Soak {
        let history = Arc::new(History::new());
        let holds = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let healed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let after: Arc<Vec<AtomicU64>> =
            Arc::new((0..clients * threads).map(|_| AtomicU64::new(0)).collect());
        let mut workers = Vec::new();
        for c in 0..clients {
            let client = LockClient::builder(backend())
                .watchdog_timeout(lease)
                .build()
                .unwrap();
            for t in 0..threads {
                let id = c * threads + t;
                let (client, history, holds, errors, stop, healed, after) = (
                    client.clone(),
                    history.clone(),
                    holds.clone(),
                    errors.clone(),
                    stop.clone(),
                    healed.clone(),
                    after.clone(),
                );
                workers.push(thread::spawn(move || {
                    // xorshift64: each thread its own sequence of names.
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let name = format!("soak-{}", x % locks);
                        let asked = Instant::now();
                        let wait = Duration::from_secs(3);
                        let taken = match take {
                            Take::Mutex => client.get_lock(&name).unwrap().try_lock_timeout(wait),
                            Take::Permits(n) => client
                                .get_semaphore(&name, n)
                                .unwrap()
                                .try_acquire_timeout(wait),
                            Take::ReadWrite if x.is_multiple_of(4) => client
                                .get_rw_lock(&name)
                                .unwrap()
                                .try_write_timeout(wait)
                                .map(|w| w.map(dlm_core::WriteGuard::into_guard)),
                            Take::ReadWrite => {
                                client.get_rw_lock(&name).unwrap().try_read_timeout(wait)
                            }
                        };
                        let guard = match taken {
                            Ok(Some(guard)) => guard,
                            Ok(None) => continue,
                            Err(e) => {
                                assert!(e.is_transient(), "thread {id}: {e}");
                                errors.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        };
                        let hold =
                            history.begin_asked(format!("client {c} thread {t}"), &guard, asked);
                        let began = Instant::now();
                        thread::yield_now();
                        history.end(hold, &guard);
                        if guard.unlock().is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        holds.fetch_add(1, Ordering::Relaxed);
                        if healed.lock().is_some_and(|h| began > h) {
                            after[id].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        Soak {
            history,
            holds,
            errors,
            stop,
            healed,
            after,
            workers,
        }
    }

    /// Waits (at most 30 s) for `n` more holds.
    pub fn progress(&self, n: u64, what: &str) {
        let target = self.holds.load(Ordering::Relaxed) + n;
        super::wait_until(Duration::from_secs(30), what, || {
            self.holds.load(Ordering::Relaxed) >= target
        });
    }

    /// Marks the faults healed: from now on every thread must get locks again.
    pub fn healed(&self) {
        *self.healed.lock() = Some(Instant::now());
    }

    /// Waits (at most 30 s) until every thread has made `per_thread` holds since
    /// [`Soak::healed`], stops the threads, and checks the history: no overlapping holds,
    /// no token out of order.
    pub fn finish(self, per_thread: u64) -> Outcome {
        super::wait_until(
            Duration::from_secs(30),
            "every thread getting locks after the faults healed",
            || {
                self.after
                    .iter()
                    .all(|a| a.load(Ordering::Relaxed) >= per_thread)
            },
        );
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            w.join().unwrap();
        }
        let report = self.history.check();
        let holds = self.holds.load(Ordering::Relaxed);
        assert_eq!(report.holds as u64, holds);
        report.assert_clean();
        Outcome {
            holds,
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// The threads of this process, for the before/after comparison.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (at most 5 s) for the thread count to fall back to `baseline`.
pub fn assert_threads_back_to(baseline: usize) {
    super::wait_until(Duration::from_secs(5), "threads back to baseline", || {
        threads() <= baseline
    });
}

/// After a soak: no lock key left (a release that failed during a fault leaves a key
/// with its lease, gone within it) and no connection but the admin's.
pub fn assert_nothing_left(admin: &mut redis::Connection, lease: Duration) {
    super::wait_until(lease * 2, "lock keys gone", || {
        let keys: Vec<String> = redis::cmd("KEYS").arg("dlm:*").query(admin).unwrap();
        keys.iter().all(|k| k.starts_with("dlm:fence:"))
    });
    super::wait_until(Duration::from_secs(5), "connections closed", || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines().count() == 1
    });
}

/// The single-server soak, run by `soak.rs`, `soak_semaphore.rs` and `soak_rwlock.rs`
/// (each the only test of its binary, for the thread count): two clients x four threads
/// taking `take`'s holds of four hot names over one Redis with AOF always and watchdog
/// leases of 2 s, through a server pause longer than the lease (renewals and releases
/// fail, keys expire) and a kill + restart. Every hold is checked by the history checker,
/// every thread gets holds again once the faults have healed, and nothing is left behind:
/// no key but the fencing streams once the lease is over, no connection, no thread.
pub fn through_a_pause_and_a_restart(take: Take) {
    const LEASE: Duration = Duration::from_secs(2);
    super::require();
    let mut server = dlm_testkit::redis_server::RedisServer::builder()
        .appendonly(true)
        .spawn();
    // After the first server: the testkit's spawner thread lives as long as the process.
    let baseline = threads();
    let url = server.url();
    let soak = Soak::start_taking(take, 2, 4, 4, LEASE, || {
        Arc::new(
            dlm_redis::RedisBackend::builder(&url)
                .io_timeout(Duration::from_millis(300))
                .build()
                .unwrap(),
        )
    });
    soak.progress(300, "holds before the pause");
    server.pause();
    thread::sleep(LEASE + Duration::from_secs(1));
    server.resume();
    soak.progress(300, "holds after the pause");
    // With AOF always, keys and fence counters survive.
    server.kill();
    server.restart();
    soak.healed();
    let outcome = soak.finish(20);
    eprintln!(
        "{take:?}: {} holds, {} errors during the faults",
        outcome.holds, outcome.errors
    );
    assert!(outcome.holds >= 600 + 8 * 20);
    assert!(
        outcome.errors > 0,
        "the faults caused no error: were they injected?"
    );
    assert_nothing_left(&mut server.connection(), LEASE);
    drop(server);
    assert_threads_back_to(baseline);
}
