//! The threads a Redis backend starts: none at construction, each on first need (r2d2's
//! maintenance thread of a server once more than the connection its first checkout made
//! on the caller's thread is needed); all of them gone after drop.
//! (Its own test binary: other tests' threads would be counted.)
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::{RedisNodes, RedisServer};

/// The tests of this binary count the process's threads: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// How many of this process's threads are named `name`.
fn named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

/// A short-lived program (a `dlm run`) takes one lock on one thread: its first connection
/// is made on that thread, and no pool thread is started for it (until issue #21, r2d2's
/// maintenance thread started at construction and made the connection: a thread start
/// and two hand-offs before the first request).
#[test]
fn one_lock_on_one_thread_starts_no_pool_thread() {
    common::require();
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let server = RedisServer::spawn();
    let backend = RedisBackend::new(&server.url()).unwrap();
    assert_eq!(named("dlm-redis-pool"), 0, "a pool thread after build");
    let client = LockClient::new(backend);
    let lock = client.get_lock("first-connection").unwrap();
    for _ in 0..3 {
        let guard = lock.try_lock().unwrap().expect("free");
        guard.unlock().unwrap();
    }
    assert_eq!(
        named("dlm-redis-pool"),
        0,
        "a pool thread for one connection used by one thread"
    );
}

#[test]
fn a_fresh_five_node_redlock_starts_few_threads_and_leaves_none() {
    common::require();
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let nodes = RedisNodes::spawn(5);
    let baseline = threads();
    let backend = Redlock::new(&nodes.urls()).unwrap();
    let built = threads() - baseline;
    let client = LockClient::new(backend);
    let guard = client.get_lock("threads").unwrap().lock().unwrap();
    let locked = threads() - baseline;
    eprintln!("five-node Redlock: {built} thread(s) after build, {locked} with one lock held");
    // At most one r2d2 maintenance thread per server (none while each server's first
    // connection is enough); the watchdog's thread once a lock is held. Connect workers,
    // the drainer and release-hint listeners start only when needed (a healthy
    // uncontended lock needs none of them).
    assert!(
        built <= 5,
        "{built} threads after building a five-node Redlock"
    );
    assert!(locked <= 5 + 1, "{locked} threads with one lock held");
    drop(guard);
    drop(client);
    common::wait_until(Duration::from_secs(5), "every thread gone", || {
        threads() <= baseline
    });
}
