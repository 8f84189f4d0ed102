//! Soak (the reliability plan's Redlock case, shortened for CI and without partitions):
//! two clients x four threads on four hot locks over three Redis nodes with AOF always
//! and watchdog leases of 2 s, through a minority pause longer than the lease, a node's
//! kill + restart, and a majority pause longer than the lease (no quorum: locks are
//! lost, keys expire). Every hold is checked (no overlaps, tokens in order), every thread
//! gets locks again once the faults have healed, and nothing is left behind. (The only
//! test in its binary: no other test's threads disturb the count.)
mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::soak::{Soak, assert_nothing_left, assert_threads_back_to, threads};
use dlm_redis::Redlock;
use dlm_testkit::redis_server::RedisNodes;

const LEASE: Duration = Duration::from_secs(2);

#[test]
fn holds_stay_exclusive_and_ordered_through_pauses_and_a_restart() {
    common::require();
    let mut nodes = RedisNodes::spawn_with(3, |b| b.appendonly(true));
    let baseline = threads();
    let urls = nodes.urls();
    let soak = Soak::start(2, 4, 4, LEASE, || {
        Arc::new(
            Redlock::builder(&urls)
                .connect_timeout(Duration::from_millis(200))
                .io_timeout(Duration::from_millis(200))
                .build()
                .unwrap(),
        )
    });
    soak.progress(300, "holds before the faults");
    // A minority paused: the others still make a quorum.
    nodes.get(0).pause();
    soak.progress(20, "holds while one node is paused");
    thread::sleep(LEASE);
    nodes.get(0).resume();
    soak.progress(300, "holds after the minority pause");
    // A node killed and restarted with its data.
    nodes.get_mut(1).kill();
    soak.progress(20, "holds while one node is down");
    nodes.get_mut(1).restart();
    soak.progress(300, "holds after the restart");
    // A majority paused, longer than the lease: no quorum, renewals fail, keys expire.
    nodes.get(0).pause();
    nodes.get(2).pause();
    thread::sleep(LEASE + Duration::from_secs(1));
    nodes.get(0).resume();
    nodes.get(2).resume();
    soak.healed();
    let outcome = soak.finish(20);
    assert!(outcome.holds >= 940 + 8 * 20);
    assert!(outcome.errors > 0, "the majority pause caused no error");
    for i in 0..nodes.len() {
        assert_nothing_left(&mut nodes.get(i).connection(), LEASE);
    }
    drop(nodes);
    assert_threads_back_to(baseline);
}
