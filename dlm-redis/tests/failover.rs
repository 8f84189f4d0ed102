//! A single Redis with a replica is not failover-safe (documented): replication is
//! asynchronous, so a lock granted on the master and lost with it before it reached the
//! replica is granted again by the promoted replica. This negative control shows the
//! double grant to the history checker, and shows what fencing still guarantees: the
//! promoted replica's tokens do not go back (its fencing stream continues from what it
//! replicated, or is seeded from its clock), so a resource refuses the old holder's late
//! write, unless the promoted replica's clock is behind: then the token goes back too,
//! and fencing fails with it (the second negative control).
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;

fn replication_up(replica: &RedisServer) -> bool {
    replica
        .info("replication")
        .lines()
        .any(|l| l.trim() == "master_link_status:up")
}

fn client(url: &str) -> LockClient {
    LockClient::builder(std::sync::Arc::new(
        RedisBackend::builder(url)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    ))
    .lease(Duration::from_secs(30))
    .build()
    .unwrap()
}

/// A takes the lock on the master after the replica was cut off; the master dies and the
/// replica is promoted (by hand: what Sentinel or a managed service does), with its
/// clock `behind` the master's. B asks the promoted replica.
/// What the two holders need kept alive: the promoted replica, its clock, B's client.
type Kept = (RedisServer, dlm_testkit::skew::ClockSkew, LockClient);

fn failover_before_replication(behind: Duration) -> (common::OldHolder, dlm_core::LockGuard, Kept) {
    common::require();
    let mut master = RedisServer::spawn();
    let skew = dlm_testkit::skew::ClockSkew::new();
    let replica = RedisServer::builder()
        .clock_skew(&skew)
        .arg("--replicaof")
        .arg("127.0.0.1")
        .arg(&master.port().to_string())
        .spawn();
    common::wait_until(Duration::from_secs(10), "replication up", || {
        replication_up(&replica)
    });
    let name = unique_name("failover");
    // Earlier holders, replicated: the replica's fencing stream has their IDs.
    let a = client(&master.url());
    for _ in 0..3 {
        a.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
    }
    common::replicated(&master, 1);
    // The replication link breaks; A takes the lock on the master, which cannot pass it
    // on.
    common::cut_off_replicas(&master, &[&replica]);
    let old = common::OldHolder::new(a.get_lock(&name).unwrap().lock().unwrap());
    master.kill();
    replica.resume();
    skew.back(behind);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.connection())
        .unwrap();
    let b = client(&replica.url());
    let gb = b
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("the promoted replica has no trace of A's lock: the documented double grant");
    (old, gb, (replica, skew, b))
}

#[test]
fn a_failover_before_replication_grants_the_lock_twice_and_fencing_refuses_the_old_holder() {
    let (old, gb, _kept) = failover_before_replication(Duration::ZERO);
    old.assert_double_grant_is_caught(gb);
}

/// The same with the promoted replica's clock an hour behind: its stream goes on from
/// the last ID it replicated, which is older than A's token. The token goes back, and
/// the resource refuses the new holder and takes the old one's late write.
#[test]
fn with_the_promoted_replicas_clock_behind_the_token_goes_back_and_fencing_fails() {
    let (old, gb, _kept) = failover_before_replication(Duration::from_secs(3600));
    old.assert_double_grant_with_an_older_token(gb);
}
