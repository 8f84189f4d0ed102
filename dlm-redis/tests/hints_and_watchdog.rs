//! Release hints and lease renewal against real servers: a killed subscriber connection,
//! a forged release message, an ACL without channel rights, a paused server under a
//! watchdog-renewed lock, a Redlock release that has reached one node of three.
mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use dlm_core::backend::{Acquire, LockBackend, LockName, OwnerToken};
use dlm_core::{DistributedLock, Error, Lock, LockClient, RetryPolicy};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::{CountingBackend, unique_name};

/// These tests pause servers or measure wake-ups: one at a time.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn backend(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// A thread that waits up to 30 s for `lock`, reports when it got it, and unlocks.
fn spawn_waiter(
    lock: DistributedLock,
) -> (thread::JoinHandle<()>, crossbeam_channel::Receiver<Instant>) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let t = thread::spawn(move || {
        let g = lock.try_lock_timeout(Duration::from_secs(30)).unwrap();
        tx.send(Instant::now()).unwrap();
        g.expect("waiter timed out").unlock().unwrap();
    });
    (t, rx)
}

fn slow_retry() -> RetryPolicy {
    RetryPolicy::new()
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .unwrap()
}

#[test]
fn a_killed_subscriber_connection_is_replaced_and_the_waiter_served() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let url = fixture.server.url();
    let name = unique_name("killed-sub");
    let holder = LockClient::new(backend(&url))
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let waiting_backend = Arc::new(backend(&url));
    let waiter = LockClient::builder(waiting_backend.clone())
        .retry(slow_retry())
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap();
    let (t, rx) = spawn_waiter(waiter);
    wait_for("the listener to subscribe", || {
        waiting_backend.release_hints_active()
    });
    kill_subscribers(&fixture);
    // The release is seen soon (the listener is back, or the waiter's backoff), not at the
    // end of the 30 s lease.
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(300)),
        Err(RecvTimeoutError::Timeout)
    ));
    let released = Instant::now();
    holder.unlock().unwrap();
    let acquired = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("waiter stuck");
    assert!(
        acquired - released < Duration::from_secs(2),
        "took {:?} after the release",
        acquired - released
    );
    t.join().unwrap();
    wait_for("the listener to resubscribe", || {
        waiting_backend.release_hints_active()
    });
}

/// A holder, and a waiter on another backend of the same server with a 10 s backoff (so
/// that only a release hint wakes it sooner), waiting; returns once it waits.
fn held_and_awaited(
    fixture: &common::Single,
    name: &str,
) -> (
    dlm_core::LockGuard,
    Arc<RedisBackend>,
    thread::JoinHandle<()>,
    crossbeam_channel::Receiver<Instant>,
) {
    let url = fixture.server.url();
    let holder = LockClient::new(backend(&url))
        .get_lock(name)
        .unwrap()
        .lock()
        .unwrap();
    let waiting_backend = Arc::new(backend(&url));
    let ten_seconds = RetryPolicy::new()
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .unwrap();
    let waiter = LockClient::builder(waiting_backend.clone())
        .retry(ten_seconds)
        .build()
        .unwrap()
        .get_lock(name)
        .unwrap();
    let (t, rx) = spawn_waiter(waiter);
    wait_for("the listener to subscribe", || {
        waiting_backend.release_hints_active()
    });
    // The waiter marks the key once it waits (see the crate docs).
    let key = format!("dlm:{{{name}}}");
    wait_for("the waiter to wait", || {
        let v: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query(&mut fixture.server.connection())
            .unwrap();
        v.is_some_and(|v| v.ends_with('~'))
    });
    (holder, waiting_backend, t, rx)
}

fn kill_subscribers(fixture: &common::Single) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut fixture.server.connection())
        .unwrap();
    assert_eq!(killed, 1, "one subscriber connection expected");
}

/// A waiter keeps its subscription while the listener reconnects (a restart, a failover,
/// `CLIENT KILL`): a release after the reconnection wakes it at once. Before, the lost
/// subscription left it polling with its (here 10 s) backoff for good; found by the
/// Sentinel failover test.
#[test]
fn a_waiter_is_woken_after_its_listener_reconnected() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let name = unique_name("reconnected");
    let (holder, waiting_backend, t, rx) = held_and_awaited(&fixture, &name);
    kill_subscribers(&fixture);
    wait_for("the listener to resubscribe", || {
        waiting_backend.release_hints_active()
    });
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(300)),
        Err(RecvTimeoutError::Timeout)
    ));
    let released = Instant::now();
    holder.unlock().unwrap();
    let after = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("waiter stuck")
        - released;
    eprintln!("woken {after:?} after the release");
    assert!(
        after < Duration::from_secs(2),
        "took {after:?}: the release after the reconnection was not heard"
    );
    t.join().unwrap();
}

/// Every waiter is woken when its listener is back: a release that went unheard while it
/// was away (here the key is deleted without a message before the connection is killed)
/// costs the reconnection, not the waiter's backoff.
#[test]
fn a_release_unheard_while_the_listener_reconnects_wakes_the_waiter() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let name = unique_name("unheard");
    let (holder, _backend, t, rx) = held_and_awaited(&fixture, &name);
    let _: i64 = redis::cmd("DEL")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut fixture.server.connection())
        .unwrap();
    assert!(
        matches!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout)
        ),
        "woken without a message"
    );
    let killed_at = Instant::now();
    kill_subscribers(&fixture);
    let after = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("waiter stuck")
        - killed_at;
    eprintln!("woken {after:?} after the listener's connection was killed");
    assert!(after < Duration::from_secs(2), "took {after:?}");
    t.join().unwrap();
    holder.into_hold(); // its key is gone: nothing to release
}

#[test]
fn a_forged_release_message_causes_one_retry_only() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let url = fixture.server.url();
    let name = unique_name("forged");
    let holder = LockClient::new(backend(&url))
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let counting = Arc::new(CountingBackend::new(Arc::new(backend(&url))));
    let waiter = LockClient::builder(counting.clone())
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap();
    let (t, rx) = spawn_waiter(waiter);
    // Two attempts (before and after subscribing), then the waiter sleeps.
    wait_for("the waiter to settle", || counting.calls() >= 2);
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(200)),
        Err(RecvTimeoutError::Timeout)
    ));
    assert_eq!(counting.calls(), 2, "a sleeping waiter sent requests");
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg(format!("dlm:{{{name}}}:released"))
        .arg("424242")
        .query(&mut fixture.server.connection())
        .unwrap();
    assert_eq!(receivers, 1);
    wait_for("the retry", || counting.calls() >= 3);
    assert!(
        matches!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout)
        ),
        "a forged message handed over a held lock"
    );
    assert_eq!(counting.calls(), 3, "more than one retry");
    holder.unlock().unwrap();
    rx.recv_timeout(Duration::from_secs(5)).expect("not woken");
    t.join().unwrap();
}

#[test]
fn a_user_without_channel_rights_still_locks_by_polling() {
    let _serial = SERIAL.lock();
    common::Single::new(); // fails loudly without redis-server
    let server = RedisServer::builder()
        .acl_user("app", "on >app-pw ~dlm:* resetchannels +@all")
        .credentials("app", "app-pw")
        .spawn();
    let url = server.url();
    let name = unique_name("no-channels");
    let holder = LockClient::new(backend(&url))
        .get_lock(&name)
        .unwrap()
        .lock()
        .unwrap();
    let waiting_backend = Arc::new(backend(&url));
    let waiter = LockClient::builder(waiting_backend.clone())
        .retry(slow_retry())
        .build()
        .unwrap()
        .get_lock(&name)
        .unwrap();
    let (t, rx) = spawn_waiter(waiter);
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(300)),
        Err(RecvTimeoutError::Timeout)
    ));
    assert!(!waiting_backend.release_hints_active());
    let released = Instant::now();
    holder.unlock().unwrap(); // the PUBLISH inside is refused, the release is not
    let acquired = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("waiter stuck");
    assert!(acquired - released < Duration::from_secs(2));
    t.join().unwrap();
}

#[test]
fn a_paused_server_makes_renewal_fail_and_the_guard_reports_the_loss() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let quick = RedisBackend::builder(&fixture.server.url())
        .io_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let client = LockClient::builder(Arc::new(quick))
        .watchdog_timeout(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = client
        .get_lock(&unique_name("paused"))
        .unwrap()
        .lock()
        .unwrap();
    let lost = guard.lost_signal();
    fixture.server.pause();
    let outcome = lost.wait_timeout(Duration::from_secs(5));
    fixture.server.resume();
    assert_eq!(
        outcome,
        dlm_core::HoldState::Lost,
        "the loss was not signalled"
    );
    assert!(!guard.is_held());
    assert!(matches!(guard.ensure_held(), Err(Error::LockLost)));
}

#[test]
fn the_watchdog_renews_on_redis_for_three_timeouts() {
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let url = fixture.server.url();
    let client = LockClient::builder(Arc::new(backend(&url)))
        .watchdog_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let name = unique_name("renewed");
    let guard = client.get_lock(&name).unwrap().lock().unwrap();
    let other = LockClient::new(backend(&url)).get_lock(&name).unwrap();
    assert!(
        other
            .try_lock_timeout(Duration::from_millis(1000))
            .unwrap()
            .is_none()
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut fixture.server.connection())
        .unwrap();
    assert!(pttl > 0 && pttl <= 300, "PTTL {pttl}");
    guard.unlock().unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut fixture.server.connection())
        .unwrap();
    assert_eq!(exists, 0, "the key survived the unlock");
}

#[test]
fn a_lost_release_message_costs_at_most_the_holders_remaining_lease() {
    // The holder's key goes without a release message (deleted by hand: no PUBLISH). A
    // waiter of another process hears nothing, and looks again when the holder's lease
    // ends, not later: the documented cost of a lost message.
    let _serial = SERIAL.lock();
    let fixture = common::Single::new();
    let url = fixture.server.url();
    let name = unique_name("lost-message");
    let lease = Duration::from_millis(1500);
    let holder = LockClient::builder(Arc::new(backend(&url)))
        .lease(lease)
        .build()
        .unwrap();
    let held = holder.get_lock(&name).unwrap().lock().unwrap();
    let lease_end = held.valid_until();
    let waiter_backend = backend(&url);
    let waiter = LockClient::new(waiter_backend.clone());
    let (t, got) = spawn_waiter(waiter.get_lock(&name).unwrap());
    wait_for("the waiter subscribed", || {
        waiter_backend.release_hints_active()
    });
    // Deleted early: the lock is free from now on, but nobody says so.
    let freed = Instant::now();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut fixture.server.connection())
        .unwrap();
    held.into_hold();
    let at = got.recv_timeout(Duration::from_secs(10)).unwrap();
    t.join().unwrap();
    // Not before the holder's lease could have ended (it slept until then), and well
    // within a margin after it.
    assert!(
        at + Duration::from_millis(50) >= lease_end,
        "woken {:?} before the lease end without a message",
        lease_end - at
    );
    assert!(
        at < lease_end + Duration::from_millis(500),
        "acquired {:?} after the holder's lease ended",
        at - lease_end
    );
    assert!(at - freed < lease + Duration::from_millis(500));
}

/// A Redlock release reaches the nodes one after another, and each publishes its own
/// message. Woken by the first node's, a waiter would find the lock still held on the
/// others and fail, and the undo of its partial acquisition would wake the next waiter,
/// which failed the same way: under load, up to 447 requests for one hand-over among 16
/// waiters. The holder's release here is stopped after its first node (by releasing on
/// that node alone): no waiter may stir until a quorum has released, then exactly one
/// wins, with one request.
#[test]
fn a_redlock_release_heard_from_one_node_of_three_wakes_no_one_until_a_quorum_released() {
    let _serial = SERIAL.lock();
    let fixture = common::Cluster::new(3);
    let name = unique_name("partial-release");
    let lock_name = LockName::new(&name).unwrap();
    let holder = fixture.redlock();
    let owner = OwnerToken::random_for_tests(7);
    assert!(matches!(
        holder
            .try_acquire(&lock_name, &owner, Duration::from_secs(30))
            .unwrap(),
        Acquire::Acquired(_)
    ));
    let counting = Arc::new(CountingBackend::new(Arc::new(fixture.redlock())));
    let (won_tx, won_rx) = crossbeam_channel::unbounded();
    let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let lock = LockClient::builder(counting.clone())
                .build()
                .unwrap()
                .get_lock(&name)
                .unwrap();
            let (won_tx, go_rx) = (won_tx.clone(), go_rx.clone());
            thread::spawn(move || {
                let g = lock.try_lock_timeout(Duration::from_secs(60)).unwrap();
                let g = g.expect("waiter gave up");
                won_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    // Two attempts each (before and after subscribing), then they sleep.
    wait_for("the waiters to settle", || counting.calls() >= 8);
    assert!(matches!(
        won_rx.recv_timeout(Duration::from_millis(300)),
        Err(RecvTimeoutError::Timeout)
    ));
    let settled = counting.calls();
    assert_eq!(settled, 8, "sleeping waiters sent requests");
    // The holder's release as it reaches its first node: the key deleted and the release
    // announced (with one id for every node, as the release script does).
    let keys = holder.keys(&name).unwrap();
    let release_id = "424242424242"; // even: a holder's release, not an undo
    let release_on = |i: usize| {
        let mut con = fixture.nodes.get(i).connection();
        let deleted: i64 = redis::cmd("DEL").arg(&keys.lock).query(&mut con).unwrap();
        assert_eq!(deleted, 1);
        let heard: i64 = redis::cmd("PUBLISH")
            .arg(&keys.channel)
            .arg(release_id)
            .query(&mut con)
            .unwrap();
        assert_eq!(heard, 1, "the waiters' listener on node {i}");
    };
    release_on(0);
    assert!(
        matches!(
            won_rx.recv_timeout(Duration::from_millis(500)),
            Err(RecvTimeoutError::Timeout)
        ),
        "a waiter got a lock still held on two nodes of three"
    );
    assert_eq!(
        counting.calls(),
        settled,
        "waiters woken by one node's release message sent requests"
    );
    // The second node: a quorum has released it.
    release_on(1);
    won_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("nobody woke after a quorum released");
    assert!(
        matches!(
            won_rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout)
        ),
        "two winners"
    );
    assert_eq!(
        counting.calls() - settled,
        1,
        "one request for the hand-over"
    );
    // The rest of the holder's release, and the others' turns.
    release_on(2);
    for _ in 0..4 {
        go_tx.send(()).unwrap();
    }
    for _ in 1..4 {
        won_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a waiter starved");
    }
    for w in waiters {
        w.join().unwrap();
    }
}

/// Hand-overs between the threads of one process do not shut out a waiter of another:
/// three threads of one backend and one thread of another take one lock in a loop, hold
/// 0, for a second. After a run of hand-overs a release lets the lock go free and the
/// first process's waiters hold back until the release's message is back, so the other
/// process's thread takes its share (measured, three runs of 3 s: 0.78-0.94 of a thread
/// of the first; without the hold-back 0.30-0.39; without the limit on hand-overs in a
/// row, 1 hold in 3 s).
#[test]
fn hand_overs_within_a_process_leave_a_share_to_another_process() {
    let _serial = SERIAL.lock();
    let server = RedisServer::spawn();
    let (a, b) = (
        Arc::new(backend(&server.url())),
        Arc::new(backend(&server.url())),
    );
    let name = unique_name("shared");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let lock = LockClient::new(if t < 3 { a.clone() } else { b.clone() })
                .get_lock(&name)
                .unwrap();
            let (stop, start) = (stop.clone(), start.clone());
            thread::spawn(move || {
                let (mut holds, mut longest) = (0u64, Duration::ZERO);
                start.wait();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let asked = Instant::now();
                    let g = lock.try_lock_timeout(Duration::from_secs(10)).unwrap();
                    longest = longest.max(asked.elapsed());
                    g.expect("no wait of 10 s").unlock().unwrap();
                    holds += 1;
                }
                (holds, longest)
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let results: Vec<(u64, Duration)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let first: u64 = results[..3].iter().map(|r| r.0).sum::<u64>() / 3;
    let (other, longest) = results[3];
    assert!(first > 0, "{results:?}");
    assert!(
        other * 10 >= first,
        "the other process's thread took {other} holds, a thread of the first {first}: {results:?}"
    );
    assert!(
        longest < Duration::from_secs(1),
        "the other process's thread waited {longest:?} at most once: {results:?}"
    );
}

/// A user who may subscribe but not publish (`+@all -publish`): the release that lets the
/// lock go free after a run of hand-overs cannot announce itself, and says so, so this
/// process's waiter is woken at once instead of waiting for a message that never comes
/// (until the holder's lease would have ended: 30 s here). Two threads of one backend pass
/// the lock back and forth, one step at a time, through a whole run.
#[test]
fn after_a_run_of_hand_overs_a_release_that_may_not_publish_wakes_the_waiter_here() {
    let _serial = SERIAL.lock();
    common::Single::new(); // fails loudly without redis-server
    let server = RedisServer::builder()
        .acl_user("app", "on >app-pw ~dlm:* &* +@all -publish")
        .credentials("app", "app-pw")
        .spawn();
    let shared = Arc::new(backend(&server.url()));
    let name = unique_name("no-publish");
    // A party holds the lock when told to `true` (its `lock` waits as long as it must)
    // and releases it when told `false`; it says when it got it.
    let party = |shared: &Arc<RedisBackend>| {
        let lock = LockClient::new(shared.clone()).get_lock(&name).unwrap();
        let (tell, told) = crossbeam_channel::unbounded::<bool>();
        let (got_tx, got) = crossbeam_channel::unbounded::<()>();
        let t = thread::spawn(move || {
            let mut guard = None;
            for take in told {
                if take {
                    guard = Some(lock.lock().unwrap());
                    got_tx.send(()).unwrap();
                } else {
                    guard.take().expect("held").unlock().unwrap();
                }
            }
        });
        (tell, got, t)
    };
    let (a, b) = (party(&shared), party(&shared));
    let offered = || {
        wait_for("a waiter asleep, offering", || {
            shared.handover_offers(&name) == 1
        })
    };
    a.0.send(true).unwrap();
    a.1.recv_timeout(Duration::from_secs(5)).expect("free");
    let (mut holder, mut waiter) = (&a, &b);
    let runs = dlm_core::backend::MAX_HANDOVERS_IN_A_ROW + 1;
    for release in 1..=runs {
        waiter.0.send(true).unwrap();
        offered();
        holder.0.send(false).unwrap();
        // The last release lets the lock go free: its message is refused.
        waiter
            .1
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("release {release} of {runs} left its waiter asleep"));
        (holder, waiter) = (waiter, holder);
    }
    holder.0.send(false).unwrap();
    for (tell, _, t) in [a, b] {
        drop(tell);
        t.join().unwrap();
    }
}
