//! Redlock under node faults, against real `redis-server` processes: killed, paused
//! (SIGSTOP), restarted and script-flushed nodes, foreign keys on a minority, a lost
//! majority, the quorum table, duplicate nodes, node order, and quorum counting on extend
//! and release.
//!
//! These tests kill and pause servers and measure latencies: they run one at a time
//! (`SERIAL`), and every latency bound has a wide margin for a loaded 2-core machine.
mod common;

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::Cluster;
use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_core::{Error, Lock, LockClient, RetryPolicy};
use dlm_redis::Redlock;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::{CountingBackend, unique_name};

/// One test at a time: several paused or killed servers at once would skew every timing
/// bound. parking_lot's mutex does not poison, so one failed test does not fail the rest.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The per-node deadline of the timing tests: connect timeout + I/O timeout (the
/// library's Redlock defaults, set explicitly).
const CONNECT: Duration = Duration::from_millis(100);
const IO: Duration = Duration::from_millis(100);
const DEADLINE: Duration = Duration::from_millis(200);
/// What a loaded machine may add to any latency bound.
const MARGIN: Duration = Duration::from_secs(1);
/// The fixed lease of every client here (no watchdog renewals in the background).
const LEASE: Duration = Duration::from_secs(30);
const FOREIGN: &str = "someone-else";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A Redlock with the per-node deadline `DEADLINE` (for tests about timing).
fn fast(urls: &[String]) -> Redlock {
    assert_eq!(CONNECT + IO, DEADLINE);
    Redlock::builder(urls)
        .connect_timeout(CONNECT)
        .io_timeout(IO)
        .build()
        .expect("a valid Redlock configuration")
}

/// A Redlock for tests not about timing: a short connect timeout (a killed node costs
/// that much per request), a calm I/O timeout (a healthy node is never too slow).
fn calm(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .connect_timeout(CONNECT)
        .io_timeout(common::CALM)
        .build()
        .expect("a valid Redlock configuration")
}

/// A client that does not wait for its releases when dropped: these tests end with nodes
/// killed, where a failed release is sent again until its lease ends (30 s), and a drop
/// would wait `RetryPolicy::release_wait` (5 s) for nothing.
fn client(backend: impl LockBackend) -> LockClient {
    LockClient::builder(Arc::new(backend))
        .lease(LEASE)
        .retry(no_wait_on_drop())
        .build()
        .unwrap()
}

fn no_wait_on_drop() -> RetryPolicy {
    RetryPolicy::new().release_wait(Duration::ZERO)
}

fn key(name: &str) -> String {
    format!("dlm:{{{name}}}")
}

fn exists(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key(name))
        .query::<i64>(&mut server.connection())
        .expect("EXISTS")
        == 1
}

fn value(server: &RedisServer, name: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key(name))
        .query(&mut server.connection())
        .expect("GET")
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key(name))
        .query(&mut server.connection())
        .expect("PTTL")
}

/// Another owner holds the lock key on this server only.
fn set_foreign(server: &RedisServer, name: &str, px: Duration) {
    let ok: String = redis::cmd("SET")
        .arg(key(name))
        .arg(FOREIGN)
        .arg("PX")
        .arg(px.as_millis() as u64)
        .query(&mut server.connection())
        .expect("SET");
    assert_eq!(ok, "OK");
}

/// Asserts that the foreign key set by `set_foreign` is still there, untouched.
#[track_caller]
fn assert_foreign_untouched(server: &RedisServer, name: &str, what: &str) {
    assert_eq!(
        value(server, name).as_deref(),
        Some(FOREIGN),
        "{what}: the foreign key on port {} was changed",
        server.port()
    );
    let ttl = pttl(server, name);
    assert!(
        ttl > 0,
        "{what}: the foreign key on port {} lost its expiry (PTTL {ttl})",
        server.port()
    );
}

/// Asserts that this server holds our key for `name` (present, not the foreign value).
#[track_caller]
fn assert_ours(server: &RedisServer, name: &str, what: &str) {
    let v = value(server, name);
    assert!(
        v.is_some() && v.as_deref() != Some(FOREIGN),
        "{what}: expected our key on port {}, found {v:?}",
        server.port()
    );
}

/// Asserts that this server's key for `name` is gone within 5 s: the undo of a failed
/// acquisition on a node that granted it. A node whose grant arrives after the attempt
/// was decided (on a loaded machine the two refusals can come first) is undone in the
/// background when its answer arrives, not before the call returns, so its key may
/// outlive the call by a moment; it must not outlive it for long.
#[track_caller]
fn assert_undone(server: &RedisServer, name: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while exists(server, name) {
        assert!(
            Instant::now() < deadline,
            "{what}: key {} still exists on port {} 5 s later",
            key(name),
            server.port()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[track_caller]
fn assert_absent(server: &RedisServer, name: &str, what: &str) {
    assert!(
        !exists(server, name),
        "{what}: key {} still exists on port {}",
        key(name),
        server.port()
    );
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

#[track_caller]
fn expect_no_quorum<T: Debug>(r: dlm_core::Result<T>, what: &str) -> Error {
    match r {
        Ok(v) => panic!("{what}: expected a NoQuorum error, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(
                e.backend_kind(),
                Some(BackendErrorKind::NoQuorum),
                "{what}: wrong error: {e} / {e:?}"
            );
            e
        }
    }
}

#[track_caller]
fn expect_invalid<T: Debug>(r: dlm_core::Result<T>, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected Error::InvalidArgument, got Ok({v:?})"),
        Err(Error::InvalidArgument(e)) => {
            assert_eq!(e.argument(), "urls", "{what}: {e}");
        }
        Err(e) => panic!("{what}: expected Error::InvalidArgument, got {e:?}"),
    }
}

/// One try_lock + unlock on `client` that must succeed within the per-node deadline
/// (+ margin) each; checks our key on the `up` servers while held and gone afterwards.
#[track_caller]
fn bounded_cycle(client: &LockClient, up: &[&RedisServer], what: &str) {
    let name = unique_name("cycle");
    let lock = client.get_lock(&name).unwrap();
    let (r, elapsed) = timed(|| lock.try_lock());
    let guard = r
        .unwrap_or_else(|e| panic!("{what}: try_lock failed: {e:?}"))
        .unwrap_or_else(|| panic!("{what}: try_lock found the lock held"));
    assert!(
        elapsed < DEADLINE + MARGIN,
        "{what}: try_lock took {elapsed:?}, more than the per-node deadline {DEADLINE:?} + {MARGIN:?}"
    );
    assert!(guard.is_held(), "{what}: fresh guard not held");
    for s in up {
        assert_ours(s, &name, what);
    }
    let (r, elapsed) = timed(|| guard.unlock());
    r.unwrap_or_else(|e| panic!("{what}: unlock failed: {e:?}"));
    assert!(
        elapsed < DEADLINE + MARGIN,
        "{what}: unlock took {elapsed:?}, more than the per-node deadline {DEADLINE:?} + {MARGIN:?}"
    );
    for s in up {
        assert_absent(s, &name, &format!("{what}, after unlock"));
    }
}

// ---------------------------------------------------------------------------------------
// 1 and 2. A minority of nodes killed or paused
// ---------------------------------------------------------------------------------------

fn servers(cluster: &Cluster, which: impl Fn(usize) -> bool) -> Vec<&RedisServer> {
    (0..cluster.nodes.len())
        .filter(|&i| which(i))
        .map(|i| cluster.nodes.get(i))
        .collect()
}

/// A fresh `n`-node cluster with the nodes `killed` killed: a client built before and one
/// built after the kill acquire and release, each call within the per-node deadline;
/// once a refused connection has shown a node down, it costs no waiting at all; and
/// restarted, the nodes take part again.
fn killed_minority(n: usize, killed: &[usize]) {
    let what = format!("{n} nodes, {killed:?} killed");
    let mut cluster = Cluster::new(n);
    let urls = cluster.nodes.urls();
    let rl = client(fast(&urls));
    bounded_cycle(
        &rl,
        &servers(&cluster, |_| true),
        &format!("{what}: all up"),
    );
    for &i in killed {
        cluster.nodes.get_mut(i).kill();
    }
    let up = servers(&cluster, |i| !killed.contains(&i));
    for c in 0..3 {
        bounded_cycle(&rl, &up, &format!("{what}, cycle {c}"));
    }
    let cold = client(fast(&urls));
    bounded_cycle(
        &cold,
        &up,
        &format!("{what}, client built while they were down"),
    );

    // A node known to be down is not waited for: 40 cycles, each of which would wait a
    // connect timeout (100 ms) per call for it otherwise, take less than a second.
    let lock = rl.get_lock(&unique_name("down")).unwrap();
    let (_, elapsed) = timed(|| {
        for _ in 0..40 {
            lock.try_lock()
                .unwrap_or_else(|e| panic!("{what}: try_lock: {e:?}"))
                .expect("free")
                .unlock()
                .unwrap_or_else(|e| panic!("{what}: unlock: {e:?}"));
        }
    });
    assert!(
        elapsed < MARGIN,
        "{what}: 40 cycles took {elapsed:?}: the dead nodes were waited for"
    );

    // Restarted, the nodes take part again (the pools reconnect in the background).
    for &i in killed {
        cluster.nodes.get_mut(i).restart();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let name = unique_name("restarted");
        let guard = rl
            .get_lock(&name)
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("free");
        let back = killed.iter().all(|&i| exists(cluster.nodes.get(i), &name));
        guard.unlock().unwrap();
        if back {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the restarted nodes did not all take part in an acquisition within 5 s"
        );
    }
}

/// A fresh `n`-node cluster with the nodes `paused` stopped (SIGSTOP: they keep their
/// sockets and answer nothing): a client built before the pause acquires and releases,
/// each call within the per-node deadline; once resumed, the nodes take part again; and
/// a client built while they are paused (checked last) acquires within the deadline too.
fn paused_minority(n: usize, paused: &[usize]) {
    let what = format!("{n} nodes, {paused:?} paused");
    let cluster = Cluster::new(n);
    let urls = cluster.nodes.urls();
    let rl = client(fast(&urls));
    bounded_cycle(
        &rl,
        &servers(&cluster, |_| true),
        &format!("{what}: all up"),
    );
    let pause = |on: bool| {
        for &i in paused {
            if on {
                cluster.nodes.get(i).pause();
            } else {
                cluster.nodes.get(i).resume();
            }
        }
    };
    let up = servers(&cluster, |i| !paused.contains(&i));
    pause(true);
    for c in 0..3 {
        bounded_cycle(&rl, &up, &format!("{what}, cycle {c}"));
    }
    pause(false);

    // Once resumed, the nodes take part again: a bounded wait for their connections to
    // recover, in which every cycle must succeed.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let name = unique_name("resumed");
        let guard = rl
            .get_lock(&name)
            .unwrap()
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}, after resume: try_lock: {e:?}"))
            .unwrap_or_else(|| panic!("{what}, after resume: not acquired"));
        let back = paused.iter().all(|&i| exists(cluster.nodes.get(i), &name));
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("{what}, after resume: unlock: {e:?}"));
        if back {
            for &i in paused {
                assert_absent(cluster.nodes.get(i), &name, &format!("{what}, resumed"));
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the resumed nodes did not all take part in an acquisition within 5 s"
        );
    }

    // A client started while the nodes are paused.
    pause(true);
    let cold = client(fast(&urls));
    bounded_cycle(
        &cold,
        &up,
        &format!("{what}, client built while they were paused"),
    );
    pause(false);
}

#[test]
fn one_killed_or_paused_node_of_three_costs_at_most_the_per_node_deadline() {
    let _serial = SERIAL.lock();
    killed_minority(3, &[1]);
    paused_minority(3, &[1]);
}

#[test]
fn two_killed_or_paused_nodes_of_five_cost_at_most_the_per_node_deadline() {
    let _serial = SERIAL.lock();
    killed_minority(5, &[0, 3]);
    paused_minority(5, &[1, 4]);
}

// ---------------------------------------------------------------------------------------
// 3. Foreign keys on a minority
// ---------------------------------------------------------------------------------------

#[test]
fn a_minority_of_nodes_holding_a_foreign_key_does_not_block_and_is_left_alone() {
    let _serial = SERIAL.lock();
    for (n, foreign) in [(3usize, vec![1usize]), (5, vec![0, 3])] {
        let what = format!("{n} nodes, foreign key on {foreign:?}");
        let cluster = Cluster::new(n);
        let rl = client(calm(&cluster.nodes.urls()));
        let name = unique_name("foreign");
        for &i in &foreign {
            set_foreign(cluster.nodes.get(i), &name, Duration::from_secs(30));
        }
        let lock = rl.get_lock(&name).unwrap();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}: try_lock: {e:?}"))
            .unwrap_or_else(|| panic!("{what}: not acquired although a quorum is free"));
        assert!(guard.is_held(), "{what}");
        for i in 0..n {
            let s = cluster.nodes.get(i);
            if foreign.contains(&i) {
                assert_foreign_untouched(s, &name, &what);
            } else {
                assert_ours(s, &name, &what);
            }
        }
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("{what}: unlock: {e:?}"));
        for i in 0..n {
            let s = cluster.nodes.get(i);
            if foreign.contains(&i) {
                assert_foreign_untouched(s, &name, &format!("{what}, after unlock"));
            } else {
                assert_absent(s, &name, &format!("{what}, after unlock"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. A majority down
// ---------------------------------------------------------------------------------------

#[test]
fn a_lost_majority_is_reported_as_no_quorum_within_the_budget() {
    let _serial = SERIAL.lock();
    let mut cluster = Cluster::new(3);
    let urls = cluster.nodes.urls();
    cluster.nodes.get_mut(0).kill();
    cluster.nodes.get_mut(2).kill();
    let live = cluster.nodes.get(1);

    let counting = Arc::new(CountingBackend::new(Arc::new(fast(&urls))));
    let rl = LockClient::builder(counting.clone())
        .lease(LEASE)
        .retry(no_wait_on_drop())
        .build()
        .unwrap();
    let name = unique_name("majority-down");
    let lock = rl.get_lock(&name).unwrap();

    // A timed wait: transient NoQuorum errors are retried until the timeout, then returned.
    let wait = Duration::from_secs(1);
    let (r, elapsed) = timed(|| lock.try_lock_timeout(wait));
    expect_no_quorum(r, "try_lock_timeout(1 s)");
    assert!(
        elapsed >= wait,
        "try_lock_timeout(1 s) gave up after {elapsed:?}"
    );
    // The last attempt may start just before the timeout: its acquisition, its undo on
    // every node and the front's clean-up release are three fan-outs of one deadline each.
    let bound = wait + 3 * DEADLINE + MARGIN;
    assert!(
        elapsed < bound,
        "try_lock_timeout(1 s) took {elapsed:?} (bound {bound:?})"
    );
    assert_absent(live, &name, "after try_lock_timeout");

    // One attempt: the error at once. (Its clean-up release fails on the dead majority
    // and is sent again in the background until the lease ends: not an attempt.)
    let before = counting.acquisitions();
    let (r, elapsed) = timed(|| lock.try_lock());
    expect_no_quorum(r, "try_lock()");
    let attempts = counting.acquisitions() - before;
    assert_eq!(
        attempts, 1,
        "try_lock() made {attempts} acquisition attempts"
    );
    let bound = 3 * DEADLINE + MARGIN;
    assert!(
        elapsed < bound,
        "try_lock() took {elapsed:?} (bound {bound:?})"
    );
    assert_absent(live, &name, "after try_lock");

    // lock() gives up after the retry policy's error timeout instead of hanging.
    let error_timeout = Duration::from_millis(500);
    let impatient = LockClient::builder(Arc::new(fast(&urls)))
        .lease(LEASE)
        .retry(no_wait_on_drop().error_timeout(error_timeout))
        .build()
        .unwrap();
    let lock = impatient.get_lock(&name).unwrap();
    let (r, elapsed) = timed(|| lock.lock());
    expect_no_quorum(r, "lock() with a 500 ms error timeout");
    assert!(
        elapsed >= error_timeout,
        "lock() gave up after {elapsed:?}, before the error timeout"
    );
    let bound = error_timeout + 3 * DEADLINE + MARGIN;
    assert!(elapsed < bound, "lock() took {elapsed:?} (bound {bound:?})");
    assert_absent(live, &name, "after lock()");
}

// ---------------------------------------------------------------------------------------
// 5. No partial keys after a failed acquisition
// ---------------------------------------------------------------------------------------

#[test]
fn a_failed_acquisition_leaves_no_partial_key() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let rl = client(calm(&cluster.nodes.urls()));
    let name = unique_name("partial");
    set_foreign(cluster.nodes.get(1), &name, Duration::from_secs(30));
    set_foreign(cluster.nodes.get(2), &name, Duration::from_secs(30));
    let lock = rl.get_lock(&name).unwrap();

    let r = lock.try_lock().expect("contention is not an error");
    assert!(
        r.is_none(),
        "acquired although a majority holds a foreign key"
    );
    assert_undone(cluster.nodes.get(0), &name, "after a failed try_lock");

    let r = lock
        .try_lock_timeout(Duration::from_millis(300))
        .expect("contention is not an error");
    assert!(
        r.is_none(),
        "acquired although a majority holds a foreign key"
    );
    assert_undone(
        cluster.nodes.get(0),
        &name,
        "after a failed try_lock_timeout",
    );

    for i in [1, 2] {
        assert_foreign_untouched(cluster.nodes.get(i), &name, "after the failed attempts");
    }
}

// ---------------------------------------------------------------------------------------
// 6. Expiring foreign keys: liveness
// ---------------------------------------------------------------------------------------

#[test]
fn a_waiter_gets_the_lock_once_foreign_keys_on_a_majority_expire() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let rl = client(calm(&cluster.nodes.urls()));
    let name = unique_name("expiring");
    let px = Duration::from_millis(300);
    let set_at = Instant::now();
    set_foreign(cluster.nodes.get(1), &name, px);
    set_foreign(cluster.nodes.get(2), &name, px);
    let lock = rl.get_lock(&name).unwrap();

    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .expect("try_lock_timeout")
        .expect("not acquired within 5 s although the foreign keys expire after 300 ms");
    let waited = set_at.elapsed();
    assert!(
        waited >= px - Duration::from_millis(50),
        "acquired after {waited:?}, before the foreign keys could expire"
    );
    assert!(guard.is_held(), "the returned lease is not valid");
    guard.ensure_held().expect("ensure_held");
    let remaining = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    assert!(
        remaining > LEASE - Duration::from_secs(5),
        "lease validity {remaining:?}, expected close to {LEASE:?}"
    );
    // A quorum has our key; a node whose foreign key expired a moment too late for the
    // acquisition may have none. The foreign keys end by their own TTL, the second one set
    // a moment after the first, so it may outlive the acquisition that the first one's end
    // allowed (seen in CI: our key on two nodes, the foreign one still on the third):
    // wait for that TTL, then look.
    common::wait_until(Duration::from_secs(2), "the foreign keys to expire", || {
        (0..3).all(|i| value(cluster.nodes.get(i), &name).as_deref() != Some(FOREIGN))
    });
    let values: Vec<Option<String>> = (0..3).map(|i| value(cluster.nodes.get(i), &name)).collect();
    let ours = values.iter().filter(|v| v.is_some()).count();
    assert!(
        ours >= 2 && values.iter().all(|v| v.as_deref() != Some(FOREIGN)),
        "after the foreign keys expired: expected our key on a quorum, found {values:?}"
    );
    guard.unlock().expect("unlock");
    for i in 0..3 {
        assert_absent(cluster.nodes.get(i), &name, "after unlock");
    }
}

// ---------------------------------------------------------------------------------------
// 7. SCRIPT FLUSH
// ---------------------------------------------------------------------------------------

#[test]
fn script_flush_on_every_node_is_survived() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let rl = client(calm(&cluster.nodes.urls()));
    let flush_all = || {
        for i in 0..3 {
            cluster.nodes.get(i).flush_scripts();
        }
    };
    let name = unique_name("flush");
    let lock = rl.get_lock(&name).unwrap();
    for round in 0..3 {
        let what = format!("round {round}");
        // Flushed before the acquisition (acquire gets NOSCRIPT)...
        flush_all();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}: try_lock after SCRIPT FLUSH: {e:?}"))
            .unwrap_or_else(|| panic!("{what}: not acquired after SCRIPT FLUSH"));
        for i in 0..3 {
            assert_ours(cluster.nodes.get(i), &name, &what);
        }
        // ...while held (extend gets NOSCRIPT)...
        flush_all();
        guard
            .extend(LEASE)
            .unwrap_or_else(|e| panic!("{what}: extend after SCRIPT FLUSH: {e:?}"));
        // ...and before the release (release gets NOSCRIPT).
        flush_all();
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("{what}: unlock after SCRIPT FLUSH: {e:?}"));
        for i in 0..3 {
            assert_absent(cluster.nodes.get(i), &name, &what);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 8. A node restarts (without its data) during lock/unlock cycles
// ---------------------------------------------------------------------------------------

#[test]
fn a_node_restart_during_fifty_cycles_is_survived() {
    let _serial = SERIAL.lock();
    let mut cluster = Cluster::new(3);
    let urls = cluster.nodes.urls();
    let rl = client(calm(&urls));
    let name = unique_name("restart");
    let lock = rl.get_lock(&name).unwrap();
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(1);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);

    thread::scope(|s| {
        let restarted = cluster.nodes.get_mut(1);
        s.spawn(move || {
            if go_rx.recv_timeout(Duration::from_secs(30)).is_ok() {
                restarted.restart();
                let _ = done_tx.send(());
            }
        });
        for cycle in 0..50 {
            if cycle == 10 {
                go_tx.send(()).unwrap();
            }
            if cycle == 40 {
                done_rx
                    .recv_timeout(Duration::from_secs(20))
                    .expect("the restart did not finish within 20 s");
            }
            let guard = lock
                .try_lock_timeout(Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("cycle {cycle}: try_lock_timeout: {e:?}"))
                .unwrap_or_else(|| panic!("cycle {cycle}: not acquired within 2 s"));
            assert!(guard.is_held(), "cycle {cycle}");
            guard
                .unlock()
                .unwrap_or_else(|e| panic!("cycle {cycle}: unlock: {e:?}"));
        }
    });

    // The restarted node is back in use once the pool's background reconnect has found
    // it up (every half connect timeout): within 5 s, an acquisition holds all three.
    assert!(cluster.nodes.get(1).is_running());
    let deadline = Instant::now() + Duration::from_secs(5);
    let guard = loop {
        let guard = lock
            .try_lock()
            .expect("after the loop")
            .expect("after the loop: acquired");
        if (0..3).all(|i| value(cluster.nodes.get(i), &name).is_some()) {
            break guard;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node was not used again within 5 s"
        );
        guard.unlock().expect("after the loop: unlock");
        thread::sleep(Duration::from_millis(10));
    };
    for i in 0..3 {
        assert_ours(cluster.nodes.get(i), &name, "after the restart");
    }
    guard.unlock().expect("after the loop: unlock");
    for i in 0..3 {
        assert_absent(cluster.nodes.get(i), &name, "after the restart, unlock");
    }
}

// ---------------------------------------------------------------------------------------
// 9. The quorum table
// ---------------------------------------------------------------------------------------

#[test]
fn quorum_is_a_strict_majority_and_decides_acquisition() {
    let _serial = SERIAL.lock();
    let table: Vec<usize> = (1..=7).map(dlm_redis::quorum).collect();
    assert_eq!(table, [1, 2, 2, 3, 3, 4, 4]);

    for n in 1..=5usize {
        let q = dlm_redis::quorum(n);
        let mut cluster = Cluster::new(n);
        let urls = cluster.nodes.urls();
        let backend = calm(&urls);
        assert_eq!(backend.nodes(), n, "nodes() of {n}");
        assert_eq!(backend.quorum(), q, "quorum() of {n}");
        let rl = client(backend);

        // n - q nodes down (from the end): still a quorum.
        for i in q..n {
            cluster.nodes.get_mut(i).kill();
        }
        let name = unique_name("quorum");
        let lock = rl.get_lock(&name).unwrap();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{n} nodes, {} down: try_lock: {e:?}", n - q))
            .unwrap_or_else(|| panic!("{n} nodes, {} down: not acquired", n - q));
        for i in 0..q {
            assert_ours(cluster.nodes.get(i), &name, &format!("{n} nodes"));
        }
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("{n} nodes, {} down: unlock: {e:?}", n - q));

        // One more down: no quorum, and nothing left behind on the live nodes.
        cluster.nodes.get_mut(q - 1).kill();
        expect_no_quorum(
            lock.try_lock(),
            &format!("{n} nodes, {} down: try_lock", n - q + 1),
        );
        for i in 0..q - 1 {
            assert_absent(
                cluster.nodes.get(i),
                &name,
                &format!("{n} nodes, no quorum"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 10. Duplicate nodes
// ---------------------------------------------------------------------------------------

/// Removes the unix socket file at the end of the test, whatever happens.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn duplicate_nodes_are_rejected_and_a_down_node_is_not() {
    let _serial = SERIAL.lock();
    dlm_testkit::redis_server::require_redis_server();
    let a = RedisServer::spawn();
    let socket = SocketFile(std::env::temp_dir().join(format!(
        "{}-{}.sock",
        unique_name("dlm-rl"),
        std::process::id()
    )));
    let u = RedisServer::builder()
        .arg("--unixsocket")
        .arg(socket.0.to_str().expect("a UTF-8 temp dir"))
        .spawn();
    let mut down = RedisServer::spawn();
    let down_url = down.url();
    down.kill();

    let pa = a.port();
    let unix_url = format!("redis+unix://{}", socket.0.display());
    // The unix socket really reaches u.
    let mut con = redis::Client::open(unix_url.as_str())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connecting through the unix socket");
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");

    expect_invalid(Redlock::new(&[a.url(), a.url()]), "the same URL twice");
    expect_invalid(
        Redlock::new(&[
            format!("redis://127.0.0.1:{pa}/"),
            format!("redis://localhost:{pa}/"),
        ]),
        "127.0.0.1 and localhost",
    );
    expect_invalid(
        Redlock::new(&[
            format!("redis://127.0.0.1:{pa}/0"),
            format!("redis://127.0.0.1:{pa}/1"),
        ]),
        "two databases of one server",
    );
    expect_invalid(
        Redlock::new(&[u.url(), a.url(), unix_url.clone()]),
        "one server through TCP and a unix socket",
    );
    expect_invalid(Redlock::new::<&str>(&[]), "no nodes");

    // Distinct servers are accepted, whatever the transport.
    let ok = Redlock::new(&[a.url(), unix_url.clone()]).expect("two distinct servers");
    assert_eq!(ok.nodes(), 2);
    drop(ok);

    // A node down at construction is not checked and does not fail construction; the
    // others form the quorum.
    let rl = fast(&[a.url(), unix_url.clone(), down_url]);
    assert_eq!((rl.nodes(), rl.quorum()), (3, 2));
    let rl = client(rl);
    let name = unique_name("down-at-build");
    let guard = rl
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .expect("try_lock with one node down since construction")
        .expect("acquired by the two live nodes");
    assert_ours(&a, &name, "node a");
    assert_ours(&u, &name, "node u (unix socket)");
    guard.unlock().expect("unlock");
    assert_absent(&a, &name, "node a, after unlock");
    assert_absent(&u, &name, "node u, after unlock");
}

// ---------------------------------------------------------------------------------------
// 11. Node order
// ---------------------------------------------------------------------------------------

#[test]
fn quorum_counting_does_not_depend_on_node_order() {
    let _serial = SERIAL.lock();
    let mut cluster = Cluster::new(3);
    let urls = cluster.nodes.urls();
    cluster.nodes.get_mut(0).kill();
    let (a, b, c) = (urls[0].clone(), urls[1].clone(), urls[2].clone());
    let orders = [
        vec![a.clone(), b.clone(), c.clone()],
        vec![b.clone(), c.clone(), a.clone()],
        vec![c, a, b],
    ];
    let clients: Vec<LockClient> = orders.iter().map(|o| client(calm(o))).collect();
    let (b, c) = (cluster.nodes.get(1), cluster.nodes.get(2));

    for (i, cl) in clients.iter().enumerate() {
        let name = unique_name("order");
        let guard = cl
            .get_lock(&name)
            .unwrap()
            .try_lock()
            .unwrap_or_else(|e| panic!("order {i}: try_lock: {e:?}"))
            .unwrap_or_else(|| panic!("order {i}: not acquired"));
        assert_ours(b, &name, &format!("order {i}"));
        assert_ours(c, &name, &format!("order {i}"));
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("order {i}: unlock: {e:?}"));
    }

    // The three orders agree on one lock: whoever holds it excludes the others.
    let name = unique_name("order-shared");
    for (i, holder) in clients.iter().enumerate() {
        let guard = holder
            .get_lock(&name)
            .unwrap()
            .try_lock()
            .unwrap_or_else(|e| panic!("holder {i}: try_lock: {e:?}"))
            .unwrap_or_else(|| panic!("holder {i}: not acquired"));
        for (j, other) in clients.iter().enumerate() {
            if j != i {
                let r = other
                    .get_lock(&name)
                    .unwrap()
                    .try_lock()
                    .unwrap_or_else(|e| panic!("order {j} while {i} holds: {e:?}"));
                assert!(
                    r.is_none(),
                    "order {j} acquired while order {i} holds the lock"
                );
            }
        }
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("holder {i}: unlock: {e:?}"));
    }
}

// ---------------------------------------------------------------------------------------
// 12. Extend and release count confirmations against the quorum
// ---------------------------------------------------------------------------------------

#[test]
fn extend_and_release_report_the_quorum_of_confirmations() {
    let _serial = SERIAL.lock();
    let cluster = Cluster::new(3);
    let rl = LockClient::builder(Arc::new(calm(&cluster.nodes.urls())))
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let nodes = [
        cluster.nodes.get(0),
        cluster.nodes.get(1),
        cluster.nodes.get(2),
    ];

    // Expired early on two nodes of three: the lock is lost.
    let name = unique_name("lost");
    let lock = rl.get_lock(&name).unwrap();
    let guard = lock.try_lock().unwrap().expect("acquired");
    nodes[0].expire_now(&key(&name));
    nodes[1].expire_now(&key(&name));
    match guard.extend(Duration::from_secs(30)) {
        Err(Error::LockLost) => {}
        other => panic!("extend with our key on 1 of 3 nodes: expected LockLost, got {other:?}"),
    }
    assert!(
        !guard.is_held(),
        "a guard whose extension found the lock lost"
    );
    assert_absent(nodes[0], &name, "extend must not re-create the key");
    assert_absent(nodes[1], &name, "extend must not re-create the key");
    match guard.unlock() {
        Err(Error::LockLost) => {}
        other => panic!("unlock with our key on 1 of 3 nodes: expected LockLost, got {other:?}"),
    }
    // The release still cleaned up the node where the key was ours.
    assert_absent(nodes[2], &name, "after the LockLost unlock");

    // Expired early on one node of three: a quorum still has it.
    let name = unique_name("kept");
    let lock = rl.get_lock(&name).unwrap();
    let guard = lock.try_lock().unwrap().expect("acquired");
    nodes[0].expire_now(&key(&name));
    guard
        .extend(Duration::from_secs(30))
        .expect("extend with our key on 2 of 3 nodes");
    assert!(guard.is_held());
    assert!(
        guard.valid_until() > Instant::now() + Duration::from_secs(20),
        "the extension to 30 s did not reach the guard's lease"
    );
    for s in &nodes[1..] {
        let ttl = pttl(s, &name);
        assert!(
            ttl > 20_000,
            "PTTL {ttl} ms on port {} after extend(30 s)",
            s.port()
        );
    }
    assert_absent(nodes[0], &name, "extend must not re-create the key");
    guard.unlock().expect("unlock with our key on 2 of 3 nodes");
    for s in &nodes {
        assert_absent(s, &name, "after unlock");
    }
}
