//! dlm behind PgBouncer, beyond the conformance suite (`pgbouncer.rs`): under load
//! through fewer server connections than client threads (transaction mode), waiters whose
//! `LISTEN` goes through a transaction pooler (no `listen_url`: they hear nothing), and
//! the session mode. One server is shared by the cases of this binary; each case has a
//! pooler of its own.
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_postgres::PostgresBackend;
use dlm_testkit::Shared;
use dlm_testkit::history::History;
use dlm_testkit::pgbouncer::{PgBouncer, PoolMode};
use dlm_testkit::postgres::PostgresServer;
use parking_lot::Mutex;

static SERVER: Shared<PostgresServer> = Shared::new();

fn server() -> Arc<PostgresServer> {
    SERVER.get(PostgresServer::spawn)
}

/// A backend whose requests go through `bouncer`, listening on `listen` if given (else
/// through the pooler too).
fn backend(bouncer: &PgBouncer, listen: Option<&str>) -> PostgresBackend {
    let mut builder = PostgresBackend::builder(&bouncer.url())
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM);
    if let Some(url) = listen {
        builder = builder.listen_url(url);
    }
    builder.build().unwrap()
}

/// The row of the pool of database `postgres` in `SHOW POOLS`.
fn pool(bouncer: &PgBouncer) -> BTreeMap<String, String> {
    bouncer
        .show("POOLS")
        .into_iter()
        .find(|row| row.get("database").map(String::as_str) == Some("postgres"))
        .expect("no pool of database postgres")
}

/// The sum of the `prefix*` counters of a `SHOW POOLS` row (`sv_`: server connections,
/// `cl_`: clients).
fn count(row: &BTreeMap<String, String>, prefix: &str) -> usize {
    row.iter()
        .filter(|(k, _)| k.starts_with(prefix) && !k.contains("cancel"))
        .map(|(_, v)| v.parse::<usize>().unwrap_or(0))
        .sum()
}

/// `clients` clients of `threads` threads each take one lock `total` times through
/// `bouncer`: no two holds overlap, and the fencing tokens, in the order they were
/// granted, strictly increase. Returns how many connections the clients had open to the
/// pooler at the end (they are still alive then).
fn take_turns(
    bouncer: &PgBouncer,
    listen: Option<&str>,
    clients: usize,
    threads: usize,
    total: usize,
) -> usize {
    let name = dlm_testkit::unique_name("bounced");
    let history = Arc::new(History::new());
    let granted: Arc<Mutex<Vec<u64>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let clients: Vec<Arc<LockClient>> = (0..clients)
        .map(|_| {
            Arc::new(
                LockClient::builder(backend(bouncer, listen))
                    .lease(Duration::from_secs(5))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let mut handles = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..threads {
            let (client, history, granted, count, name) = (
                client.clone(),
                history.clone(),
                granted.clone(),
                count.clone(),
                name.clone(),
            );
            handles.push(thread::spawn(move || {
                let lock = client.get_lock(&name).unwrap();
                while count.load(Ordering::SeqCst) < total {
                    let guard = lock
                        .try_lock_timeout(Duration::from_secs(20))
                        .unwrap()
                        .expect("no turn within 20 s");
                    let token = guard.fencing_token().unwrap().get();
                    let hold = history.begin(format!("client {c} thread {t}"), &guard);
                    // Under the lock: the tokens go in in grant order.
                    granted.lock().push(token);
                    count.fetch_add(1, Ordering::SeqCst);
                    history.end(hold, &guard);
                    guard.unlock().unwrap();
                }
            }));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let tokens = granted.lock().clone();
    assert!(tokens.len() >= total, "{} acquisitions", tokens.len());
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "a token went back: {} then {}", w[0], w[1]);
    }
    let report = history.check();
    assert!(report.holds >= total);
    report.assert_clean();
    let clients_open = count_clients(bouncer);
    drop(clients);
    clients_open
}

/// The client connections of database `postgres` the pooler has now.
fn count_clients(bouncer: &PgBouncer) -> usize {
    count(&pool(bouncer), "cl_")
}

/// Three clients of three threads each through a transaction pooler that keeps at most
/// two server connections: mutual exclusion and token order hold, the clients' (up to
/// nine) connections share the two server connections (nothing of dlm's relies on a
/// session), and every transaction of theirs went through the pooler.
#[test]
fn nine_threads_share_two_server_connections() {
    let server = server();
    let bouncer = PgBouncer::spawn_with(
        &server,
        PoolMode::Transaction,
        &[("default_pool_size", "2"), ("max_db_connections", "2")],
    );
    let started = Instant::now();
    let clients_open = take_turns(&bouncer, Some(&server.url()), 3, 3, 300);
    let took = started.elapsed();
    let servers = bouncer.show("SERVERS");
    let xacts: usize = bouncer
        .show("STATS")
        .iter()
        .find(|row| row.get("database").map(String::as_str) == Some("postgres"))
        .and_then(|row| row.get("total_xact_count")?.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "300 turns in {took:?}: {clients_open} client connections, {} server connections, \
         {xacts} transactions through the pooler",
        servers.len()
    );
    assert!(
        servers.len() <= 2,
        "{} server connections: {servers:?}",
        servers.len()
    );
    assert!(
        clients_open > 2,
        "only {clients_open} client connections: the server connections were not shared"
    );
    assert!(xacts >= 300, "{xacts} transactions went through the pooler");
}

/// Without `listen_url`, the listening connection's `LISTEN` goes through the
/// transaction pooler, which runs it on some server connection and gives that back to
/// the pool (still listening: a notification then goes to whichever client has that
/// connection, or is dropped with "got packet 'A' from server when not linked" in the
/// pooler's log): the release hints do not reach the waiters. Nothing breaks and nothing
/// hangs: a waiter, which looks again when the holder's lease would end, gets the lock
/// within the holder's lease (here a watchdog timeout of 1.5 s; 30 s by default) after
/// the release, not at once. Set `listen_url` to the server's own address behind such a
/// pooler.
#[test]
fn without_listen_url_a_waiter_gets_the_lock_within_the_holders_lease() {
    let server = server();
    let bouncer = PgBouncer::spawn(&server, PoolMode::Transaction);
    let lease = Duration::from_millis(1500);
    let name = dlm_testkit::unique_name("unheard");
    let holder = LockClient::builder(backend(&bouncer, None))
        .watchdog_timeout(lease)
        .build()
        .unwrap();
    let guard = holder.get_lock(&name).unwrap().lock().unwrap();
    let waiter = LockClient::builder(backend(&bouncer, None))
        .watchdog_timeout(lease)
        .build()
        .unwrap();
    let lock = waiter.get_lock(&name).unwrap();
    let (tx, rx) = mpsc::sync_channel(1);
    let t = thread::spawn(move || {
        let got = lock.try_lock_timeout(Duration::from_secs(20)).unwrap();
        tx.send(Instant::now()).unwrap();
        got.expect("the waiter timed out").unlock().unwrap();
    });
    // Held across renewals (every third of the lease).
    thread::sleep(Duration::from_millis(2000));
    assert!(rx.try_recv().is_err(), "the waiter got a held lock");
    assert!(guard.is_held());
    let released = Instant::now();
    guard.unlock().unwrap();
    let acquired = rx
        .recv_timeout(lease + Duration::from_secs(5))
        .expect("the waiter hangs");
    let latency = acquired - released;
    eprintln!("without hints, the waiter got the lock {latency:?} after the release");
    assert!(
        latency <= lease + Duration::from_millis(700),
        "the waiter took {latency:?} after the release, more than the {lease:?} lease"
    );
    t.join().unwrap();
    // Nothing hangs on the way out either (the listening threads stop).
    let dropping = Instant::now();
    drop((holder, waiter));
    assert!(
        dropping.elapsed() < Duration::from_secs(5),
        "dropping the clients took {:?}",
        dropping.elapsed()
    );
}

/// In session mode each client connection keeps its server connection: dlm works
/// unchanged, release hints included without `listen_url` (the `LISTEN` stays on its
/// server connection). Each client's connections then each take one of the pooler's
/// server connections for as long as they stay open, so its pool must be large enough.
#[test]
fn session_mode_works_and_hints_reach_waiters() {
    let server = server();
    let bouncer = PgBouncer::spawn(&server, PoolMode::Session);
    take_turns(&bouncer, None, 2, 2, 100);
    let name = dlm_testkit::unique_name("session");
    let holder = LockClient::builder(backend(&bouncer, None))
        .build()
        .unwrap();
    let guard = holder.get_lock(&name).unwrap().lock().unwrap();
    let waiter = LockClient::builder(backend(&bouncer, None))
        .build()
        .unwrap();
    let lock = waiter.get_lock(&name).unwrap();
    let (tx, rx) = mpsc::sync_channel(1);
    let t = thread::spawn(move || {
        let got = lock.try_lock_timeout(Duration::from_secs(20)).unwrap();
        tx.send(Instant::now()).unwrap();
        got.expect("the waiter timed out").unlock().unwrap();
    });
    thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "the waiter got a held lock");
    let released = Instant::now();
    guard.unlock().unwrap();
    let acquired = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    // Watchdog-renewed (30 s): only a hint wakes the waiter this soon.
    assert!(
        acquired - released < Duration::from_secs(1),
        "the waiter took {:?}: the hint was not heard",
        acquired - released
    );
    t.join().unwrap();
}
