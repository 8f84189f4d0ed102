//! User/password authentication on a real etcd with auth enabled: the token is asked
//! for at first use and sent on every request and on the watch stream; wrong
//! credentials are an `Auth` error, missing rights a `Permission` error, and a token
//! that etcd invalidates is replaced without the caller seeing it.

mod common;

use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, LockBackend, LockName, OwnerToken};
use dlm_core::{BackendErrorKind, Lock, LockClient};
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::EtcdServer;

const ROOT: &str = "root-secret";
const PASSWORD: &str = "alice-secret";

/// One member with auth on: `alice` may use `dlm/`, `bob` has no rights.
fn server() -> EtcdServer {
    let server = EtcdServer::spawn();
    server.add_user("alice", PASSWORD, Some("dlm/"));
    server.add_user("bob", "bob-secret", None);
    server.enable_auth(ROOT);
    server
}

fn client(builder: dlm_etcd::EtcdBackendBuilder) -> LockClient {
    LockClient::new(
        builder
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    )
}

#[test]
fn locks_work_with_the_right_credentials_from_the_builder_or_the_url() {
    let server = server();
    let port = server.client_port();
    let a = client(
        EtcdBackend::builder(&[server.url()])
            .user("alice")
            .password(PASSWORD),
    );
    let b = client(EtcdBackend::builder(&[format!(
        "http://alice:{PASSWORD}@127.0.0.1:{port}"
    )]));
    let held = a
        .get_lock("job")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    assert!(held.fencing_token().unwrap().get() > 0);
    assert!(b.get_lock("job").unwrap().try_lock().unwrap().is_none());
    // A waiter's watch stream carries the token: the release reaches it. (The watch
    // starts just after the waiter's failed attempt, so it cannot miss the release.)
    let waiter = EtcdBackend::new(&[format!("http://alice:{PASSWORD}@127.0.0.1:{port}")]).unwrap();
    let name = LockName::new("job").unwrap();
    let me = OwnerToken::random_for_tests(7);
    assert!(matches!(
        waiter
            .try_acquire(&name, &me, Duration::from_secs(5))
            .unwrap(),
        Acquire::Held { .. }
    ));
    let watch = waiter.watch(&name).expect("a watch");
    held.unlock().unwrap();
    watch
        .receiver()
        .recv_timeout(Duration::from_secs(10))
        .expect("the release never reached the waiter's watch");
    // The key is where alice's role allows, with a lease: read it as alice.
    let token = server.authenticate("alice", PASSWORD);
    let (code, body) = server
        .request_as(
            &token,
            "POST",
            "/v3/kv/range",
            r#"{"key":"ZGxtL2xvY2svam9i"}"#,
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

#[test]
fn wrong_or_missing_credentials_are_an_auth_error_at_first_use_that_never_shows_the_password() {
    let server = server();
    for builder in [
        EtcdBackend::builder(&[server.url()])
            .user("alice")
            .password("not-the-password"),
        EtcdBackend::builder(&[server.url()])
            .user("nobody")
            .password("not-the-password"),
    ] {
        let c = client(builder);
        let t = Instant::now();
        let e = c.get_lock("x").unwrap().try_lock().unwrap_err();
        assert!(t.elapsed() < common::CALM, "took {:?}", t.elapsed());
        assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth), "{e}");
        assert!(!e.is_transient(), "{e}");
        assert!(e.to_string().contains("authenticating as user"), "{e}");
        assert!(!e.to_string().contains("not-the-password"), "{e}");
        assert!(!format!("{e:?}").contains("not-the-password"), "{e:?}");
    }
    // Without credentials: etcd wants some, and the error says so.
    let c = client(EtcdBackend::builder(&[server.url()]));
    let e = c.get_lock("x").unwrap().try_lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth), "{e}");
    assert!(e.to_string().contains("give a user and a password"), "{e}");
}

#[test]
fn a_user_without_rights_on_the_prefix_gets_permission() {
    let server = server();
    let c = client(
        EtcdBackend::builder(&[server.url()])
            .user("bob")
            .password("bob-secret"),
    );
    let e = c.get_lock("x").unwrap().try_lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Permission), "{e}");
    assert!(!e.is_transient(), "{e}");
}

#[test]
fn a_token_etcd_invalidates_is_replaced_transparently() {
    let server = server();
    let c = client(
        EtcdBackend::builder(&[server.url()])
            .user("alice")
            .password(PASSWORD),
    );
    let first = c
        .get_lock("one")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    // Setting the same password again makes etcd drop every token alice has.
    server.change_password(ROOT, "alice", PASSWORD);
    let second = c
        .get_lock("two")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    first.unlock().unwrap();
    second.unlock().unwrap();
    // A fresh token works, the old one does not: the backend must have replaced it.
    server.change_password(ROOT, "alice", PASSWORD);
    let again = c
        .get_lock("one")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    again.unlock().unwrap();
}
