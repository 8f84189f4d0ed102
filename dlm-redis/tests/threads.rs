//! The threads a Redis backend starts: none per node at construction beyond r2d2's one
//! maintenance thread per server, the rest on first need; all of them gone after drop.
//! (Its own test binary: other tests' threads would be counted.)
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::Redlock;
use dlm_testkit::redis_server::RedisNodes;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_fresh_five_node_redlock_starts_few_threads_and_leaves_none() {
    common::require();
    let nodes = RedisNodes::spawn(5);
    let baseline = threads();
    let backend = Redlock::new(&nodes.urls()).unwrap();
    let built = threads() - baseline;
    let client = LockClient::new(backend);
    let guard = client.get_lock("threads").unwrap().lock().unwrap();
    let locked = threads() - baseline;
    eprintln!("five-node Redlock: {built} thread(s) after build, {locked} with one lock held");
    // One r2d2 maintenance thread per server; the watchdog's thread once a lock is held.
    // Connect workers, the drainer and release-hint listeners start only when needed
    // (a healthy uncontended lock needs none of them).
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
