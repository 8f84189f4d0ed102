//! Faults against real PostgreSQL servers: `kill -9` and restart (under load, with the
//! history checker), a clean restart, a server paused past a lease, an administrator
//! terminating dlm's sessions, a client cut off by a proxy. Each test has a server of its
//! own.
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{HoldState, Lock, LockClient};
use dlm_postgres::PostgresBackend;
use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::history::History;
use dlm_testkit::postgres::PostgresServer;
use parking_lot::Mutex;

fn client(url: &str, lease: Duration) -> LockClient {
    LockClient::builder(common::backend(url))
        .lease(lease)
        .build()
        .unwrap()
}

fn watchdog_client(backend: PostgresBackend, timeout: Duration) -> LockClient {
    LockClient::builder(backend)
        .watchdog_timeout(timeout)
        .build()
        .unwrap()
}

/// Two clients, two threads each, take one lock 1,000 times while the server is killed
/// (`kill -9`) and restarted about half-way: the fencing tokens, in the order they were
/// granted, strictly increase, and no two holds overlap within their validity (the
/// holds granted before the crash, whose rows the crash emptied, included).
#[test]
fn tokens_never_go_back_across_kill_9_and_restart() {
    const TOTAL: usize = 1_000;
    let mut server = PostgresServer::spawn();
    let url = server.url();
    let history = Arc::new(History::new());
    let granted: Arc<Mutex<Vec<u64>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for c in 0..2 {
        let client = Arc::new(client(&url, Duration::from_millis(500)));
        for t in 0..2 {
            let (client, history, granted, done, count) = (
                client.clone(),
                history.clone(),
                granted.clone(),
                done.clone(),
                count.clone(),
            );
            threads.push(thread::spawn(move || {
                let lock = client.get_lock("crash").unwrap();
                let mut errors = 0;
                while !done.load(Ordering::SeqCst) {
                    let guard = match lock.try_lock_timeout(Duration::from_secs(5)) {
                        Ok(Some(g)) => g,
                        Ok(None) => continue,
                        Err(e) => {
                            assert!(e.is_transient(), "{e}");
                            errors += 1;
                            thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    let token = guard.fencing_token().unwrap().get();
                    let hold = history.begin(format!("client {c} thread {t}"), &guard);
                    // Under the lock: the tokens go in in grant order.
                    granted.lock().push(token);
                    if count.fetch_add(1, Ordering::SeqCst) + 1 >= TOTAL {
                        done.store(true, Ordering::SeqCst);
                    }
                    history.end(hold, &guard);
                    let _ = guard.unlock();
                }
                errors
            }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::SeqCst) < TOTAL / 2 {
        assert!(Instant::now() < deadline, "no progress before the crash");
        thread::sleep(Duration::from_millis(5));
    }
    server.restart();
    let before = count.load(Ordering::SeqCst);
    let errors: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let tokens = granted.lock().clone();
    assert!(tokens.len() >= TOTAL, "{} acquisitions", tokens.len());
    assert!(
        before < TOTAL,
        "the crash came after the last acquisition ({before})"
    );
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "a token went back: {} then {}", w[0], w[1]);
    }
    history.check().assert_clean();
    eprintln!(
        "{} acquisitions, {before} before the crash, {errors} failed attempts while the server was down",
        tokens.len()
    );
}

/// A crash empties the unlogged lease tables: nothing is granted again before every lease
/// granted before it has ended (the hold-back), and the tokens after it are larger.
#[test]
fn after_a_crash_nothing_is_granted_before_the_earlier_leases_end() {
    let mut server = PostgresServer::spawn();
    let url = server.url();
    let lease = Duration::from_secs(3);
    let holder = client(&url, lease);
    let asked = Instant::now();
    let guard = holder.get_lock("job").unwrap().lock().unwrap();
    let before = guard.fencing_token().unwrap().get();
    server.restart();
    assert_eq!(
        server.psql("SELECT count(*) FROM dlm.locks"),
        "0",
        "the crash did not empty the table: this test would prove nothing"
    );
    let other = client(&url, lease).get_lock("job").unwrap();
    let got = other
        .try_lock_timeout(Duration::from_secs(15))
        .unwrap()
        .expect("granted once the hold-back ended");
    let waited = asked.elapsed();
    assert!(
        waited >= lease,
        "granted {waited:?} after the first acquisition was asked for, within its {lease:?} lease"
    );
    assert!(got.fencing_token().unwrap().get() > before);
    // The old holder's row went with the crash: its release finds nothing.
    assert!(matches!(guard.unlock(), Err(dlm_core::Error::LockLost)));
}

/// A clean restart (fast shutdown, start) keeps the unlogged tables, and so the locks.
#[test]
fn a_clean_restart_keeps_the_locks() {
    let mut server = PostgresServer::spawn();
    let url = server.url();
    let holder = client(&url, Duration::from_secs(30));
    let guard = holder.get_lock("kept").unwrap().lock().unwrap();
    server.stop();
    server.start();
    let other = client(&url, Duration::from_secs(30));
    assert!(
        other
            .get_lock("kept")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none(),
        "a clean restart freed a held lock"
    );
    guard.unlock().unwrap();
    assert!(
        other
            .get_lock("kept")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some()
    );
}

/// A server stopped (SIGSTOP) past a lease: the holder learns it lost the lock by the end
/// of its validity, and once the server is back the lock is free for others.
#[test]
fn a_paused_server_loses_the_lock_by_the_end_of_its_validity() {
    let server = PostgresServer::spawn();
    let url = server.url();
    let backend = PostgresBackend::builder(&url)
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let holder = watchdog_client(backend, Duration::from_secs(1));
    let guard = holder.get_lock("paused").unwrap().lock().unwrap();
    let signal = guard.lost_signal();
    server.pause();
    let valid_until = guard.valid_until();
    let state = signal.wait_timeout(Duration::from_secs(5));
    let told = Instant::now();
    server.resume();
    assert_eq!(state, HoldState::Lost);
    assert!(
        told <= valid_until + Duration::from_millis(200),
        "told {:?} after the validity ended",
        told - valid_until
    );
    assert!(!guard.is_held());
    let other = client(&url, Duration::from_secs(5))
        .get_lock("paused")
        .unwrap();
    assert!(
        other
            .try_lock_timeout(Duration::from_secs(5))
            .unwrap()
            .is_some(),
        "the lock stayed held after the server came back"
    );
}

/// An administrator terminates every session of dlm's (`pg_terminate_backend`) while a
/// lock is held: leases do not live in sessions, so the holder keeps its lock (its next
/// requests open new connections) and nobody else gets it.
#[test]
fn terminated_sessions_do_not_free_a_lock() {
    let server = PostgresServer::spawn();
    let url = server.url();
    let holder = watchdog_client(common::backend(&url), Duration::from_secs(1));
    let guard = holder.get_lock("admin").unwrap().lock().unwrap();
    let other = client(&url, Duration::from_secs(5));
    let other_lock = other.get_lock("admin").unwrap();
    for _ in 0..4 {
        let killed = server.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'dlm' AND pid <> pg_backend_pid()",
        );
        assert_ne!(killed, "0", "no session of dlm's was terminated");
        assert!(
            other_lock
                .try_lock_timeout(Duration::from_millis(500))
                .unwrap()
                .is_none(),
            "the lock was granted to another while its holder's sessions were terminated"
        );
    }
    assert!(guard.is_held(), "the holder lost its lock");
    guard.unlock().unwrap();
    assert!(other_lock.try_lock().unwrap().is_some());
}

/// A holder cut off from the server (a proxy that stops passing anything): it learns it
/// lost the lock by the end of its validity, and the lock is free for others by the end
/// of its last lease at the server.
#[test]
fn a_cut_off_holder_loses_the_lock_and_others_get_it_when_its_lease_ends() {
    let server = PostgresServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let via_proxy = server.url().replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", proxy.port()),
    );
    let backend = PostgresBackend::builder(&via_proxy)
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let timeout = Duration::from_secs(1);
    let holder = watchdog_client(backend, timeout);
    let guard = holder.get_lock("cut").unwrap().lock().unwrap();
    let signal = guard.lost_signal();
    let other = client(&server.url(), Duration::from_secs(5))
        .get_lock("cut")
        .unwrap();
    proxy.blackhole(Direction::ToServer);
    proxy.blackhole(Direction::ToClient);
    let cut = Instant::now();
    let valid_until = guard.valid_until();
    assert_eq!(signal.wait_timeout(Duration::from_secs(5)), HoldState::Lost);
    assert!(Instant::now() <= valid_until + Duration::from_millis(200));
    let got = other
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("free once the cut-off holder's lease ended");
    // Its last renewal was sent before the cut: its lease at the server ends within one
    // watchdog timeout of it (plus the rounding to milliseconds).
    assert!(
        cut.elapsed() <= timeout + Duration::from_millis(500),
        "free {:?} after the cut",
        cut.elapsed()
    );
    drop(got);
    proxy.heal();
}

/// A new epoch opened by several sessions at once (first use of a schema, or the first
/// requests after a crash): eight clients start together on a fresh schema and take one
/// lock in turn; the tokens, in grant order, strictly increase. Twenty fresh schemas on
/// one server: twenty openings raced. (An opening that found no epoch, then set the
/// token sequence forward after another opening had committed and tokens had been drawn
/// from it, set the sequence back: CI's PgBouncer test saw a token go back by 2,490.)
#[test]
fn concurrent_openings_of_an_epoch_never_set_tokens_back() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 20;
    const HOLDS: usize = 5;
    let server = PostgresServer::spawn();
    let url = server.url();
    for round in 0..ROUNDS {
        let schema = format!("race_{round}");
        let start = Arc::new(std::sync::Barrier::new(CLIENTS));
        let granted = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let backend = PostgresBackend::builder(&url)
                    .schema(&schema)
                    .build()
                    .unwrap();
                let (start, granted) = (start.clone(), granted.clone());
                thread::spawn(move || {
                    let lock = LockClient::builder(backend)
                        .lease(Duration::from_secs(30))
                        .build()
                        .unwrap()
                        .get_lock("raced")
                        .unwrap();
                    start.wait();
                    for _ in 0..HOLDS {
                        let guard = lock.lock().unwrap();
                        granted.lock().push(guard.fencing_token().unwrap().get());
                        guard.unlock().unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let tokens = granted.lock().clone();
        assert_eq!(tokens.len(), CLIENTS * HOLDS);
        for w in tokens.windows(2) {
            assert!(
                w[0] < w[1],
                "schema {schema}: a token went back: {} then {}",
                w[0],
                w[1]
            );
        }
    }
}

/// The durable mark a backend learned covers later grants of the same epoch only. Here the
/// server behind the backend's connections changes as it would behind a proxy after a
/// failover to an asynchronous standby: its mark is lower and its epoch new (made by hand:
/// the mark set back, the epoch row deleted). The next grant raises the mark on that
/// server before it is answered, so a crash there would hold the lock back.
#[test]
fn a_grant_in_another_epoch_raises_that_epochs_durable_mark() {
    let server = PostgresServer::spawn();
    let c = client(&server.url(), Duration::from_secs(30));
    let covered = "SELECT (SELECT held_until FROM dlm.settings) >= \
                   (SELECT max(expires) FROM dlm.locks WHERE owner <> '')";
    let first = c.get_lock("first").unwrap().lock().unwrap();
    assert_eq!(server.psql(covered), "t");
    server.psql("UPDATE dlm.settings SET held_until = clock_timestamp() - interval '1 s'");
    server.psql("DELETE FROM dlm.epoch");
    let second = c.get_lock("second").unwrap().lock().unwrap();
    assert_eq!(
        server.psql(covered),
        "t",
        "a lease of the new epoch outlasts its server's durable mark"
    );
    drop((first, second));
}

/// The epoch row, read by every acquisition, is written when an epoch opens and not when
/// the durable mark goes up (a row updated once a second left dead versions that every
/// read walked). A grant whose lease outlasts the mark raises the mark, and the epoch row
/// keeps the version it had.
#[test]
fn raising_the_durable_mark_leaves_the_epoch_row_as_it_was() {
    let server = PostgresServer::spawn();
    let url = server.url();
    let first = client(&url, Duration::from_secs(30))
        .get_lock("first")
        .unwrap()
        .lock()
        .unwrap();
    let version = server.psql("SELECT xmin FROM dlm.epoch");
    let mark = server.psql("SELECT held_until FROM dlm.settings");
    // A longer lease outlasts the mark the first grant raised.
    let second = client(&url, Duration::from_secs(90))
        .get_lock("second")
        .unwrap()
        .lock()
        .unwrap();
    assert_ne!(
        server.psql("SELECT held_until FROM dlm.settings"),
        mark,
        "the mark was not raised: this test would prove nothing"
    );
    assert_eq!(
        server.psql("SELECT xmin FROM dlm.epoch"),
        version,
        "raising the mark wrote the epoch row"
    );
    drop((first, second));
}
