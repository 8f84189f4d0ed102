//! A server that is busy, full, paused, down at construction or out of pooled
//! connections: the right typed error, within its deadline, and recovery once the fault is
//! gone (see `shared/RELIABILITY.md`, "Bad input and misuse").
mod common;

use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_core::{Lock, LockClient, RetryPolicy};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::errors::*;

// ---------------------------------------------------------------------------------------
// 8. BUSY
// ---------------------------------------------------------------------------------------

#[test]
fn a_server_busy_with_a_long_script_is_reported_as_busy_and_recovers() {
    let _serial = serial();
    let server = spawn(
        RedisServer::builder()
            .arg("--busy-reply-threshold")
            .arg("100"),
    );
    let client = client(&server.url());
    let name = unique_name("busy");
    let lock = client.get_lock(&name).unwrap();
    // Warm up the pool, and open the admin and probe connections before the server blocks.
    let warm = lock.try_lock().unwrap().expect("free");
    let first = warm.fencing_token().expect("fenced");
    warm.unlock().unwrap();
    let mut admin = server.connection();
    let mut probe = server.connection();
    let mut looper = server.connection();

    let script = thread::spawn(move || {
        redis::cmd("EVAL")
            .arg("local i = 0 while true do i = i + 1 end")
            .arg(0)
            .query::<()>(&mut looper)
    });
    common::wait_until(Duration::from_secs(10), "PING answered BUSY", || {
        let reply = redis::cmd("PING").query::<String>(&mut probe);
        reply.is_err_and(|e| e.code() == Some("BUSY"))
    });

    let start = Instant::now();
    let e = expect_kind(
        lock.try_lock(),
        BackendErrorKind::Busy,
        "try_lock while BUSY",
    );
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert!(e.is_transient(), "Busy is transient");
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::Busy,
        "is_locked while BUSY",
    );

    let _: () = query(&mut admin, redis::cmd("SCRIPT").arg("KILL"));
    let outcome = script.join().expect("the script thread");
    assert!(outcome.is_err(), "the killed script must end with an error");
    common::wait_until(Duration::from_secs(5), "PONG after SCRIPT KILL", || {
        redis::cmd("PING").query::<String>(&mut probe).is_ok()
    });

    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free after the script was killed");
    assert!(guard.fencing_token().ok() > Some(first));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

// ---------------------------------------------------------------------------------------
// 9. Max clients
// ---------------------------------------------------------------------------------------

#[test]
fn max_clients_reached_is_reported_as_unavailable_and_recovers() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxclients").arg("1"),
    );
    let client = client(&server.url());
    let lock = client.get_lock(&unique_name("maxc")).unwrap();
    let start = Instant::now();
    let e = expect_kind(
        lock.try_lock(),
        BackendErrorKind::Unavailable,
        "max clients",
    );
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert!(e.is_transient());

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxclients").arg("100"),
    );
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free once clients are allowed again");
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 10. Paused server
// ---------------------------------------------------------------------------------------

#[test]
fn a_paused_server_fails_calls_within_the_deadline_and_recovers_cleanly() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    // One pooled connection: a timed-out connection that went back into the pool would be
    // the one the next call uses, and would read the late reply of the earlier command.
    let backend: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::builder(&server.url())
            .pool_size(1)
            .io_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(3))
        .retry(RetryPolicy::new().error_timeout(Duration::from_millis(500)))
        .build()
        .unwrap();
    let name = unique_name("pause");
    let lock = client.get_lock(&name).unwrap();
    let guard = lock.try_lock().unwrap().expect("free");
    let mut last_token = guard.fencing_token().unwrap().get();
    guard.unlock().unwrap();

    server.pause();
    let start = Instant::now();
    let r = lock.try_lock();
    let elapsed = start.elapsed();
    let e = r.expect_err("a paused server cannot grant a lock");
    assert!(
        matches!(
            kind(&e),
            Some(BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "expected Timeout or Unavailable, got {e:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "try_lock took {elapsed:?}"
    );
    // A blocking lock() gives up after the error timeout instead of hanging.
    let start = Instant::now();
    let e = lock
        .lock()
        .expect_err("a paused server cannot grant a lock");
    let elapsed = start.elapsed();
    assert!(
        matches!(
            kind(&e),
            Some(BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "expected Timeout or Unavailable, got {e:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "lock() took {elapsed:?}");
    let start = Instant::now();
    assert!(lock.is_locked().is_err(), "inspect on a paused server");
    assert!(start.elapsed() < Duration::from_secs(2));
    server.resume();

    // The same client and name: whatever the requests queued during the pause did, the
    // lock is ours or free, and every cycle works.
    for i in 0..5 {
        let guard = lock
            .try_lock_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cycle {i} after resume: {e:?}"))
            .unwrap_or_else(|| panic!("cycle {i} after resume: not acquired"));
        let token = guard.fencing_token().unwrap().get();
        assert!(
            token >= last_token,
            "cycle {i}: token {token} after {last_token}"
        );
        assert!(
            i == 0 || token > last_token,
            "cycle {i}: token {token} repeated"
        );
        last_token = token;
        assert!(lock.is_locked().unwrap());
        guard.unlock().unwrap();
    }
    // A fresh name through the same single pooled connection: exact answers, so a stale
    // reply (an array for an integer, another name's token) would show.
    let other = LockClient::builder(backend).build().unwrap();
    let fresh = other.get_lock(&unique_name("pause")).unwrap();
    // Tokens are ordered per name (this one may be in another slot, with another stream).
    let mut last_token = 0;
    for _ in 0..5 {
        assert!(!fresh.is_locked().unwrap());
        assert_eq!(fresh.remaining_lease().unwrap(), None);
        let guard = fresh.try_lock().unwrap().expect("free");
        let token = guard.fencing_token().unwrap().get();
        assert!(token > last_token, "token {token} after {last_token}");
        last_token = token;
        let remaining = fresh.remaining_lease().unwrap().expect("held");
        assert!(remaining <= Duration::from_secs(30) && remaining > Duration::from_secs(20));
        guard.unlock().unwrap();
    }
    assert!(!fresh.is_locked().unwrap());
}

// ---------------------------------------------------------------------------------------
// 11. Server down at construction
// ---------------------------------------------------------------------------------------

#[test]
fn a_server_down_at_construction_fails_calls_not_construction() {
    let _serial = serial();
    let mut server = spawn(RedisServer::builder());
    let url = server.url();
    server.kill();

    let start = Instant::now();
    let backend = RedisBackend::builder(&url)
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .build()
        .expect("construction does no I/O");
    assert!(start.elapsed() < Duration::from_millis(500));
    let client = LockClient::new(backend);
    let lock = client.get_lock(&unique_name("down")).unwrap();
    let start = Instant::now();
    expect_kind(
        lock.try_lock(),
        BackendErrorKind::Unavailable,
        "server down",
    );
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    expect_kind(lock.is_locked(), BackendErrorKind::Unavailable, "is_locked");

    // Redlock: unreachable nodes are not checked at build; calls report no quorum.
    let rl = Redlock::builder(&[url.as_str()])
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .build()
        .expect("unreachable nodes do not fail construction");
    let rl_client = LockClient::new(rl);
    let rl_lock = rl_client.get_lock(&unique_name("down")).unwrap();
    let start = Instant::now();
    expect_kind(
        rl_lock.try_lock(),
        BackendErrorKind::NoQuorum,
        "Redlock down",
    );
    assert!(start.elapsed() < Duration::from_secs(3));

    // Once the server is up, the same backend works.
    server.restart();
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free once the server is up");
    assert!(guard.fencing_token().is_ok());
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 12. Pool exhaustion
// ---------------------------------------------------------------------------------------

#[test]
fn waiters_hold_no_pooled_connection_so_the_holder_can_release() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let backend: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::builder(&server.url())
            .pool_size(1)
            .connect_timeout(Duration::from_secs(1))
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let a = LockClient::builder(backend.clone()).build().unwrap();
    let b = LockClient::builder(backend.clone()).build().unwrap();
    let name = unique_name("pool");
    let guard = a
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");

    let mut admin = server.connection();
    let before = command_calls(&mut admin, "evalsha");
    let unlocked = Arc::new(AtomicBool::new(false));
    let waiter = {
        let lock = b.get_lock(&name).unwrap();
        let unlocked = unlocked.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let r = lock.try_lock_timeout(Duration::from_secs(3));
            let saw_unlock = unlocked.load(Ordering::SeqCst);
            let token = match &r {
                Ok(Some(g)) => g.fencing_token().ok().map(|t| t.get()),
                _ => None,
            };
            (r.map(|g| g.is_some()), start.elapsed(), saw_unlock, token)
        })
    };
    // B has tried at least twice: it found the lock held and is in its wait loop.
    common::wait_until(Duration::from_secs(2), "B's attempts", || {
        command_calls(&mut admin, "evalsha") >= before + 2
    });
    let start = Instant::now();
    unlocked.store(true, Ordering::SeqCst);
    let r = guard.unlock();
    let unlock_took = start.elapsed();
    assert!(
        r.is_ok(),
        "the holder could not release while B waited: {r:?}"
    );
    assert!(
        unlock_took < Duration::from_secs(1),
        "unlock took {unlock_took:?}"
    );

    let (acquired, waited, saw_unlock, token) = waiter.join().unwrap();
    assert!(acquired.unwrap(), "B did not get the lock within 3 s");
    assert!(saw_unlock, "B acquired before A released");
    // A had 1; B's refused attempts counted too.
    assert!(token.is_some_and(|t| t >= 2), "B's token {token:?}");
    assert!(waited < Duration::from_secs(3), "B waited {waited:?}");
}
