//! The watchdog renews all the holds of a client in one batch per round (one round trip
//! per server, whatever the number of holds, to every server at once), so a client
//! holding many locks keeps them when a server is slow or stopped: on Redlock as long as
//! a quorum answers, on a Redis Cluster every hold whose master answers.
//!
//! These tests stop servers or slow them down and hold many locks: one at a time.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Cluster;
use dlm_core::backend::LockBackend;
use dlm_core::{Lock, LockClient, LockGuard};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::cluster::{RedisCluster, slot_of};
use dlm_testkit::faults::FaultProxy;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::scale::ScaleBar;
use dlm_testkit::{CountingBackend, unique_name};

static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

const HOLDS: usize = 1_000;
const WATCHDOG: Duration = Duration::from_secs(2);

/// `HOLDS` watchdog-renewed holds on one client over `backend`.
fn hold_many(backend: Arc<CountingBackend>, prefix: &str) -> (LockClient, Vec<LockGuard>) {
    let client = LockClient::builder(backend)
        .watchdog_timeout(WATCHDOG)
        .build()
        .unwrap();
    let guards = (0..HOLDS)
        .map(|i| {
            client
                .get_lock(&format!("{prefix}-{i}"))
                .unwrap()
                .lock()
                .unwrap()
        })
        .collect();
    (client, guards)
}

/// Prints and returns the renewal rounds seen so far: (count, slowest, median).
fn report(what: &str, backend: &CountingBackend) -> (usize, Duration, Duration) {
    let rounds = backend.rounds();
    let mut took: Vec<Duration> = rounds.iter().map(|r| r.took).collect();
    took.sort_unstable();
    let (slowest, median) = (
        took.last().copied().unwrap_or_default(),
        took.get(took.len() / 2).copied().unwrap_or_default(),
    );
    let holds: usize = rounds.iter().map(|r| r.holds).sum();
    eprintln!(
        "{what}: {} renewal rounds, {holds} renewals, round time median {median:?}, slowest {slowest:?}",
        rounds.len()
    );
    (rounds.len(), slowest, median)
}

#[test]
fn a_thousand_holds_survive_a_stopped_node_for_three_leases() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let urls = cluster.nodes.urls();
    let redlock = |urls: &[String]| {
        Redlock::builder(urls)
            .connect_timeout(Duration::from_millis(100))
            .io_timeout(Duration::from_millis(100))
            .build()
            .unwrap()
    };
    let counting = Arc::new(CountingBackend::new(Arc::new(redlock(&urls))));
    let prefix = unique_name("many");
    // Stopped before the holds are taken, so that each lives on exactly the two running
    // nodes. Stopped after, the test would depend on where each lock landed: an
    // acquisition returns once a quorum has it, and a node whose reply comes later has
    // its key released (seen on a loaded machine: a lock on nodes 0 and 2 only, rightly
    // lost when node 2 stopped).
    cluster.nodes.get(2).pause();
    let (_client, guards) = hold_many(counting.clone(), &prefix);
    let stopped = Instant::now();
    // The other client is not what is tested: calm timeouts. A transient error of its
    // own (a slow machine) did not take the lock; most attempts must get an answer.
    let other = LockClient::new(
        Redlock::builder(&urls)
            .connect_timeout(common::CALM)
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let (mut answered, mut errors) = (0, 0);
    // Three leases with one node stopped; every lease period, another client tries to
    // take every lock.
    while stopped.elapsed() < WATCHDOG * 3 {
        let period = Instant::now();
        for i in 0..HOLDS {
            match other.get_lock(&format!("{prefix}-{i}")).unwrap().try_lock() {
                Ok(taken) => {
                    assert!(taken.is_none(), "another client took lock {i}");
                    answered += 1;
                }
                Err(e) if e.backend().is_some_and(|b| b.is_transient()) => errors += 1,
                Err(e) => panic!("lock {i}: {e}"),
            }
        }
        let lost = guards.iter().filter(|g| !g.is_held()).count();
        assert_eq!(
            lost, 0,
            "{lost} of {HOLDS} guards lost with one node stopped"
        );
        // Pace the checks: one sweep per lease.
        let left = (WATCHDOG * 3).saturating_sub(stopped.elapsed());
        std::thread::sleep(WATCHDOG.saturating_sub(period.elapsed()).min(left));
    }
    cluster.nodes.get(2).resume();
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let (rounds, _, median) = report("1,000 holds, one of 3 nodes stopped", &counting);
    assert_eq!(lost, 0, "{lost} of {HOLDS} guards lost");
    eprintln!("the other client: {answered} refusals, {errors} transient errors");
    assert!(
        answered >= HOLDS,
        "the other client got an answer only {answered} times"
    );
    assert!(
        rounds >= 6,
        "{rounds} renewal rounds in 6 s with a 2 s watchdog"
    );
    // Rounds do not wait for the stopped node. The median, not the slowest: on a loaded
    // machine one round's encoding and parsing of 1,000 extensions can be starved of CPU
    // for most of a second (seen: 957 ms, median 13 ms).
    assert!(
        median < WATCHDOG / 6,
        "the median renewal round took {median:?}: more than half the renewal period"
    );
    for g in guards {
        g.unlock().unwrap();
    }
}

#[test]
fn a_renewal_round_costs_one_request_per_node_whatever_the_number_of_holds() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let counting = Arc::new(CountingBackend::new(Arc::new(cluster.redlock())));
    let (_client, guards) = hold_many(counting.clone(), &unique_name("count"));
    let reads = |i: usize| -> u64 {
        cluster
            .nodes
            .get(i)
            .info("stats")
            .lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Every hold renewed once more (the holds were taken over a while, so they come due
    // in a few rounds).
    let before: Vec<u64> = (0..3).map(reads).collect();
    let rounds_before = counting.rounds().len();
    let renewed = || -> usize {
        counting.rounds()[rounds_before..]
            .iter()
            .map(|r| r.renewed)
            .sum()
    };
    common::wait_until(WATCHDOG * 2, "every hold renewed", || renewed() >= HOLDS);
    let rounds = counting.rounds().len() - rounds_before;
    let after: Vec<u64> = (0..3).map(reads).collect();
    eprintln!("{HOLDS} holds renewed in {rounds} rounds");
    for i in 0..3 {
        // A batch of extensions reaches the server in several reads (the kernel splits
        // a large write), but far fewer than one per hold.
        let reads = after[i] - before[i];
        assert!(
            reads < (HOLDS / 4) as u64 * rounds as u64,
            "node {i}: {reads} reads for {rounds} renewal rounds of {HOLDS} holds"
        );
    }
    for g in guards {
        g.unlock().unwrap();
    }
}

/// The renewal cliff on Redis Cluster: renewals used to go to one master after another,
/// so a stopped master held up every round by its timeouts, and with a 2 s watchdog the
/// holds on the healthy masters ran out (201 of 201 lost with 300 holds, and another
/// client took them all). Now each master's renewals go out at once and a round waits
/// for a stopped master at most a quarter of a lease.
#[test]
fn a_stopped_cluster_master_costs_no_hold_on_the_others() {
    let _serial = SERIAL.lock();
    // No replicas and no full-coverage requirement: the stopped master's slots simply
    // stop answering (no failover, no CLUSTERDOWN for the others) for the whole test.
    let c = RedisCluster::builder()
        .replicas(0)
        .node_timeout(Duration::from_secs(60))
        .arg("--cluster-require-full-coverage")
        .arg("no")
        .spawn();
    // The library's default timeouts (1 s connect, 1 s I/O).
    let backend = || {
        RedisBackend::cluster_builder(&c.seed_urls())
            .build()
            .unwrap()
    };
    let counting = Arc::new(CountingBackend::new(Arc::new(backend())));
    let prefix = unique_name("cluster-many");
    let (_client, guards) = hold_many(counting.clone(), &prefix);
    let stopped = c.masters()[2];
    let on_stopped =
        |i: usize| c.master_of_slot(slot_of(format!("dlm:{{{prefix}-{i}}}").as_bytes())) == stopped;
    let healthy: Vec<usize> = (0..HOLDS).filter(|&i| !on_stopped(i)).collect();
    assert!(
        healthy.len() > HOLDS / 2 && healthy.len() < HOLDS,
        "{} of {HOLDS} names on the two other masters",
        healthy.len()
    );

    c.node(stopped).pause();
    let since = Instant::now();
    let other = LockClient::new(backend());
    while since.elapsed() < WATCHDOG * 3 {
        let period = Instant::now();
        for &i in &healthy {
            let taken = other
                .get_lock(&format!("{prefix}-{i}"))
                .unwrap()
                .try_lock()
                .unwrap_or_else(|e| panic!("lock {i}: {e}"));
            assert!(taken.is_none(), "another client took lock {i}");
        }
        let lost = healthy.iter().filter(|&&i| !guards[i].is_held()).count();
        assert_eq!(
            lost,
            0,
            "{lost} of {} holds on the healthy masters lost with one master stopped",
            healthy.len()
        );
        let left = (WATCHDOG * 3).saturating_sub(since.elapsed());
        std::thread::sleep(WATCHDOG.saturating_sub(period.elapsed()).min(left));
    }
    c.node(stopped).resume();
    let (rounds, slowest, median) =
        report("cluster: 1,000 holds, one of 3 masters stopped", &counting);
    let lost = healthy.iter().filter(|&&i| !guards[i].is_held()).count();
    assert_eq!(lost, 0, "{lost} holds on the healthy masters lost");
    assert!(
        rounds >= 6,
        "{rounds} renewal rounds in 6 s with a 2 s watchdog"
    );
    eprintln!("round median {median:?}, slowest {slowest:?}");
    for (i, g) in guards.into_iter().enumerate() {
        if !on_stopped(i) {
            g.unlock().unwrap();
        }
    }
}

// --- Every kind of hold, at scale, through a slow network -------------------------------

/// What the servers counted, summed: the scripts run (`EVALSHA`: one per renewal,
/// acquisition or release) and the socket reads (about one per request written, more when
/// the kernel splits a large pipelined write).
fn server_counts(servers: &[&RedisServer]) -> Vec<(&'static str, u64)> {
    let (mut scripts, mut reads) = (0, 0);
    for s in servers {
        scripts += s
            .info("commandstats")
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        reads += s
            .info("stats")
            .lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    vec![("scripts run", scripts), ("socket reads", reads)]
}

/// The scale bar (`dlm_testkit::scale`) on one server: before every kind was renewed in
/// the round, a client with 100 read holds (and 100 mutex holds) lost all of them at
/// 50 ms per request with a 3 s watchdog (the read holds were renewed one request after
/// another).
#[test]
fn every_kind_of_hold_at_scale_on_one_server() {
    let _serial = SERIAL.lock();
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let backend = |url: &str| -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::builder(url)
                .io_timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
    };
    ScaleBar {
        what: "one server",
        backend: backend(&proxy.url()),
        other: backend(&server.url()),
        proxies: std::slice::from_ref(&proxy),
        takers: 1,
        counters: &|| server_counts(&[&server]),
        // About 1,500 renewals a round, one pipelined write: 18 reads a round measured.
        at_most: ("socket reads", 100.0),
    }
    .run();
}

/// The scale bar on a Redis Cluster of 3 masters, every node behind a proxy the cluster
/// announces (so redirections and the slot map lead through the proxies too).
#[test]
fn every_kind_of_hold_at_scale_on_a_cluster() {
    let _serial = SERIAL.lock();
    let c = RedisCluster::builder().replicas(0).spawn();
    let proxies = c.proxies();
    let seeds: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let servers: Vec<&RedisServer> = c.nodes().iter().collect();
    let backend = || -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::cluster_builder(&seeds)
                .io_timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
    };
    ScaleBar {
        what: "cluster of 3",
        backend: backend(),
        other: backend(),
        proxies: &proxies,
        takers: 1,
        counters: &|| server_counts(&servers),
        // One pipelined write per master: 14 reads a round measured.
        at_most: ("socket reads", 100.0),
    }
    .run();
}
