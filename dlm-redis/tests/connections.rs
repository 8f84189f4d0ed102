//! Lock connections honour the URL: its user and password, and its database.
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;

/// How many keys database `db` holds, and the lease left on `key` there (ms; -2: none).
fn look(server: &RedisServer, db: i64, key: &str) -> (u64, i64) {
    let mut admin = server.connection();
    let _: () = redis::cmd("SELECT").arg(db).query(&mut admin).unwrap();
    let size: u64 = redis::cmd("DBSIZE").query(&mut admin).unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut admin).unwrap();
    (size, pttl)
}

#[test]
fn the_urls_user_password_and_database_are_used() {
    common::require();
    let server = RedisServer::builder()
        .password("admin-pw")
        .acl_user("app", "on >app-pw ~* &* +@all")
        .credentials("app", "app-pw")
        .spawn();
    let url = format!("{}5", server.url());
    assert!(url.starts_with("redis://app:app-pw@"), "{url}");
    let backend = RedisBackend::builder(&url)
        .prefix("conn")
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.get_lock("db-test").unwrap();
    let guard = lock
        .try_lock_timeout(Duration::ZERO)
        .unwrap()
        .expect("free");

    let (size, pttl) = look(&server, 5, "conn:{db-test}");
    assert!(
        size >= 1 && pttl > 0,
        "database 5: {size} keys, pttl {pttl}"
    );
    assert_eq!(
        look(&server, 0, "conn:{db-test}"),
        (0, -2),
        "database 0 was written"
    );
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    assert!(
        clients
            .lines()
            .any(|l| l.contains(" user=app ") && l.contains(" db=5 ")),
        "no connection of user app on database 5:\n{clients}"
    );

    guard.unlock().unwrap();
    assert_eq!(look(&server, 5, "conn:{db-test}").1, -2, "not released");
}

#[test]
fn a_password_the_server_does_not_expect_is_an_auth_error() {
    common::require();
    let server = RedisServer::spawn(); // no password set
    let url = server.url().replacen("redis://", "redis://:not-needed@", 1);
    let backend = RedisBackend::builder(&url)
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let err = client
        .get_lock("auth")
        .unwrap()
        .try_lock()
        .expect_err("the server refuses AUTH");
    match &err {
        dlm_core::Error::Backend(e) => assert_eq!(
            e.kind(),
            dlm_core::BackendErrorKind::Auth,
            "{err}: refused credentials must not look transient"
        ),
        other => panic!("not a backend error: {other:?}"),
    }
    assert!(!err.to_string().contains("not-needed"), "password in {err}");
}

/// Pooled connections the server closed while they were idle (`CLIENT KILL`, a restart,
/// its `timeout`, a Sentinel demotion) are dropped when taken from the pool, not used
/// (once idle for 1 ms): the holder's release after the kill succeeds (it failed with an
/// I/O error).
#[test]
fn idle_connections_the_server_closed_are_not_used() {
    common::require();
    let server = RedisServer::spawn();
    let client = LockClient::new(RedisBackend::new(&server.url()).unwrap());
    let lock = client.get_lock("idle-killed").unwrap();
    let guard = lock.lock().unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut server.connection())
        .unwrap();
    assert!(killed >= 1, "the client's pooled connection was not killed");
    // Idle for longer than the 1 ms under which a checkout does not look (a busy
    // connection is not checked): the passage of time is the condition here.
    std::thread::sleep(Duration::from_millis(5));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

/// A server that refuses connections (it died; a master a failover left behind) fails a
/// request as soon as an attempt is refused, not after the whole connect timeout: r2d2's
/// checkout waits for the timeout even then. Found by a cluster waiter that woke 0.5-1 s
/// after a release because its first request went to the dead master.
#[test]
fn a_refused_connection_fails_the_request_without_waiting_for_the_connect_timeout() {
    common::require();
    let mut server = RedisServer::spawn();
    let url = server.url();
    let connect_timeout = Duration::from_secs(5);
    let client = LockClient::new(
        RedisBackend::builder(&url)
            .connect_timeout(connect_timeout)
            .build()
            .unwrap(),
    );
    let lock = client.get_lock("refused").unwrap();
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
    server.kill();
    // The pooled connection is idle (1 ms or more) and closed: dropped, and the new one
    // is refused.
    std::thread::sleep(Duration::from_millis(5));
    let start = std::time::Instant::now();
    let e = lock.try_lock().unwrap_err();
    let took = start.elapsed();
    assert_eq!(
        e.backend_kind(),
        Some(dlm_core::BackendErrorKind::Unavailable),
        "{e}"
    );
    assert!(
        took < connect_timeout / 2,
        "a refused connection took {took:?} (connect timeout {connect_timeout:?})"
    );
}
