//! Authentication on a real 3-member etcd cluster (the auth tests in `auth.rs` use one
//! member): users and roles set through one member hold on every member, and a client
//! whose member goes down moves on with its credentials: a lock request and a waiter's
//! watch stream (whose token is checked: without it the release never arrives, which the
//! last assertion would see) work through the other members. (etcd 3.4 hands out its
//! tokens through its log, so the surviving members accept the token the client already
//! has; a member that refuses one is handled as in `auth.rs`.)

mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::EtcdCluster;

const ROOT: &str = "root-secret";
const PASSWORD: &str = "alice-secret";

fn client(urls: &[String]) -> LockClient {
    LockClient::builder(
        EtcdBackend::builder(urls)
            .user("alice")
            .password(PASSWORD)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    )
    .lease(Duration::from_secs(5))
    .build()
    .unwrap()
}

#[test]
fn with_auth_on_a_client_moves_to_another_member_and_keeps_its_locks_and_watches() {
    let mut cluster = EtcdCluster::spawn(3);
    // Users and roles are cluster-wide: set once, through one member.
    cluster.get(0).add_user("alice", PASSWORD, Some("dlm/"));
    cluster.get(0).enable_auth(ROOT);
    let urls = cluster.urls();
    let c = client(&urls);
    let other = client(&urls[1..]);

    let held = c
        .get_lock("job")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    let first_token = held.fencing_token().unwrap();
    held.unlock().unwrap();

    // The member `c` talks to (its first) goes down.
    cluster.get_mut(0).kill();
    cluster.wait_for_leader();
    let again = c
        .get_lock("job")
        .unwrap()
        .try_lock_timeout(Duration::from_secs(15))
        .unwrap()
        .expect("the lock, through another member");
    assert!(again.fencing_token().unwrap() > first_token);

    // A waiter that polls only every 10 s, behind a holder with a 60 s lease, watches
    // through a member it authenticated with after the kill: the release reaches it
    // through the watch stream at once.
    let waiter = LockClient::builder(
        EtcdBackend::builder(&urls)
            .user("alice")
            .password(PASSWORD)
            .build()
            .unwrap(),
    )
    .retry(
        dlm_core::RetryPolicy::new()
            .backoff(Duration::from_secs(10), Duration::from_secs(10))
            .unwrap(),
    )
    .build()
    .unwrap()
    .get_lock("job2")
    .unwrap();
    let holder = other
        .get_lock("job2")
        .unwrap()
        .with_lease(Duration::from_secs(60))
        .unwrap()
        .lock()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let t = std::thread::spawn(move || {
        let got = waiter.try_lock_timeout(Duration::from_secs(30)).unwrap();
        tx.send(std::time::Instant::now()).unwrap();
        got.is_some()
    });
    // Blocked: nothing arrives while the holder holds.
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    let released = std::time::Instant::now();
    holder.unlock().unwrap();
    let acquired = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(t.join().unwrap(), "the waiter never got the lock");
    assert!(
        acquired - released < Duration::from_secs(3),
        "the waiter took {:?}: its watch did not deliver the release",
        acquired - released
    );
    drop(again);
}
