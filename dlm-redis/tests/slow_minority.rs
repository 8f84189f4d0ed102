//! A slow or stopped minority of Redlock nodes costs no latency: an operation returns as
//! soon as its outcome is decided, the stragglers' late replies are dealt with in the
//! background (a late acquisition is released, anything else dropped), and nothing is
//! left held. The validity of an acquisition still counts from the start of its round.
//!
//! These tests stop servers and compare latencies: they run one at a time.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Cluster;
use dlm_core::{Lock, LockClient};
use dlm_redis::Redlock;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;

static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The library's Redlock defaults: a node that does not answer costs 100 ms of I/O
/// timeout (after a 100 ms connect timeout) when it is waited for.
const IO: Duration = Duration::from_millis(100);
const LEASE: Duration = Duration::from_secs(30);
const CYCLES: usize = 300;

fn redlock(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .connect_timeout(Duration::from_millis(100))
        .io_timeout(IO)
        .build()
        .unwrap()
}

fn client(backend: &Arc<Redlock>) -> LockClient {
    LockClient::builder(backend.clone())
        .lease(LEASE)
        .build()
        .unwrap()
}

/// The time of one uncontended lock + unlock cycle on a fresh name.
fn cycle(client: &LockClient) -> Duration {
    let lock = client.get_lock(&unique_name("cycle")).unwrap();
    let start = Instant::now();
    let guard = lock.try_lock().unwrap().expect("uncontended");
    guard.unlock().unwrap();
    start.elapsed()
}

/// The median time of `CYCLES` uncontended lock + unlock cycles on fresh names.
fn p50_cycle(client: &LockClient) -> Duration {
    let mut times: Vec<Duration> = (0..CYCLES).map(|_| cycle(client)).collect();
    times.sort_unstable();
    times[times.len() / 2]
}

fn lock_keys(server: &RedisServer) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("dlm:*")
        .query(&mut server.connection())
        .unwrap();
    keys.into_iter()
        .filter(|k| !k.starts_with("dlm:fence:"))
        .collect()
}

/// A stopped node costs no latency wherever it is in the order the requests go out: the
/// last, or the first (whose reply a round reads first: it waits for it a short slice
/// only, then looks at the others).
#[test]
fn a_stopped_node_of_five_does_not_slow_acquire_and_release() {
    let _serial = SERIAL.lock();
    stopped_node_of_five(4);
    stopped_node_of_five(0);
}

fn stopped_node_of_five(stopped: usize) {
    let cluster = Cluster::new(5);
    let backend = Arc::new(redlock(&cluster.nodes.urls()));
    let c = client(&backend);
    p50_cycle(&c); // warm-up: every node has pooled connections
    let healthy = p50_cycle(&c);

    cluster.nodes.get(stopped).pause();
    // The first cycle after the stop is the one that waits for the node at all (later
    // ones find it busy with that cycle's stragglers): the round's grace, and at most a
    // short slice more, not the I/O timeout.
    let first = cycle(&c);
    assert!(
        first < IO / 2,
        "node {stopped} stopped: the first cycle took {first:?}, the I/O timeout is {IO:?}"
    );
    let paused = p50_cycle(&c);
    let stopped_node = cluster.nodes.get(stopped);
    eprintln!(
        "p50 lock + unlock, 5 nodes: healthy {healthy:?}, node {stopped} stopped {paused:?} ({:.2}x; the first cycle after the stop {first:?})",
        paused.as_secs_f64() / healthy.as_secs_f64()
    );
    assert!(
        paused < healthy * 3,
        "node {stopped} stopped: p50 {paused:?}, healthy {healthy:?}"
    );
    assert!(
        paused < IO / 4,
        "p50 {paused:?} is not far below the I/O timeout"
    );

    // Nothing is left held once the stopped node runs again: the requests it had
    // queued (an acquisition, then perhaps its release, on separate connections) are
    // answered, and a late acquisition is released by the drainer.
    stopped_node.resume();
    common::wait_until(Duration::from_secs(5), "no lock key left", || {
        (0..5).all(|i| lock_keys(cluster.nodes.get(i)).is_empty())
    });
    // And the node takes part again.
    common::wait_until(Duration::from_secs(5), "the resumed node in use", || {
        let name = unique_name("back");
        let guard = c.get_lock(&name).unwrap().try_lock().unwrap().unwrap();
        let used = !lock_keys(cluster.nodes.get(stopped)).is_empty();
        guard.unlock().unwrap();
        used
    });
}

#[test]
fn an_acquisition_that_lands_late_on_a_stopped_node_is_released() {
    // Two of three nodes stopped: an acquisition fails (no quorum) at once, and the
    // stopped nodes' SETs land when they run again, holding keys nobody owns. The drainer
    // reads those late replies and releases the keys: nothing stays held for the lease.
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let backend = Arc::new(redlock(&cluster.nodes.urls()));
    let c = client(&backend);
    p50_cycle(&c);
    let name = unique_name("late");
    cluster.nodes.get(1).pause();
    cluster.nodes.get(2).pause();
    let start = Instant::now();
    let r = c.get_lock(&name).unwrap().try_lock();
    let took = start.elapsed();
    assert!(r.is_err(), "no quorum with two of three stopped: {r:?}");
    assert!(took < Duration::from_millis(600), "took {took:?}");
    cluster.nodes.get(1).resume();
    cluster.nodes.get(2).resume();
    common::wait_until(Duration::from_secs(5), "the late keys released", || {
        (0..3).all(|i| lock_keys(cluster.nodes.get(i)).is_empty())
    });
    // Well within the 30 s lease: released, not expired.
    assert!(start.elapsed() < Duration::from_secs(10));
    // The lock is free for anyone.
    let other = client(&Arc::new(redlock(&cluster.nodes.urls())));
    let guard = other.get_lock(&name).unwrap().try_lock().unwrap();
    assert!(guard.is_some(), "the name stayed held");
}

/// Counter values by name and sorted labels.
type Counts = std::collections::HashMap<(String, Vec<(String, String)>), u64>;

/// Adds what `snapshotter` recorded since its last snapshot (the debugging recorder's
/// snapshots reset counters) to `totals`: counter name and sorted labels -> value.
fn add_counts(snapshotter: &metrics_util::debugging::Snapshotter, totals: &mut Counts) {
    use metrics_util::debugging::DebugValue;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        if let DebugValue::Counter(n) = value {
            *totals.entry((key.name().to_owned(), labels)).or_default() += n;
        }
    }
}

#[test]
fn late_acquisitions_released_in_the_background_are_counted() {
    use dlm_core::metric_names as names;
    // As above, with a recorder: the two late SETs are released by the drainer, and
    // each release counts once (the backend's counter, registered when it is built).
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (backend, c) = metrics::with_local_recorder(&recorder, || {
        let backend = Arc::new(redlock(&cluster.nodes.urls()));
        let c = client(&backend);
        (backend, c)
    });
    p50_cycle(&c);
    let mut totals = Counts::new();
    // What the warm-up counted is left out (nothing, unless a healthy node answered late).
    add_counts(&snapshotter, &mut totals);
    totals.clear();
    let straggled = |totals: &Counts, outcome: &str| {
        let labels = vec![
            (names::BACKEND.to_owned(), "redlock".to_owned()),
            (names::OUTCOME.to_owned(), outcome.to_owned()),
        ];
        totals
            .get(&(names::STRAGGLERS_RELEASED.to_owned(), labels))
            .copied()
            .unwrap_or(0)
    };
    let name = unique_name("late-counted");
    cluster.nodes.get(1).pause();
    cluster.nodes.get(2).pause();
    assert!(c.get_lock(&name).unwrap().try_lock().is_err());
    cluster.nodes.get(1).resume();
    cluster.nodes.get(2).resume();
    common::wait_until(Duration::from_secs(5), "the late keys released", || {
        add_counts(&snapshotter, &mut totals);
        straggled(&totals, "ok") >= 2 && (0..3).all(|i| lock_keys(cluster.nodes.get(i)).is_empty())
    });
    add_counts(&snapshotter, &mut totals);
    assert_eq!(
        straggled(&totals, "ok"),
        2,
        "one release per late acquisition"
    );
    assert_eq!(straggled(&totals, "failed"), 0);
    // The front counted the failed acquisition, with the backend's kind as its label.
    let failed = (
        names::ACQUISITIONS.to_owned(),
        vec![
            (names::BACKEND.to_owned(), "redlock".to_owned()),
            (names::OUTCOME.to_owned(), "failed".to_owned()),
        ],
    );
    assert_eq!(totals.get(&failed), Some(&1));
    drop((c, backend));
}

#[test]
fn a_held_lock_reads_as_held_with_one_node_stopped_and_one_slow() {
    // Node 2 stopped, node 1 answering 40 ms late (a proxy), node 0 fast; another client
    // holds the lock on all three. The first round waits for node 1 (without it no
    // outcome is known); the second (the acquire script, to read whose key is there) must
    // wait for it too: node 0's "held" alone, with node 2 already counted as failed, says
    // the quorum cannot be had, but not whether the lock is held or the nodes are failing.
    // Stopping after node 0's answer made a contended `try_lock` fail with `NoQuorum`
    // instead of returning `None` (and made a waiter poll with backoff instead of sleeping
    // until the release).
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let proxy = dlm_testkit::faults::FaultProxy::start(cluster.nodes.get(1).port());
    let urls = [
        cluster.nodes.get(0).url(),
        proxy.url(),
        cluster.nodes.get(2).url(),
    ];
    let name = unique_name("held");
    let holder = client(&Arc::new(redlock(&urls)));
    let _held = holder.get_lock(&name).unwrap().try_lock().unwrap().unwrap();
    let other = client(&Arc::new(redlock(&urls)));
    let lock = other.get_lock(&name).unwrap();
    assert!(lock.try_lock().unwrap().is_none(), "healthy: held");

    cluster.nodes.get(2).pause();
    proxy.set_latency(
        dlm_testkit::faults::Direction::Both,
        Duration::from_millis(20),
    );
    for i in 0..5 {
        let r = lock.try_lock();
        assert!(
            matches!(r, Ok(None)),
            "try {i}, one node stopped and one slow: {r:?}"
        );
    }
    let r = lock.try_lock_timeout(Duration::from_millis(300));
    assert!(matches!(r, Ok(None)), "a bounded wait: {r:?}");
    cluster.nodes.get(2).resume();
}
