//! The renewal rule at scale on etcd: every kind of hold of a client is renewed in the
//! watchdog's round, its keys read in transactions of 128 sent at once, so that a client
//! with thousands of holds keeps them through a slow network.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient, LockGuard};
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::{EtcdCluster, EtcdServer};
use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::{CountingBackend, unique_name};

/// Holds of each kind.
const EACH: usize = 1_000;
const WATCHDOG: Duration = Duration::from_secs(2);

/// The requests the members served, by gRPC method (`grpc_server_handled_total`; the
/// JSON gateway's requests are served as gRPC calls), summed over `members`:
/// (transactions, keep-alives, lease grants).
fn served(members: &[&EtcdServer]) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    for m in members {
        let (status, text) = m
            .request("GET", "/metrics", "")
            .expect("a member's /metrics");
        assert_eq!(status, 200, "/metrics: {text}");
        for line in text
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
        {
            let n = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64;
            if line.contains("grpc_method=\"Txn\"") {
                out.0 += n;
            } else if line.contains("grpc_method=\"LeaseKeepAlive\"") {
                out.1 += n;
            } else if line.contains("grpc_method=\"LeaseGrant\"") {
                out.2 += n;
            }
        }
    }
    out
}

/// The scale bar on a 3-member etcd: 1,000 mutex holds, 1,000 permits and 1,000 read
/// holds in one client, a 2 s watchdog, then every request 50 ms late (a proxy in front of
/// each member, toward it) for three leases: none is lost, another client takes none.
#[test]
fn every_kind_of_hold_at_scale_on_three_members() {
    let cluster = EtcdCluster::spawn(3);
    let proxies: Vec<FaultProxy> = (0..3)
        .map(|i| FaultProxy::start(cluster.get(i).client_port()))
        .collect();
    let via: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.port()))
        .collect();
    let counting = Arc::new(CountingBackend::new(Arc::new(
        EtcdBackend::builder(&via)
            .io_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )));
    let client = LockClient::builder(counting.clone())
        .watchdog_timeout(WATCHDOG)
        .build()
        .unwrap();
    let prefix = unique_name("every-kind");
    let names = |i: usize| {
        [
            format!("{prefix}-m-{i}"),
            format!("{prefix}-s-{i}"),
            format!("{prefix}-r-{i}"),
        ]
    };
    // Taken by 4 threads (each acquisition is a round trip to etcd).
    let guards: Vec<LockGuard> = thread::scope(|scope| {
        let takers: Vec<_> = (0..4)
            .map(|t| {
                let client = &client;
                let names = &names;
                scope.spawn(move || {
                    let mut guards = Vec::new();
                    for i in (t..EACH).step_by(4) {
                        let [m, s, r] = names(i);
                        guards.push(client.get_lock(&m).unwrap().lock().unwrap());
                        guards.push(client.get_semaphore(&s, 1).unwrap().acquire().unwrap());
                        guards.push(client.get_rw_lock(&r).unwrap().read().unwrap());
                    }
                    guards
                })
            })
            .collect();
        takers.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    for p in &proxies {
        p.set_latency(Direction::ToServer, Duration::from_millis(50));
    }
    let members: Vec<&EtcdServer> = (0..3).map(|i| cluster.get(i)).collect();
    let rounds_before = counting.rounds().len();
    let served_before = served(&members);
    let slow = Instant::now();
    let mut checked_others = false;
    while slow.elapsed() < WATCHDOG * 3 {
        let lost = guards.iter().filter(|g| !g.is_held()).count();
        assert_eq!(lost, 0, "{lost} of {} holds lost", guards.len());
        if !checked_others && slow.elapsed() > WATCHDOG {
            // One lease in: another client (not through the proxies) takes none of a
            // sample of each kind.
            let other = LockClient::new(
                EtcdBackend::builder(&cluster.urls())
                    .io_timeout(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            );
            for i in (0..EACH).step_by(EACH / 10) {
                let [m, s, r] = names(i);
                assert!(other.get_lock(&m).unwrap().try_lock().unwrap().is_none());
                let sem = other.get_semaphore(&s, 1).unwrap();
                assert!(sem.try_acquire().unwrap().is_none());
                assert!(
                    other
                        .get_rw_lock(&r)
                        .unwrap()
                        .try_write()
                        .unwrap()
                        .is_none()
                );
            }
            checked_others = true;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let after = served(&members);
    let rounds = counting.rounds()[rounds_before..].to_vec();
    let renewed: usize = rounds.iter().map(|r| r.renewed).sum();
    let mut took: Vec<Duration> = rounds.iter().map(|r| r.took).collect();
    took.sort_unstable();
    let per_round = |n: u64| n as f64 / rounds.len().max(1) as f64;
    eprintln!(
        "3 etcd members: {} holds (each kind {EACH}), 50 ms per request, 2 s watchdog: 0 lost; {} rounds in {:?}, {renewed} renewals, round median {:?}, slowest {:?}; per round {:.1} transactions, {:.1} keep-alives, {:.1} lease grants at the members (the other client's checks included)",
        guards.len(),
        rounds.len(),
        slow.elapsed(),
        took[took.len() / 2],
        took[took.len() - 1],
        per_round(after.0 - served_before.0),
        per_round(after.1 - served_before.1),
        per_round(after.2 - served_before.2),
    );
    assert!(rounds.len() >= 3, "{} rounds", rounds.len());
    assert!(
        rounds.iter().all(|r| r.renewed == r.holds),
        "a renewal failed: {rounds:?}"
    );
    assert!(checked_others);
    assert_eq!(counting.single_extends(), 0);
    for p in &proxies {
        p.heal();
    }
    for g in guards {
        g.unlock().unwrap();
    }
}
