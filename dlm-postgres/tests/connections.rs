//! Connections are bounded and not leaked: threads waiting for a lock hold none while they
//! wait (a backend opens at most `pool_size` plus its listening connection, however many
//! threads wait), and a dropped backend closes every connection and ends its thread.
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_postgres::PostgresBackend;
use dlm_testkit::postgres::PostgresServer;

/// The connections open with `application_name` `name`, as the server counts them.
fn connections(server: &PostgresServer, name: &str) -> usize {
    server
        .psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'"
        ))
        .parse()
        .unwrap()
}

fn backend(server: &PostgresServer, application: &str, pool: usize) -> PostgresBackend {
    PostgresBackend::builder(&format!("{}?application_name={application}", server.url()))
        .pool_size(pool)
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .unwrap()
}

#[test]
fn waiting_threads_hold_no_connection_and_a_dropped_backend_closes_them_all() {
    const WAITERS: usize = 32;
    const POOL: usize = 4;
    let server = PostgresServer::spawn();
    let holder = LockClient::new(backend(&server, "holder", 1));
    let guard = holder.get_lock("busy").unwrap().lock().unwrap();
    let waiters = Arc::new(LockClient::new(backend(&server, "waiters", POOL)));
    let got = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (waiters, got) = (waiters.clone(), got.clone());
            thread::spawn(move || {
                let g = waiters
                    .get_lock("busy")
                    .unwrap()
                    .try_lock_timeout(Duration::from_secs(60))
                    .unwrap()
                    .expect("every waiter gets the lock in turn");
                got.fetch_add(1, Ordering::SeqCst);
                g.unlock().unwrap();
            })
        })
        .collect();
    // While they wait (each has made its attempts and sleeps): at most the pool and the
    // listening connection, checked repeatedly over a second.
    let until = Instant::now() + Duration::from_secs(1);
    let mut most = 0;
    while Instant::now() < until {
        most = most.max(connections(&server, "waiters"));
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        most <= POOL + 1,
        "{most} connections for {WAITERS} waiting threads (pool {POOL} + 1 listening)"
    );
    assert_eq!(got.load(Ordering::SeqCst), 0, "a waiter took a held lock");
    guard.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(got.load(Ordering::SeqCst), WAITERS);
    assert!(connections(&server, "waiters") <= POOL + 1);
    // Dropped: every connection closed, the listening one included.
    drop(waiters);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections(&server, "waiters") > 0 {
        assert!(
            Instant::now() < deadline,
            "connections left open after the backend was dropped"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let listening = thread_names()
        .iter()
        .filter(|n| n.starts_with("dlm-postgres"))
        .count();
    assert_eq!(listening, 0, "the listening thread outlived its backend");
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

/// A reply that takes many reads (64 holders, each with a label of 256 bytes: some 20 KB,
/// where the connection reads at most 4 KB at once) comes back whole, and the connection
/// goes on serving requests.
#[test]
fn a_reply_of_many_reads_arrives_whole() {
    const PERMITS: u32 = 64;
    let server = PostgresServer::spawn();
    let b = Arc::new(backend(&server, "large", 1));
    let guards: Vec<_> = (0..PERMITS)
        .map(|i| {
            let label = format!("{i:0>256}");
            let client = LockClient::builder(b.clone()).label(label).build().unwrap();
            client
                .get_semaphore("many", PERMITS)
                .unwrap()
                .try_acquire()
                .unwrap()
                .expect("a permit is free")
        })
        .collect();
    let client = LockClient::new(b.clone());
    let holders = client
        .get_semaphore("many", PERMITS)
        .unwrap()
        .inspect()
        .unwrap();
    let mut labels: Vec<String> = holders
        .holders
        .iter()
        .filter_map(|h| h.label.clone())
        .collect();
    labels.sort();
    let expected: Vec<String> = (0..PERMITS).map(|i| format!("{i:0>256}")).collect();
    assert_eq!(labels, expected);
    drop(guards);
    assert_eq!(
        client
            .get_semaphore("many", PERMITS)
            .unwrap()
            .holders()
            .unwrap(),
        0
    );
}

/// A connection the server closed while it was idle (an administrator's
/// `pg_terminate_backend`) is found closed before it is lent again: the next request goes
/// out on a new connection and succeeds.
#[test]
fn an_idle_connection_the_server_closed_is_not_lent_again() {
    let server = PostgresServer::spawn();
    let client = LockClient::new(backend(&server, "closed", 1));
    let lock = client.get_lock("after-close").unwrap();
    drop(lock.try_lock().unwrap().expect("free"));
    assert_eq!(connections(&server, "closed"), 1);
    server.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'closed'",
    );
    // Until the server's session is gone, its goodbye may not have reached the socket.
    let until = Instant::now() + Duration::from_secs(10);
    while connections(&server, "closed") > 0 {
        assert!(Instant::now() < until, "the session did not end");
        thread::sleep(Duration::from_millis(10));
    }
    // Idle past the 50 ms after which a connection is looked at before it is lent.
    thread::sleep(Duration::from_millis(60));
    let guard = lock
        .try_lock()
        .expect("the closed connection was lent and failed the request")
        .expect("free");
    drop(guard);
}
