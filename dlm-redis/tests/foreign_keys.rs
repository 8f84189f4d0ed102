//! dlm never changes a key it did not write. A key of another type at the name of a
//! slot's fencing stream (a hash, a string) makes the draw of a fencing token fail with
//! `UnexpectedKey` (an acquisition that draws the token with it takes the lock without
//! one, and the read fails), and is left exactly as it was: its type, its value and its
//! expiry.
//! An earlier version sent `PEXPIRE` with the `SET NX` and the `XADD` (in a `MULTI` on a
//! single server, pipelined on Redlock): the acquisition failed as it should, but the
//! foreign key was left to expire in 24 hours. On every deployment: single, Redlock,
//! Cluster.
mod common;

use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_core::{BackendErrorKind, Lock, LockClient, TokenDraw};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::cluster::{RedisCluster, slot_of};
use dlm_testkit::redis_server::{RedisNodes, RedisServer};
use dlm_testkit::unique_name;

/// What a key is: its serialized value (`DUMP`: type and contents) and its expiry.
#[derive(Debug)]
struct Snapshot {
    dump: Vec<u8>,
    pttl: i64,
}

fn snapshot(con: &mut redis::Connection, key: &str) -> Snapshot {
    Snapshot {
        dump: redis::cmd("DUMP").arg(key).query(con).unwrap(),
        pttl: redis::cmd("PTTL").arg(key).query(con).unwrap(),
    }
}

/// The foreign keys each deployment is tried with: a hash with an expiry, a string
/// without one.
fn write_foreign(con: &mut redis::Connection, key: &str, kind: &str) {
    let _: redis::Value = redis::cmd("DEL").arg(key).query(con).unwrap();
    match kind {
        "a hash with an expiry" => {
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg("owner")
                .arg("someone else")
                .query(con)
                .unwrap();
            let _: () = redis::cmd("PEXPIRE")
                .arg(key)
                .arg(600_000)
                .query(con)
                .unwrap();
        }
        _ => {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("someone else's")
                .query(con)
                .unwrap();
        }
    }
}

const KINDS: [&str; 2] = ["a hash with an expiry", "a string without an expiry"];

fn assert_left_as_it_was(con: &mut redis::Connection, key: &str, before: &Snapshot, what: &str) {
    let after = snapshot(con, key);
    assert_eq!(
        after.dump, before.dump,
        "{what}: the foreign key's value changed"
    );
    if before.pttl < 0 {
        assert_eq!(
            after.pttl, before.pttl,
            "{what}: the foreign key got an expiry"
        );
    } else {
        // Only time passed: the expiry is what it was, less the test's own time.
        assert!(
            after.pttl <= before.pttl && after.pttl > before.pttl - 60_000,
            "{what}: the expiry changed from {} ms to {} ms",
            before.pttl,
            after.pttl
        );
    }
}

/// Two clients over `backend`: the default one, and one that draws every token with the
/// acquisition.
fn clients(backend: impl LockBackend + Clone) -> [LockClient; 2] {
    [
        LockClient::new(backend.clone()),
        LockClient::builder(backend)
            .token_draw(TokenDraw::AtAcquisition)
            .build()
            .unwrap(),
    ]
}

/// Tries an acquisition of `name` and the draw of its token with each kind of foreign key at its fencing
/// stream on every server of `servers` (their admin connections), and checks the error
/// and the keys. Each client of `clients` in turn: one drawing on read, one drawing with
/// the acquisition (whose draw fails without failing the acquisition: the read fails).
fn check(
    clients: &[LockClient],
    name: &str,
    fence: &str,
    lock_key: &str,
    servers: &mut [redis::Connection],
) {
    for (client, kind) in clients.iter().flat_map(|c| KINDS.map(|k| (c, k))) {
        let before: Vec<Snapshot> = servers
            .iter_mut()
            .map(|con| {
                write_foreign(con, fence, kind);
                snapshot(con, fence)
            })
            .collect();
        let guard = client
            .get_lock(name)
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("a free lock");
        // Drawn with the acquisition or not: no token came with it.
        assert_eq!(guard.known_fencing_token(), None, "{kind}");
        let e = guard
            .fencing_token()
            .expect_err("a foreign fencing key must fail the token's draw");
        assert_eq!(
            e.backend_kind(),
            Some(BackendErrorKind::UnexpectedKey),
            "{kind}: {e}"
        );
        assert!(e.to_string().contains("not written by dlm"), "{kind}: {e}");
        guard.unlock().unwrap();
        for (i, con) in servers.iter_mut().enumerate() {
            let what = format!("{kind}, server {i}");
            assert_left_as_it_was(con, fence, &before[i], &what);
            let exists: bool = redis::cmd("EXISTS").arg(lock_key).query(con).unwrap();
            assert!(!exists, "{what}: the lock was not released");
        }
    }
}

#[test]
fn single_server() {
    common::require();
    let server = RedisServer::spawn();
    let backend = RedisBackend::new(&server.url()).unwrap();
    let name = unique_name("foreign");
    let keys = backend.keys(&name).unwrap();
    check(
        &clients(backend),
        &name,
        &keys.fencing_stream,
        &keys.lock,
        &mut [server.connection()],
    );
}

#[test]
fn redlock_every_node() {
    common::require();
    let nodes = RedisNodes::spawn(3);
    let backend = Redlock::builder(&nodes.urls())
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .unwrap();
    let name = unique_name("foreign");
    let keys = backend.keys(&name).unwrap();
    let clients = clients(backend);
    let mut admins: Vec<redis::Connection> = (0..3).map(|i| nodes.get(i).connection()).collect();
    check(
        &clients,
        &name,
        &keys.fencing_stream,
        &keys.lock,
        &mut admins,
    );
}

#[test]
fn cluster_master_of_the_slot() {
    common::require();
    let c = RedisCluster::builder().replicas(0).spawn();
    let backend = RedisBackend::cluster_builder(&c.seed_urls())
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let name = unique_name("foreign");
    let keys = backend.keys(&name).unwrap();
    let master = c.master_of_slot(slot_of(keys.fencing_stream.as_bytes()));
    check(
        &clients(backend),
        &name,
        &keys.fencing_stream,
        &keys.lock,
        &mut [c.node(master).connection()],
    );
}
