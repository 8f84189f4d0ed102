//! `wait_for_replicas`: `WAIT` after each grant and renewal, on real topologies (Sentinel:
//! a master, two replicas, three sentinels; Cluster: three masters with a replica each).
//! A grant the replicas do not acknowledge is refused with `NotReplicated` and undone; a
//! renewal is refused and the guard keeps its previous lease; and the failover negative
//! control no longer grants the lock twice when the replica that acknowledged is the one
//! promoted. What it does not buy has its negative controls too: a replica that did not
//! acknowledge promoted, or the one that did restarted empty, grants the lock again.
mod common;

use std::time::Duration;

use dlm_core::{BackendErrorKind, Error, Lock, LockClient};
use dlm_redis::{RedisBackend, redis};
use dlm_testkit::cluster::{RedisCluster, slot_of};
use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::sentinel::SentinelTopology;
use dlm_testkit::unique_name;

/// How long the tests wait for the replicas' acknowledgement: long enough for a loaded
/// 2-core machine (`WAIT` answers as soon as they acknowledged; only the refusals take
/// it whole), under the I/O timeout `IO`.
const WAIT: Duration = Duration::from_secs(1);
const IO: Duration = Duration::from_secs(3);

fn client(t: &SentinelTopology, replicas: u32) -> LockClient {
    LockClient::builder(
        RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
            .io_timeout(IO)
            .connect_timeout(common::CALM)
            .wait_for_replicas(replicas, WAIT)
            .build()
            .unwrap(),
    )
    .lease(Duration::from_secs(30))
    .build()
    .unwrap()
}

fn not_replicated(e: Error) -> String {
    match e {
        Error::Backend(b) if b.kind() == BackendErrorKind::NotReplicated => b.to_string(),
        other => panic!("expected NotReplicated, got {other:?}"),
    }
}

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).unwrap() == 1
}

#[test]
fn a_grant_or_renewal_the_replicas_do_not_acknowledge_is_refused() {
    common::require();
    let t = SentinelTopology::spawn();
    let c = client(&t, 2);
    let name = unique_name("wait");
    let lock = c.get_lock(&name).unwrap();
    let key = format!("dlm:{{{name}}}");
    // Both replicas acknowledge: granted.
    let g = lock.try_lock().unwrap().expect("free");
    // One replica stops: the renewal is refused, the guard keeps its lease.
    let replicas = t.replica_indexes();
    t.data_node(replicas[0]).pause();
    let lease_before = g.valid_until();
    let e = not_replicated(g.extend(Duration::from_secs(60)).unwrap_err());
    assert!(e.contains("1 of the 2 replicas"), "{e}");
    assert!(g.is_held());
    assert_eq!(
        g.valid_until(),
        lease_before,
        "the refused renewal moved the lease"
    );
    g.unlock().unwrap();
    // A grant is refused, and undone on the master.
    let e = not_replicated(lock.try_lock().unwrap_err());
    assert!(e.contains("the grant"), "{e}");
    assert!(
        !exists(&mut t.master().connection(), &key),
        "the refused grant stayed"
    );
    // Both stopped: 0 acknowledged.
    t.data_node(replicas[1]).pause();
    let e = not_replicated(lock.try_lock().unwrap_err());
    assert!(e.contains("0 of the 2"), "{e}");
    // Back: granted again.
    for r in replicas {
        t.data_node(r).resume();
    }
    let g = lock
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("granted once the replicas are back");
    g.unlock().unwrap();
    // Asking for one replica: one is enough.
    t.data_node(t.replica_indexes()[0]).pause();
    let g = client(&t, 1).get_lock(&name).unwrap().try_lock().unwrap();
    assert!(g.is_some());
    t.data_node(t.replica_indexes()[0]).resume();
    drop(g);

    // A downgrade the replicas do not acknowledge is refused and undone like a grant: the
    // read hold it wrote on the master is released with the write hold, none is left.
    let rw = c.get_rw_lock(&name).unwrap();
    let write = rw
        .try_write_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("both replicas acknowledge");
    t.data_node(t.replica_indexes()[0]).pause();
    let e = not_replicated(write.downgrade().unwrap_err());
    assert!(e.contains("the downgrade"), "{e}");
    assert!(
        !exists(&mut t.master().connection(), &format!("dlm:{{{name}}}:rw")),
        "the unacknowledged downgrade left a hold on the master"
    );
    t.data_node(t.replica_indexes()[0]).resume();
}

/// The negative control of `sentinel.rs` with `wait_for_replicas(1)`: one replica is cut
/// off, the other acknowledges A's grant, the master dies, and Sentinel promotes the one
/// that acknowledged (the other is still stopped). B does not get the lock; A releases it
/// on the new master, then B gets it with a newer token.
#[test]
fn a_failover_to_the_replica_that_acknowledged_keeps_the_lock() {
    common::require();
    let mut t = SentinelTopology::spawn();
    let name = unique_name("kept");
    let a = client(&t, 1);
    let old = t.master_index();
    let [acking, cut] = t.replica_indexes()[..] else {
        panic!("two replicas")
    };
    t.data_node(cut).pause();
    let history = dlm_testkit::history::History::new();
    let ga = a
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    let hold_a = history.begin("A", &ga);
    t.data_node_mut(old).kill();
    let new = t.wait_for_new_master(old, Duration::from_secs(30));
    assert_eq!(new, acking);
    t.data_node(cut).resume();

    let b = client(&t, 1);
    let lock_b = b.get_lock(&name).unwrap();
    assert!(
        lock_b
            .try_lock_timeout(Duration::from_secs(2))
            .unwrap()
            .is_none(),
        "B got the lock that A holds on the promoted replica"
    );
    let token_a = ga.fencing_token().unwrap();
    history.end(hold_a, &ga);
    ga.unlock().unwrap();
    let gb = lock_b
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("free after A's release on the new master");
    let hold_b = history.begin("B", &gb);
    assert!(gb.fencing_token().unwrap() > token_a);
    history.end(hold_b, &gb);
    gb.unlock().unwrap();
    let report = history.check();
    assert!(!report.has_overlap(), "{:?}", report.violations);
}

/// A master and a replica that replicates through the fault proxy, so that the test
/// controls the replication link: [`LAG`] of lag, or none at all.
struct LaggingReplica {
    master: RedisServer,
    proxy: FaultProxy,
    replica: RedisServer,
}

/// How late the replica sees the master's writes. The cut must come within it after A's
/// grant for the negative control to see a double grant (2 s leaves a loaded machine
/// room; it was 400 ms).
const LAG: Duration = Duration::from_secs(2);

impl LaggingReplica {
    fn new() -> LaggingReplica {
        common::require();
        // A replica's first sync must not wait for more replicas (a diskless sync waits
        // 5 s for them by default).
        let master = RedisServer::builder()
            .arg("--repl-diskless-sync-delay")
            .arg("0")
            .spawn();
        let proxy = FaultProxy::start(master.port());
        let replica = RedisServer::builder()
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(&proxy.port().to_string())
            .spawn();
        common::wait_until(Duration::from_secs(10), "replication up", || {
            replica
                .info("replication")
                .contains("master_link_status:up")
        });
        LaggingReplica {
            master,
            proxy,
            replica,
        }
    }

    fn client(&self, url: &str, wait: bool) -> LockClient {
        let builder = RedisBackend::builder(url)
            .io_timeout(LAG * 3)
            .connect_timeout(common::CALM);
        let builder = if wait {
            builder.wait_for_replicas(1, LAG * 2)
        } else {
            builder
        };
        LockClient::builder(builder.build().unwrap())
            .lease(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    /// A takes the lock on the master while replication lags [`LAG`]; right after A has
    /// it (well within the lag, even on a loaded machine), the link is cut, the master
    /// dies and the replica is promoted. Whether B then gets the lock from the promoted
    /// replica (the double grant).
    fn failover_right_after_the_grant(mut self, wait: bool) -> bool {
        let name = unique_name("lag");
        let a = self.client(&self.master.url(), wait);
        a.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
        // The replica has that release before the lag starts: under load its bytes could
        // still be on their way, then be held back by the lag and dropped by the cut, and
        // the promoted replica kept the warm-up's key and refused B (seen twice under
        // `scripts/test --under-load`).
        common::replicated(&self.master, 1);
        self.proxy.set_latency(Direction::ToClient, LAG);
        let history = dlm_testkit::history::History::new();
        let ga = a
            .get_lock(&name)
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("free");
        let hold_a = history.begin("A", &ga);
        // What has not reached the replica yet never will (stalled bytes are dropped
        // when the master's side closes).
        self.proxy.stall(Direction::Both);
        self.master.kill();
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut self.replica.connection())
            .unwrap();
        let b = self.client(&self.replica.url(), false);
        let gb = b.get_lock(&name).unwrap().try_lock().unwrap();
        let twice = gb.is_some();
        if let Some(gb) = gb {
            let hold_b = history.begin("B", &gb);
            history.end(hold_b, &gb);
            gb.into_hold();
        }
        history.end(hold_a, &ga);
        ga.into_hold();
        assert_eq!(
            history.check().has_overlap(),
            twice,
            "the checker disagrees"
        );
        twice
    }
}

/// The A/B of the option on one fault: without `WAIT` the lagging replica is promoted
/// without the grant and grants the lock again; with it, A's `try_lock` returns only once
/// the replica has the grant, and B is refused.
#[test]
fn with_a_lagging_replica_wait_is_what_prevents_the_double_grant() {
    assert!(
        LaggingReplica::new().failover_right_after_the_grant(false),
        "without WAIT the promoted replica must grant the lock again (the negative control)"
    );
    assert!(
        !LaggingReplica::new().failover_right_after_the_grant(true),
        "with WAIT the promoted replica had the grant"
    );
}

/// What `WAIT` does not buy, first: a failover that promotes a replica that did not
/// acknowledge. A's grant is acknowledged by one replica (as asked), the other's link is
/// stalled; the master dies and the stalled one is promoted (by hand, as an operator or a
/// managed service may): B gets the lock A holds. Fencing still refuses A's late write.
#[test]
fn with_wait_a_failover_to_a_replica_that_did_not_acknowledge_grants_the_lock_twice() {
    let mut t = LaggingReplica::new();
    let acking = RedisServer::builder()
        .arg("--replicaof")
        .arg("127.0.0.1")
        .arg(&t.master.port().to_string())
        .spawn();
    common::replicated(&t.master, 2);
    let name = unique_name("unacked");
    let a = t.client(&t.master.url(), true);
    t.proxy.stall(Direction::Both);
    let holder = common::OldHolder::new(a.get_lock(&name).unwrap().lock().unwrap());
    t.master.kill();
    drop(acking);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut t.replica.connection())
        .unwrap();
    holder.assert_granted_again(&t.client(&t.replica.url(), false));
}

/// What `WAIT` does not buy, second: the replica that acknowledged loses the write in a
/// restart without persistence (this one runs with `--save ""`, no AOF) before it is
/// promoted: B gets the lock A holds. Fencing still refuses A's late write (the empty
/// replica's stream starts from its clock).
#[test]
fn with_wait_a_replica_that_acknowledged_and_restarted_empty_grants_the_lock_twice() {
    let mut t = LaggingReplica::new();
    let name = unique_name("restarted");
    let a = t.client(&t.master.url(), true);
    let holder = common::OldHolder::new(a.get_lock(&name).unwrap().lock().unwrap());
    t.master.kill();
    t.replica.restart();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut t.replica.connection())
        .unwrap();
    holder.assert_granted_again(&t.client(&t.replica.url(), false));
}

/// Replication cut by the proxy: acquisitions fail with `NotReplicated` instead of
/// succeeding unsafely, and nothing is left on the master.
#[test]
fn with_replication_cut_acquisitions_fail_with_not_replicated() {
    let t = LaggingReplica::new();
    let c = t.client(&t.master.url(), true);
    let name = unique_name("cut");
    c.get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free")
        .unlock()
        .unwrap();
    t.proxy.blackhole(Direction::Both);
    let e = not_replicated(c.get_lock(&name).unwrap().try_lock().unwrap_err());
    assert!(e.contains("0 of the 1 replicas"), "{e}");
    assert!(!exists(
        &mut t.master.connection(),
        &format!("dlm:{{{name}}}")
    ));
    t.proxy.heal();
}

#[test]
fn on_a_cluster_a_grant_its_replica_does_not_acknowledge_is_refused() {
    common::require();
    let c = RedisCluster::spawn();
    let client = LockClient::new(
        RedisBackend::cluster_builder(&c.seed_urls())
            .io_timeout(IO)
            .wait_for_replicas(1, WAIT)
            .build()
            .unwrap(),
    );
    let name = unique_name("cluster-wait");
    let lock = client.get_lock(&name).unwrap();
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
    let master = c.master_of_slot(slot_of(format!("dlm:{{{name}}}").as_bytes()));
    let replica = c.replicas_of(master)[0];
    c.node(replica).pause();
    not_replicated(lock.try_lock().unwrap_err());
    c.node(replica).resume();
    lock.try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("granted once the replica is back")
        .unlock()
        .unwrap();
}

#[test]
fn bad_settings_are_refused_at_build() {
    // The default I/O timeout is 1 s: a WAIT of 1 s could not be answered within it.
    for (replicas, timeout) in [(0, WAIT), (1, Duration::ZERO), (1, Duration::from_secs(1))] {
        match RedisBackend::builder("redis://127.0.0.1:1/")
            .wait_for_replicas(replicas, timeout)
            .build()
        {
            Err(Error::InvalidArgument(e)) => assert_eq!(e.argument(), "wait_for_replicas"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
