//! Soak of a semaphore with 3 permits on each of four hot names: never more than 3 holders at once (history checker), tokens in order, two clients x four threads over one
//! Redis with AOF always and watchdog leases of 2 s, through a server pause longer than
//! the lease and a kill + restart; then every thread gets holds again, and nothing is
//! left: no key but the fencing streams once the lease is over, no connection, no
//! thread. (The only test in its binary, for the thread count.)
mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::soak::{Soak, Take, assert_nothing_left, assert_threads_back_to, threads};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;

const LEASE: Duration = Duration::from_secs(2);

#[test]
fn permits_stay_within_their_count_and_ordered_through_a_pause_and_a_restart() {
    common::require();
    let mut server = RedisServer::builder().appendonly(true).spawn();
    let baseline = threads();
    let url = server.url();
    let soak = Soak::start_taking(Take::Permits(3), 2, 4, 4, LEASE, || {
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
    server.kill();
    server.restart();
    soak.healed();
    let outcome = soak.finish(20);
    eprintln!(
        "{} holds, {} errors during the faults",
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
