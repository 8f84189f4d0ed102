//! Soak (the reliability plan's single-Redis case, shortened for CI): two clients x four
//! threads on four hot locks over one Redis with AOF always and watchdog leases of 2 s,
//! through a server pause longer than the lease (renewals and releases fail, keys expire)
//! and a kill + restart. Every hold is checked (no overlaps, tokens in order), every thread
//! gets locks again once the faults have healed, and nothing is left behind: no lock key,
//! no connection, no thread. (The only test in its binary: no other test's threads disturb
//! the count.)
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::history::History;
use dlm_testkit::redis_server::RedisServer;
use parking_lot::Mutex;

const CLIENTS: usize = 2;
const THREADS_PER_CLIENT: usize = 4;
const LOCKS: u64 = 4;
const LEASE: Duration = Duration::from_secs(2);
/// Holds before each fault, and per thread after the last one.
const HOLDS_BETWEEN_FAULTS: u64 = 300;
const HOLDS_PER_THREAD_AFTER: u64 = 20;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn clients_connected(admin: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
    list.lines().count()
}

#[test]
fn holds_stay_exclusive_and_ordered_through_a_pause_and_a_restart() {
    common::require();
    let mut server = RedisServer::builder().appendonly(true).spawn();
    // After the first server: the testkit's spawner thread lives as long as the process.
    let baseline = threads();
    let url = server.url();
    let history = Arc::new(History::new());
    let holds = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Set once the last fault has healed; holds beginning after it count per thread.
    let healed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let after: Arc<Vec<AtomicU64>> = Arc::new(
        (0..CLIENTS * THREADS_PER_CLIENT)
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let mut workers = Vec::new();
    for c in 0..CLIENTS {
        let backend = RedisBackend::builder(&url)
            .io_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let client = LockClient::builder(Arc::new(backend))
            .watchdog_timeout(LEASE)
            .build();
        for t in 0..THREADS_PER_CLIENT {
            let id = c * THREADS_PER_CLIENT + t;
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
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let lock = client.get_lock(&format!("soak-{}", x % LOCKS)).unwrap();
                    let guard = match lock.try_lock_timeout(Duration::from_secs(3)) {
                        Ok(Some(guard)) => guard,
                        Ok(None) => continue,
                        Err(e) => {
                            // Only while a fault lasts: a transient error, never a panic.
                            assert!(
                                e.backend().is_some_and(|b| b.is_transient()),
                                "thread {id}: {e}"
                            );
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let hold = history.begin(format!("thread {id}"), &guard);
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
    let progress = |n: u64, what: &str| {
        let target = holds.load(Ordering::Relaxed) + n;
        common::wait_until(Duration::from_secs(30), what, || {
            holds.load(Ordering::Relaxed) >= target
        });
    };

    progress(HOLDS_BETWEEN_FAULTS, "holds before the pause");
    // A pause longer than the lease: renewals fail, keys expire, holders lose their locks.
    server.pause();
    thread::sleep(LEASE + Duration::from_secs(1));
    server.resume();
    progress(HOLDS_BETWEEN_FAULTS, "holds after the pause");
    // A kill and a restart: with AOF always, keys and fence counters survive.
    server.kill();
    server.restart();
    *healed.lock() = Some(Instant::now());
    common::wait_until(
        Duration::from_secs(30),
        "every thread getting locks after the restart",
        || {
            after
                .iter()
                .all(|a| a.load(Ordering::Relaxed) >= HOLDS_PER_THREAD_AFTER)
        },
    );
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    let report = history.check();
    assert_eq!(report.holds as u64, holds.load(Ordering::Relaxed));
    report.assert_clean();
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "the faults caused no error at all: were they injected?"
    );

    // Nothing left: no lock key (a release that failed during a fault leaves a key with
    // its lease, gone within it), only the admin's connection, no thread.
    let mut admin = server.connection();
    common::wait_until(LEASE * 2, "lock keys gone", || {
        let keys: Vec<String> = redis::cmd("KEYS").arg("dlm:*").query(&mut admin).unwrap();
        keys.iter().all(|k| k.ends_with(":fence"))
    });
    common::wait_until(Duration::from_secs(5), "connections closed", || {
        clients_connected(&mut admin) == 1
    });
    drop(admin);
    drop(server);
    let names = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap_or_default())
            .map(|n| n.trim().to_owned())
            .collect()
    };
    common::wait_until(
        Duration::from_secs(5),
        &format!("threads back to baseline {baseline}: {:?}", names()),
        || threads() <= baseline,
    );
}
