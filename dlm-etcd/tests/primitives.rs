//! Semaphores and read-write locks on etcd beyond the conformance suite: a crashed
//! holder's permit comes back with its etcd lease, keys of another shape under a resource
//! are refused and never touched, and a name's mutex, semaphore and read-write lock are
//! separate resources.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use dlm_core::backend::{Claim, LockBackend, LockName, channel};
use dlm_core::{BackendErrorKind, Lock, LockClient, RetryPolicy};
use dlm_testkit::etcd::EtcdServer;
use dlm_testkit::unique_name;
use serde_json::Value;

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// `POST path body` to the member, its JSON reply.
fn call(server: &EtcdServer, path: &str, body: &str) -> Value {
    let (status, text) = server.request("POST", path, body).unwrap();
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The keys under the semaphore `name`'s resource (`dlm/lock/{name} 0 sem 0`).
fn semaphore_keys(server: &EtcdServer, name: &str) -> Vec<Value> {
    resource_keys(server, name, "sem")
}

/// The keys under `name`'s resource of `kind` (`sem` or `rw`): `dlm/lock/{name} 0 kind 0`.
fn resource_keys(server: &EtcdServer, name: &str, kind: &str) -> Vec<Value> {
    let prefix = format!("dlm/lock/{name}\0{kind}\0");
    let end = format!("dlm/lock/{name}\0{kind}\u{1}");
    let reply = call(
        server,
        "/v3/kv/range",
        &format!(
            r#"{{"key":"{}","range_end":"{}"}}"#,
            b64(prefix.as_bytes()),
            b64(end.as_bytes())
        ),
    );
    reply["kvs"].as_array().cloned().unwrap_or_default()
}

/// A client whose waits poll only every 10 s: a prompt acquisition shows a wake-up.
fn slow_poller(server: &EtcdServer) -> LockClient {
    LockClient::builder(common::backend(&[server.url()]))
        .retry(
            RetryPolicy::new()
                .backoff(Duration::from_secs(10), Duration::from_secs(10))
                .unwrap(),
        )
        .build()
        .unwrap()
}

/// A holder that crashed (its etcd lease revoked, as it ends when nobody keeps it alive)
/// gives its permit back at once: the deletion wakes the waiter of another process, which
/// gets a larger fencing token.
#[test]
fn a_crashed_holders_permit_comes_back_with_its_etcd_lease() {
    let server = EtcdServer::spawn();
    let name = unique_name("sem-crash");
    let holder = LockClient::new(common::backend(&[server.url()]));
    let held = holder.get_semaphore(&name, 1).unwrap().acquire().unwrap();
    let held_token = held.fencing_token().unwrap();
    let keys = semaphore_keys(&server, &name);
    assert_eq!(keys.len(), 1, "one key per permit holder");
    let lease = keys[0]["lease"].as_str().unwrap().to_owned();

    let waiter = slow_poller(&server).get_semaphore(&name, 1).unwrap();
    let (tx, rx) = channel::bounded(1);
    let t = thread::spawn(move || {
        let got = waiter.try_acquire_timeout(Duration::from_secs(20)).unwrap();
        tx.send(Instant::now()).unwrap();
        got.map(|g| g.fencing_token().unwrap())
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the waiter got a permit that was held"
    );
    let crashed = Instant::now();
    call(
        &server,
        "/v3/lease/revoke",
        &format!(r#"{{"ID":"{lease}"}}"#),
    );
    let got_at = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let token = t.join().unwrap().expect("the permit never came back");
    // The waiter polls every 10 s: only the deletion's wake-up is this quick.
    assert!(
        got_at - crashed < Duration::from_secs(2),
        "the permit came back after {:?}",
        got_at - crashed
    );
    assert!(token > held_token, "token {token:?} after {held_token:?}");
    // The crashed holder's late release deletes nothing of another's.
    drop(held);
}

/// A key under a semaphore's resource that dlm did not write (no lease, another value) is
/// `UnexpectedKey` for an acquisition and a force-release, and is left as it was.
#[test]
fn a_key_of_another_shape_under_a_resource_is_refused_and_not_touched() {
    let server = EtcdServer::spawn();
    let name = unique_name("sem-foreign");
    let key = format!("dlm/lock/{name}\0sem\0not-a-holder");
    call(
        &server,
        "/v3/kv/put",
        &format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64(key.as_bytes()),
            b64(b"someone else's")
        ),
    );
    let before = semaphore_keys(&server, &name);
    assert_eq!(before.len(), 1);

    let backend = common::backend(&[server.url()]);
    let lock_name = LockName::new(&name).unwrap();
    let claim = Claim::Permit { permits: 2 };
    let sem = LockClient::new(common::backend(&[server.url()]))
        .get_semaphore(&name, 2)
        .unwrap();
    let e = sem
        .try_acquire()
        .expect_err("a foreign key was taken for a holder");
    assert_eq!(
        e.backend().map(|b| b.kind()),
        Some(BackendErrorKind::UnexpectedKey),
        "{e}"
    );
    let e = backend
        .force_release_group(&lock_name, claim)
        .expect_err("a foreign key was force-released");
    assert_eq!(e.kind(), BackendErrorKind::UnexpectedKey, "{e}");
    let e = backend.inspect_group(&lock_name, claim).unwrap_err();
    assert_eq!(e.kind(), BackendErrorKind::UnexpectedKey, "{e}");
    assert_eq!(
        semaphore_keys(&server, &name),
        before,
        "the foreign key changed"
    );
}

/// A name's mutex, semaphore and read-write lock are three resources: all three are held
/// at once, and releasing one leaves the others held.
#[test]
fn a_names_mutex_semaphore_and_read_write_lock_are_separate() {
    let server = EtcdServer::spawn();
    let name = unique_name("three");
    let client = LockClient::new(common::backend(&[server.url()]));
    let other = LockClient::new(common::backend(&[server.url()]));
    let mutex = client.get_lock(&name).unwrap().lock().unwrap();
    let permit = client.get_semaphore(&name, 1).unwrap().acquire().unwrap();
    let write = client.get_rw_lock(&name).unwrap().write().unwrap();
    assert!(other.get_lock(&name).unwrap().try_lock().unwrap().is_none());
    assert!(
        other
            .get_semaphore(&name, 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none()
    );
    assert!(
        other
            .get_rw_lock(&name)
            .unwrap()
            .try_read()
            .unwrap()
            .is_none()
    );
    mutex.unlock().unwrap();
    assert!(other.get_lock(&name).unwrap().try_lock().unwrap().is_some());
    assert!(permit.is_held() && write.is_held());
    assert_eq!(other.get_semaphore(&name, 1).unwrap().holders().unwrap(), 1);
    drop((permit, write));
}

/// The keys under the read-write lock `name`'s resource (`dlm/lock/{name} 0 rw 0`): each
/// key's suffix (`r...`, `w...`, `m`) and its etcd lease.
fn rw_keys(server: &EtcdServer, name: &str) -> Vec<(String, String)> {
    let prefix_len = format!("dlm/lock/{name}\0rw\0").len();
    resource_keys(server, name, "rw")
        .iter()
        .map(|kv| {
            let key = STANDARD.decode(kv["key"].as_str().unwrap()).unwrap();
            let suffix = String::from_utf8_lossy(&key[prefix_len..]).into_owned();
            (suffix, kv["lease"].as_str().unwrap_or("0").to_owned())
        })
        .collect()
}

/// A downgrade whose reply the network loses after etcd applied it (the proxy drops the
/// transaction's response): the read key it wrote is deleted by the client at once, and
/// the write key with it; another client takes the write lock right away. (It used to
/// stay, and a watchdog renewing the client's other holds kept its etcd lease alive: the
/// orphan outlived the lease it was put with.)
#[test]
fn a_downgrade_whose_reply_is_lost_leaves_no_hold() {
    use dlm_testkit::faults::FaultProxy;
    let server = EtcdServer::spawn();
    let proxy = FaultProxy::start_http(server.client_port());
    let via = format!("http://127.0.0.1:{}", proxy.port());
    let backend = std::sync::Arc::new(
        dlm_etcd::EtcdBackend::builder(&[via])
            .io_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    // Another hold of the same client on the same etcd lease class, renewed by the
    // watchdog (3 s) the whole time.
    let client = LockClient::builder(backend)
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let other_hold = client
        .get_lock(&unique_name("kept"))
        .unwrap()
        .lock()
        .unwrap();
    let name = unique_name("lost-downgrade");
    let write = client.get_rw_lock(&name).unwrap().write().unwrap();
    proxy.drop_http_replies("/v3/kv/txn", 1);
    let e = write.downgrade().expect_err("its reply was lost");
    assert!(e.is_transient(), "{e}");
    assert_eq!(
        proxy.http_replies_to_drop(),
        0,
        "no transaction's reply was lost"
    );
    assert_eq!(
        rw_keys(&server, &name),
        vec![],
        "the lost downgrade left a key"
    );
    let other = LockClient::new(common::backend(&[server.url()]));
    other
        .get_rw_lock(&name)
        .unwrap()
        .try_write()
        .unwrap()
        .expect("free at once")
        .unlock()
        .unwrap();
    other_hold.unlock().unwrap();
}

/// A waiting writer's mark goes on an etcd lease of its own, never on one that carries a
/// hold: a hold's renewals keep its lease alive, and a mark on it would outlive the
/// writer that set it, holding new readers back. (Readers of 2 s and a writer of 3 s put
/// their keys on etcd leases of the same length, and the mark used to share the readers'.)
#[test]
fn a_writers_mark_never_shares_an_etcd_lease_with_a_hold() {
    let server = EtcdServer::spawn();
    let backend = std::sync::Arc::new(common::backend(&[server.url()]));
    let readers = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let writer = LockClient::builder(backend)
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let name = unique_name("mark-lease");
    let read = readers.get_rw_lock(&name).unwrap().read().unwrap();
    assert!(
        writer
            .get_rw_lock(&name)
            .unwrap()
            .try_write()
            .unwrap()
            .is_none()
    );
    let keys = rw_keys(&server, &name);
    let lease_of = |prefix: &str| {
        keys.iter()
            .find(|(k, _)| k.starts_with(prefix))
            .map(|(_, lease)| lease.clone())
            .unwrap_or_else(|| panic!("no {prefix:?} key: {keys:?}"))
    };
    let (mark, reader) = (lease_of("m"), lease_of("r"));
    assert_ne!(
        mark, reader,
        "the writer's mark is on the reader's etcd lease"
    );
    read.unlock().unwrap();
}
