//! EtcdBackend beyond the conformance suite: bad input, a server that is not etcd, the
//! watch thread's end, the key layout.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{LockBackend, LockName, OwnerToken};
use dlm_core::{BackendErrorKind, Lock, LockClient};
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::EtcdServer;

#[test]
fn bad_urls_are_refused_at_build_in_plain_words() {
    for (urls, why) in [
        (vec![], "at least one"),
        (vec!["127.0.0.1:2379"], "must start with http://"),
        (vec!["ftp://127.0.0.1:2379"], "or https://"),
        (vec!["http://127.0.0.1"], "has no port"),
        (
            vec!["http://127.0.0.1:1", "http://127.0.0.1:1/"],
            "listed twice",
        ),
    ] {
        let e = EtcdBackend::new(&urls).unwrap_err();
        assert!(e.reason().contains(why), "{urls:?}: {e}");
    }
}

/// Counts this process's threads named `dlm-etcd-watch`.
fn watch_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == "dlm-etcd-watch")
        .count()
}

#[test]
fn the_watch_thread_ends_with_its_backend_and_the_key_is_the_documented_one() {
    let server = EtcdServer::spawn();
    let before = watch_threads();
    let backend = common::backend(&[server.url()]);
    let name = LockName::new("layout").unwrap();
    assert_eq!(backend.key(&name), b"dlm/lock/layout");
    let owner = OwnerToken::random_for_tests(1);
    assert!(
        backend
            .try_acquire(&name, &owner, Duration::from_secs(5))
            .is_ok()
    );
    let (code, body) = server
        .request("POST", "/v3/kv/range", r#"{"key":"ZGxtL2xvY2svbGF5b3V0"}"#)
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains(r#""lease":""#),
        "the key has no lease: {body}"
    );
    let watch = backend.watch(&name).expect("a watch");
    // The thread names itself once it runs: wait for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while watch_threads() != before + 1 {
        assert!(Instant::now() < deadline, "no watch thread");
        thread::sleep(Duration::from_millis(5));
    }
    drop(watch);
    let t = Instant::now();
    drop(backend);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "drop took {:?}",
        t.elapsed()
    );
    assert_eq!(
        watch_threads(),
        before,
        "the watch thread outlived its backend"
    );
}

#[test]
fn an_http_server_that_is_not_etcd_is_a_protocol_error_at_first_use() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        for stream in listener.incoming().take(1) {
            let mut s = stream.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
            );
        }
    });
    // The server answers one connection: the clean-up release of the failed attempt (a
    // reply dlm could not read may come after a grant) finds nobody, and is sent again in
    // the background; the client's drop does not wait for it.
    let client = LockClient::builder(common::backend(&[format!("http://127.0.0.1:{port}")]))
        .retry(dlm_core::RetryPolicy::new().release_wait(Duration::ZERO))
        .build()
        .unwrap();
    let t = Instant::now();
    let e = client.get_lock("x").unwrap().try_lock().unwrap_err();
    assert!(t.elapsed() < common::CALM * 2, "took {:?}", t.elapsed());
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Protocol), "{e}");
    assert!(
        e.to_string().contains("is not an etcd v3 JSON gateway"),
        "{e}"
    );
    server.join().unwrap();
}

#[test]
fn nothing_listening_is_unavailable_within_the_connect_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let backend = common::backend(&[format!("http://127.0.0.1:{port}")]);
    let t = Instant::now();
    let e = backend
        .try_acquire(
            &LockName::new("x").unwrap(),
            &OwnerToken::random_for_tests(1),
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(t.elapsed() < common::CALM, "took {:?}", t.elapsed());
    assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
}

#[test]
fn a_redis_port_is_a_protocol_error_naming_the_problem_at_first_use() {
    let redis = dlm_testkit::redis_server::RedisServer::spawn();
    let backend = common::backend(&[format!("http://127.0.0.1:{}", redis.port())]);
    let t = Instant::now();
    let e = backend
        .try_acquire(
            &LockName::new("x").unwrap(),
            &OwnerToken::random_for_tests(1),
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(t.elapsed() < common::CALM, "took {:?}", t.elapsed());
    assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}");
    assert!(!e.is_transient());
    assert!(
        e.message().contains("is not an etcd v3 JSON gateway"),
        "{e}"
    );
    assert!(e.message().contains("a Redis server"), "{e}");
}

#[test]
fn a_member_of_another_cluster_among_the_urls_is_refused_at_first_use() {
    let (one, other) = (EtcdServer::spawn(), EtcdServer::spawn());
    let client = LockClient::new(common::backend(&[one.url(), other.url()]));
    let t = Instant::now();
    let e = client.get_lock("x").unwrap().try_lock().unwrap_err();
    assert!(t.elapsed() < common::CALM, "took {:?}", t.elapsed());
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Protocol), "{e}");
    assert!(!e.is_transient());
    assert!(
        e.to_string().contains("belongs to another etcd cluster"),
        "{e}"
    );
    // Nothing was written on either.
    for server in [&one, &other] {
        let (_, body) = server
            .request(
                "POST",
                "/v3/kv/range",
                r#"{"key":"AA==","range_end":"AA=="}"#,
            )
            .unwrap();
        assert!(!body.contains("\"kvs\""), "a key was written: {body}");
    }
}

/// A request on a connection already open (pooled) to a member that has since stopped
/// (SIGSTOP: the connection stays open, nothing answers) ends within the connect and I/O
/// timeouts, as one on a new connection does. ureq sets its read timeout on new
/// connections only: before, this request waited with no bound.
#[test]
fn a_request_on_a_reused_connection_to_a_stopped_member_ends_within_the_timeouts() {
    let server = EtcdServer::spawn();
    let timeout = Duration::from_millis(500);
    let backend = EtcdBackend::builder(&[server.url()])
        .connect_timeout(timeout)
        .io_timeout(timeout)
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.get_lock("reused").unwrap();
    // Leaves its connections in the pool.
    lock.try_lock().unwrap().unwrap().unlock().unwrap();
    server.pause();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        let got = lock.try_lock();
        let _ = tx.send((t.elapsed(), got.map(|g| g.is_some())));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(20));
    server.resume();
    let (took, got) = outcome.expect("try_lock on a stopped member did not return in 20 s");
    let e = got.expect_err("a stopped member granted a lock");
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Timeout), "{e}");
    // Two requests, each within connect + I/O timeout: the attempt, and the clean-up of
    // the key it may have left (the front releases a failed attempt's key at once).
    assert!(
        took < timeout * 4 + Duration::from_millis(500),
        "try_lock took {took:?} with {timeout:?} connect and I/O timeouts"
    );
}

/// A waiter that arrived just before the release (0 to 90 ms) is handed the lock within
/// milliseconds. Its watch starts at the revision after its failed attempt, so etcd has
/// nothing to catch up: a watch that starts in the past is caught up only every 100 ms
/// (etcd's own lock recipe then hands over in about 45 ms). Each hand-over has a waiter
/// of a new backend (a new watch). The bar of issue #22 is a p50 under 5 ms; the test
/// asserts it against the same run's uncontended lock+unlock cycle (at most four cycles),
/// so that a loaded machine, where every etcd write slows down, does not fail it while a
/// 100 ms catch-up still would.
#[test]
fn a_waiter_that_arrived_just_before_the_release_is_handed_the_lock_at_once() {
    use std::sync::Arc;
    use std::sync::mpsc;

    use dlm_testkit::{CountingBackend, unique_name};

    let server = EtcdServer::spawn();
    let urls = [server.url()];
    let holder = LockClient::new(common::backend(&urls));
    let p50 = |mut d: Vec<Duration>| {
        d.sort();
        d[d.len() / 2]
    };
    let cycle = p50((0..20)
        .map(|_| {
            let lock = holder.get_lock(&unique_name("cycle")).unwrap();
            let t = Instant::now();
            lock.try_lock().unwrap().unwrap().unlock().unwrap();
            t.elapsed()
        })
        .collect());
    let mut gaps = Vec::new();
    for i in 0..20 {
        let name = unique_name("handover");
        let held = holder.get_lock(&name).unwrap().lock().unwrap();
        let counting = Arc::new(CountingBackend::new(Arc::new(common::backend(&urls))));
        let lock = LockClient::new(counting.clone()).get_lock(&name).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let guard = lock
                .try_lock_timeout(Duration::from_secs(20))
                .unwrap()
                .expect("the waiter never got the lock");
            tx.send(Instant::now()).unwrap();
            guard.unlock().unwrap();
        });
        // Its first attempt failed and its second (made once subscribed) has started.
        let deadline = Instant::now() + Duration::from_secs(10);
        while counting.calls() < 2 {
            assert!(
                Instant::now() < deadline,
                "the waiter made no second attempt"
            );
            thread::yield_now();
        }
        // How long before the release the waiter arrived: the variable under test.
        thread::sleep(Duration::from_millis(10 * (i % 10)));
        held.unlock().unwrap();
        let released = Instant::now();
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("no hand-over");
        gaps.push(got.saturating_duration_since(released));
        waiter.join().unwrap();
    }
    let all = gaps.clone();
    let gap = p50(gaps);
    println!(
        "hand-over to a waiter that arrived 0-90 ms before the release: p50 {gap:?} (an uncontended lock+unlock cycle: p50 {cycle:?})"
    );
    assert!(
        gap < (cycle * 4).max(Duration::from_millis(5)),
        "hand-over p50 {gap:?} against a cycle of {cycle:?}: {all:?}"
    );
}
