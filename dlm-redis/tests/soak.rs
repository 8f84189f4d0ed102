//! Soak (the reliability plan's single-Redis case, shortened for CI): two clients x four
//! threads on four hot locks over one Redis with AOF always and watchdog leases of 2 s,
//! through a server pause longer than the lease (renewals and releases fail, keys expire)
//! and a kill + restart. Every hold is checked (no overlaps, tokens in order), every thread
//! gets locks again once the faults have healed, and nothing is left behind: no lock key,
//! no connection, no thread. (The only test in its binary: no other test's threads disturb
//! the count.)
mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::soak::{Soak, assert_nothing_left, assert_threads_back_to, threads};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;

const LEASE: Duration = Duration::from_secs(2);

#[test]
fn holds_stay_exclusive_and_ordered_through_a_pause_and_a_restart() {
    common::require();
    let mut server = RedisServer::builder().appendonly(true).spawn();
    // After the first server: the testkit's spawner thread lives as long as the process.
    let baseline = threads();
    let url = server.url();
    let soak = Soak::start(2, 4, 4, LEASE, || {
        Arc::new(
            RedisBackend::builder(&url)
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
    assert!(outcome.holds >= 600 + 8 * 20);
    assert!(
        outcome.errors > 0,
        "the faults caused no error: were they injected?"
    );
    assert_nothing_left(&mut server.connection(), LEASE);
    drop(server);
    assert_threads_back_to(baseline);
}
