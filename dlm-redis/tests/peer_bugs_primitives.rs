//! Replays of the bugs of Redisson's semaphores on dlm's, against real servers (the
//! README's "Semaphores and read-write locks" maps every one to its test; the others are
//! conformance cases, run on every backend):
//!
//! - `RPermitExpirableSemaphore` computes a permit's expiry from the client's clock: a
//!   client whose clock is behind the server's hands out permits that are already expired
//!   (over-admission), one whose clock is ahead keeps a crashed holder's permit for as
//!   long as the difference. dlm sends only durations; expiries are the server's `TIME`.
//! - Its keys are never cleaned up (Redisson #4100, #6302): dlm's keys go with the last
//!   permit or, left by a crashed holder, with its lease.
mod common;

use std::time::{Duration, Instant};

use dlm_core::LockClient;
use dlm_redis::{RedisBackend, redis};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::skew::ClockSkew;
use dlm_testkit::unique_name;

fn client(server: &RedisServer, lease: Duration) -> LockClient {
    LockClient::builder(RedisBackend::new(&server.url()).unwrap())
        .lease(lease)
        .build()
        .unwrap()
}

/// The semaphore keys (`dlm:{name}:sem`) on `server`.
fn semaphore_keys(server: &RedisServer) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("dlm:*:sem")
        .query(&mut server.connection())
        .unwrap();
    keys
}

/// The server's clock an hour ahead of the client's: a permit is not born expired (no
/// second holder of a 1-permit semaphore). An hour behind: a leaked permit comes back
/// with its 300 ms lease, not an hour later.
#[test]
fn permit_expiries_follow_the_servers_clock_not_the_clients() {
    common::require();
    let skew = ClockSkew::new();
    let server = RedisServer::builder().clock_skew(&skew).spawn();
    skew.forward(Duration::from_secs(3600));
    let name = unique_name("skewed");
    let a = client(&server, Duration::from_secs(5))
        .get_semaphore(&name, 1)
        .unwrap();
    let b = client(&server, Duration::from_secs(5))
        .get_semaphore(&name, 1)
        .unwrap();
    let held = a.acquire().unwrap();
    assert!(
        b.try_acquire().unwrap().is_none(),
        "a second holder of a 1-permit semaphore: the permit was born expired"
    );
    assert!(held.is_held());
    held.unlock().unwrap();

    skew.set(-3_600_000_000_000);
    let leaky = client(&server, Duration::from_millis(300))
        .get_semaphore(&name, 1)
        .unwrap();
    std::mem::forget(leaky.acquire().unwrap());
    assert!(b.try_acquire().unwrap().is_none());
    let asked = Instant::now();
    let got = b
        .try_acquire_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("the leaked permit did not come back within 20 s");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the leaked permit came back after {:?}",
        asked.elapsed()
    );
    got.unlock().unwrap();
}

/// No key outlives the last permit: released permits leave none at once; a permit left by
/// a vanished holder (leaked guard, fixed lease) leaves none once its lease is over.
#[test]
fn no_semaphore_key_outlives_its_last_permit() {
    common::require();
    let server = RedisServer::spawn();
    let name = unique_name("cleanup");
    let c = client(&server, Duration::from_secs(30));
    let sem = c.get_semaphore(&name, 3).unwrap();
    let other = client(&server, Duration::from_secs(30))
        .get_semaphore(&name, 3)
        .unwrap();
    let (p1, p2) = (sem.acquire().unwrap(), other.acquire().unwrap());
    assert_eq!(semaphore_keys(&server).len(), 1);
    drop((p1, p2));
    assert_eq!(semaphore_keys(&server), Vec::<String>::new());

    let leaky = client(&server, Duration::from_millis(300))
        .get_semaphore(&name, 3)
        .unwrap();
    std::mem::forget(leaky.acquire().unwrap());
    assert_eq!(semaphore_keys(&server).len(), 1);
    common::wait_until(
        Duration::from_secs(10),
        "the leaked permit's key expired",
        || semaphore_keys(&server).is_empty(),
    );
    assert_eq!(sem.holders().unwrap(), 0);
}
