//! TLS against real redis-servers with a TLS port (certificates from a test CA made by
//! the test): mutual TLS, the name to verify, the switch that skips verification, and the
//! failures that must be typed, quick and free of secrets.
mod common;

use std::time::{Duration, Instant};

use dlm_core::{BackendErrorKind, Error, Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock, TlsOptions};
use dlm_testkit::logs;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::tls::{ServerCert, TestPki};

const PASSWORD: &str = "tls-test-Pa55word";
/// What a refused connection may take at most: one connect timeout (1 s here) and
/// change, never the front's 10 s of retries.
const QUICK: Duration = Duration::from_secs(3);

fn server(pki: &TestPki, cert: ServerCert) -> RedisServer {
    common::require();
    RedisServer::builder()
        .password(PASSWORD)
        .tls(pki, cert)
        .spawn()
}

fn single(url: &str, tls: Option<TlsOptions>) -> dlm_core::Result<LockClient> {
    let mut builder = RedisBackend::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .io_timeout(Duration::from_secs(1));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    Ok(LockClient::new(builder.build()?))
}

/// `lock()` on a client that cannot connect: the error, checked to be a quick backend
/// error of `kind` whose message holds no password.
#[track_caller]
fn refused(client: &LockClient, kind: BackendErrorKind, what: &str) -> String {
    let lock = client.get_lock("tls-refused").unwrap();
    let started = Instant::now();
    let err = lock.lock().expect_err(what);
    let took = started.elapsed();
    let Error::Backend(e) = &err else {
        panic!("{what}: expected a backend error, got {err:?}");
    };
    assert_eq!(e.kind(), kind, "{what}: {e}");
    assert!(took < QUICK, "{what}: took {took:?} (retried?): {e}");
    let text = format!("{err} {err:?}");
    assert!(
        !text.contains(PASSWORD),
        "{what}: the password leaked: {text}"
    );
    text
}

#[test]
fn a_verified_server_takes_locks_and_wakes_waiters_over_tls() {
    let pki = TestPki::new();
    let server = server(&pki, ServerCert::Valid);
    let tls = || Some(TlsOptions::new().ca_file(pki.ca_file()));
    let a = single(&server.tls_url(), tls()).unwrap();
    let b = single(&server.tls_url(), tls()).unwrap();
    let held = a.get_lock("tls-wake").unwrap().lock().unwrap();
    assert!(held.fencing_token().is_ok());
    // A waiter is woken by the release message, which reaches it through the listener's
    // own TLS connection: it gets the lock long before the holder's 30 s lease ends.
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let guard = b
            .get_lock("tls-wake")
            .unwrap()
            .try_lock_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("woken and acquired");
        (started.elapsed(), guard.fencing_token().ok())
    });
    common::wait_until(Duration::from_secs(5), "the listener subscribed", || {
        redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query::<u64>(&mut server.connection())
            .unwrap()
            == 1
    });
    let first = held.fencing_token().ok();
    held.unlock().unwrap();
    let (waited, second) = waiter.join().unwrap();
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(second > first);
    // Every client connection is on the TLS port (none on the plain one but ours).
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    let local = |l: &&str| l.contains(&format!("laddr=127.0.0.1:{} ", server.tls_port()));
    assert!(clients.lines().filter(local).count() >= 2, "{clients}");
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    common::require();
    let pki = TestPki::new();
    let server = RedisServer::builder()
        .password(PASSWORD)
        .tls(&pki, ServerCert::Valid)
        .tls_auth_clients(true)
        .spawn();
    let without = single(
        &server.tls_url(),
        Some(TlsOptions::new().ca_file(pki.ca_file())),
    )
    .unwrap();
    let text = refused(&without, BackendErrorKind::Tls, "no client certificate");
    assert!(text.contains("TLS"), "{text}");

    let (cert, key) = pki.client_cert();
    let with = single(
        &server.tls_url(),
        Some(
            TlsOptions::new()
                .ca_file(pki.ca_file())
                .client_cert(cert, key),
        ),
    )
    .unwrap();
    let guard = with.get_lock("mtls").unwrap().try_lock().unwrap();
    assert!(guard.is_some(), "the client certificate is accepted");
}

#[test]
fn redlock_over_mutual_tls_and_a_node_without_tls_refused() {
    let cluster = common::MutualTlsCluster::new(3);
    let backend = Redlock::builder(&cluster.tls_urls())
        .tls(cluster.tls_options())
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let guard = client.get_lock("redlock-mtls").unwrap().lock().unwrap();
    assert!(guard.fencing_token().is_ok());
    drop(guard);

    // The same nodes without the client certificate: every node refuses, and the error
    // says TLS (not "no quorum" for a reason nobody can see).
    let backend = Redlock::builder(&cluster.tls_urls())
        .tls(TlsOptions::new().ca_file(cluster.pki.ca_file()))
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let err = client
        .get_lock("redlock-mtls")
        .unwrap()
        .try_lock()
        .expect_err("no client certificate");
    assert!(format!("{err}").contains("TLS"), "{err}");
}

#[test]
fn certificate_problems_are_quick_typed_errors() {
    let pki = TestPki::new();
    let trust_ca = || Some(TlsOptions::new().ca_file(pki.ca_file()));

    let wrong_name = server(&pki, ServerCert::WrongName);
    let text = refused(
        &single(&wrong_name.tls_url(), trust_ca()).unwrap(),
        BackendErrorKind::Tls,
        "a certificate for another name",
    );
    assert!(text.contains("name"), "{text}");

    let expired = server(&pki, ServerCert::Expired);
    let text = refused(
        &single(&expired.tls_url(), trust_ca()).unwrap(),
        BackendErrorKind::Tls,
        "an expired certificate",
    );
    assert!(text.contains("expired"), "{text}");

    let valid = server(&pki, ServerCert::Valid);
    let text = refused(
        &single(
            &valid.tls_url(),
            Some(TlsOptions::new().ca_file(pki.other_ca_file())),
        )
        .unwrap(),
        BackendErrorKind::Tls,
        "an unknown CA",
    );
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[test]
fn plain_and_tls_mixed_up_are_quick_typed_errors() {
    let pki = TestPki::new();
    let server = server(&pki, ServerCert::Valid);
    let plain_url_on_tls_port = server.tls_url().replacen("rediss://", "redis://", 1);
    let text = refused_at_once(
        &single(&plain_url_on_tls_port, None).unwrap(),
        "a plain-TCP client on the TLS port",
    );
    assert!(
        text.contains("use a rediss:// URL"),
        "says what to do: {text}"
    );

    // A plain port never answers a ClientHello (Redis waits for the end of a line), so
    // this once came as Unavailable after the whole connect timeout, and as Tls only at
    // a second attempt.
    let tls_url_on_plain_port = server.url().replacen("redis://", "rediss://", 1);
    let text = refused_at_once(
        &single(
            &tls_url_on_plain_port,
            Some(TlsOptions::new().ca_file(pki.ca_file())),
        )
        .unwrap(),
        "a TLS client on the plain port",
    );
    assert!(
        text.contains("use a redis:// URL"),
        "says what to do: {text}"
    );
}

/// A plain port may also answer a ClientHello with an error and close before reading all
/// of it (a Redis port does when the hello's random bytes hold a newline): the client
/// then sees the connection reset. That is the same mix-up, a quick `Tls` error. The
/// listener plays such a port: it resets a TLS handshake after one byte and answers
/// plain RESP.
#[test]
fn a_plain_port_that_resets_the_tls_handshake_is_a_tls_mix_up() {
    use std::io::{Read, Write};
    let pki = TestPki::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut resets = 0;
            for conn in listener.incoming() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let mut conn = conn.unwrap();
                let mut first = [0u8; 1];
                if conn.read_exact(&mut first).is_err() {
                    continue;
                }
                if first[0] == 0x16 {
                    // The rest of the ClientHello is unread: closing now resets.
                    resets += 1;
                    continue;
                }
                let _ = conn.write_all(b"+PONG\r\n");
            }
            resets
        })
    };
    let text = refused_at_once(
        &single(
            &format!("rediss://127.0.0.1:{port}"),
            Some(TlsOptions::new().ca_file(pki.ca_file())),
        )
        .unwrap(),
        "a TLS client on a plain port that resets",
    );
    assert!(
        text.contains("use a redis:// URL"),
        "says what to do: {text}"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(server.join().unwrap() >= 1, "no handshake was reset");
}

/// The first `try_lock` of a client whose URL has the wrong scheme for the port: a `Tls`
/// error, within the connect timeout (1 s) and 100 ms. Returns its text.
#[track_caller]
fn refused_at_once(client: &LockClient, what: &str) -> String {
    let lock = client.get_lock("tls-mixed-up").unwrap();
    let started = Instant::now();
    let err = lock.try_lock().expect_err(what);
    let took = started.elapsed();
    assert_eq!(
        err.backend_kind(),
        Some(BackendErrorKind::Tls),
        "{what}: {err}"
    );
    assert!(
        took < Duration::from_millis(1100),
        "{what}: took {took:?}: {err}"
    );
    let text = err.to_string();
    assert_eq!(text.matches("TLS failure").count(), 1, "{what}: {text}");
    text
}

#[test]
fn another_name_to_verify_and_the_loud_switch_that_skips_verification() {
    let pki = TestPki::new();
    let server = server(&pki, ServerCert::WrongName);
    // The certificate names wrong.example; the client reaches the server by IP address.
    let named = single(
        &server.tls_url(),
        Some(
            TlsOptions::new()
                .ca_file(pki.ca_file())
                .server_name("wrong.example"),
        ),
    )
    .unwrap();
    assert!(
        named
            .get_lock("named")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some()
    );

    let mark = logs::capture();
    let unchecked = single(
        &server.tls_url(),
        Some(
            TlsOptions::new()
                .ca_file(pki.other_ca_file())
                .dangerously_skip_verification(),
        ),
    )
    .unwrap();
    assert!(
        unchecked
            .get_lock("unchecked")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some()
    );
    assert!(
        mark.lines()
            .iter()
            .any(|l| l.contains("WARN") && l.contains("verification is OFF")),
        "the switch is logged at warn: {:?}",
        mark.lines()
    );
}

#[test]
fn tls_settings_that_cannot_work_are_refused_before_any_io() {
    let pki = TestPki::new();
    let invalid = |r: dlm_core::Result<LockClient>, what: &str| -> String {
        match r {
            Err(Error::InvalidArgument(e)) => {
                let text = e.to_string();
                assert!(!text.contains(PASSWORD), "{what}: {text}");
                text
            }
            Err(e) => panic!("{what}: expected InvalidArgument, got {e:?}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    };
    // No server anywhere: none of these may try to connect.
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:1/");
    let text = invalid(
        single(
            &format!("redis://:{PASSWORD}@127.0.0.1:1/"),
            Some(TlsOptions::new()),
        ),
        "TLS options with a plain URL",
    );
    assert!(text.contains("rediss://"), "{text}");
    let text = invalid(
        single(&format!("{url}#insecure"), None),
        "#insecure in the URL",
    );
    assert!(text.contains("dangerously_skip_verification"), "{text}");
    let text = invalid(
        single(&url, Some(TlsOptions::new().ca_file("/nonexistent/ca.pem"))),
        "a missing CA file",
    );
    assert!(text.contains("/nonexistent/ca.pem"), "{text}");
    let (cert, _) = pki.client_cert();
    let text = invalid(
        single(
            &url,
            Some(
                TlsOptions::new()
                    .ca_file(pki.ca_file())
                    .client_cert(&cert, &cert),
            ),
        ),
        "a certificate given as the key",
    );
    assert!(text.contains("private key"), "{text}");
    let text = invalid(
        single(
            &url,
            Some(
                TlsOptions::new()
                    .ca_file(pki.ca_file())
                    .server_name("not a name!"),
            ),
        ),
        "a server name that is not one",
    );
    assert!(text.contains("not a DNS name"), "{text}");
}

#[test]
fn refused_urls_say_why_in_plain_words() {
    let cases = [
        ("localhost:6379", "no scheme"),
        ("http://localhost:6379/", "unknown scheme \"http\""),
        ("redis://localhost:99999/", "invalid port number"),
        ("redis:///0", "host"),
        ("redis://localhost:6379/db1", "database number"),
        ("redis://0.0.0.0:6379/", "wildcard"),
        ("rediss://localhost/#other", "fragment"),
    ];
    for (url, says) in cases {
        let url_with_password = url.replacen("://", &format!("://:{PASSWORD}@"), 1);
        for url in [url.to_owned(), url_with_password] {
            match RedisBackend::builder(&url).build() {
                Err(Error::InvalidArgument(e)) => {
                    let text = e.to_string();
                    assert!(text.contains(says), "{url}: {text:?} should say {says:?}");
                    assert!(!text.contains(PASSWORD), "{url}: {text}");
                }
                other => panic!("{url}: expected InvalidArgument, got {other:?}"),
            }
        }
    }
}

#[test]
fn fenced_writes_through_the_backend_need_no_connection_of_their_own() {
    // The resource-side check on the lock's own server, over the backend's TLS
    // connections (the user adds no redis dependency and opens no connection).
    let pki = TestPki::new();
    let server = server(&pki, ServerCert::Valid);
    let url = format!("rediss://:{PASSWORD}@localhost:{}/", server.tls_port());
    let backend = std::sync::Arc::new(
        RedisBackend::builder(&url)
            .tls(TlsOptions::new().ca_file(pki.ca_file()))
            .build()
            .unwrap(),
    );
    let lease = Duration::from_millis(300);
    let first = LockClient::builder(backend.clone())
        .lease(lease)
        .build()
        .unwrap();
    let second = LockClient::new(backend.clone());
    let key = dlm_testkit::unique_name("report");
    let old = first.get_lock(&key).unwrap().lock().unwrap();
    let old_token = old.fencing_token().unwrap();
    backend.fenced_set(&key, old_token, b"first").unwrap();
    // The first holder stalls past its lease; the second takes over and writes.
    let new = second
        .get_lock(&key)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("the lease ends");
    let new_token = new.fencing_token().unwrap();
    assert!(new_token > old_token);
    backend.fenced_set(&key, new_token, b"second").unwrap();
    match backend.fenced_set(&key, old_token, b"first, late") {
        Err(dlm_redis::FencedWriteError::Stale(e)) => {
            assert_eq!((e.presented, e.highest), (old_token, new_token));
        }
        other => panic!("the stale write was not refused: {other:?}"),
    }
    assert_eq!(
        backend.fenced_get(&key).unwrap(),
        Some((b"second".to_vec(), new_token))
    );
    drop(old);
}

/// The number of connections the server behind `probe` has accepted so far.
fn connections_received(probe: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("stats").query(probe).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

/// Redlock reads each round's oldest request with a short read timeout, then looks at the
/// others. Over TLS that timeout can come in the middle of a record: the connection must
/// stay usable (rustls keeps what it read). With the first node stopped, a round is
/// quick; once the node runs again, its one connection (whose reads timed out, then were
/// finished by the drainer) serves the next rounds: the server accepts no new one.
#[test]
fn redlock_over_tls_keeps_a_connection_whose_read_timed_out() {
    let cluster = common::MutualTlsCluster::new(3);
    let io = Duration::from_millis(800);
    let backend = Redlock::builder(&cluster.tls_urls())
        .tls(cluster.tls_options())
        .connect_timeout(Duration::from_secs(1))
        .io_timeout(io)
        .pool_size(1)
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let cycle = |what: &str| {
        let lock = client.get_lock("redlock-tls-slice").unwrap();
        let started = Instant::now();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .unwrap_or_else(|| panic!("{what}: not acquired"));
        guard.unlock().unwrap_or_else(|e| panic!("{what}: {e}"));
        started.elapsed()
    };
    cycle("warm-up");
    let first = cluster.nodes.get(0);
    // One connection of the test's own (plain port), made before counting.
    let mut probe = first.connection();
    let before = connections_received(&mut probe);

    first.pause();
    let took = cycle("first node stopped");
    assert!(
        took < io / 2,
        "a round with its first node stopped took {took:?} (I/O timeout {io:?})"
    );
    first.resume();

    // The node takes part again, on the same connection.
    common::wait_until(
        Duration::from_secs(5),
        "the first node in use again",
        || {
            let guard = client
                .get_lock("redlock-tls-slice")
                .unwrap()
                .try_lock()
                .unwrap()
                .expect("free");
            let held: bool = redis::cmd("EXISTS")
                .arg("dlm:{redlock-tls-slice}")
                .query(&mut probe)
                .unwrap();
            guard.unlock().unwrap();
            held
        },
    );
    assert_eq!(
        connections_received(&mut probe) - before,
        0,
        "the backend opened a new connection to the first node"
    );
}
