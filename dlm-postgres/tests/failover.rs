//! Failovers against a real PostgreSQL primary and its streaming standby
//! (`dlm_testkit::postgres_pair`): the primary is killed (`kill -9`) while a lock is held
//! and the standby is promoted. The lease rows are unlogged (not replicated), so the
//! promoted standby starts with empty lease tables; what carries the earlier grants over
//! is the logged `held_until` row, raised durably before a grant is answered: the new
//! primary grants nothing before it, and sets the fencing tokens forward.
//!
//! With asynchronous replication that row reaches the standby only if it has replayed it
//! before the failover: the negative control shows the double grant when it has not (and
//! the fencing token that still refuses the old holder); with synchronous replication it
//! always has, and a grant waits for the standby rather than go unreplicated. Each test
//! has a pair of its own.
mod common;

use std::time::{Duration, Instant};

use dlm_core::{DistributedLock, Error, Lock, LockClient, LockGuard, RetryPolicy};
use dlm_postgres::PostgresBackend;
use dlm_testkit::postgres::PostgresServer;
use dlm_testkit::postgres_pair::{PostgresPair, Replication};
use dlm_testkit::unique_name;

/// A client with an explicit `lease` on `backend`. A release that fails (its server is
/// dead) is left to the background: dropping the client does not wait for it.
fn client_on(backend: PostgresBackend, lease: Duration) -> LockClient {
    LockClient::builder(backend)
        .lease(lease)
        .retry(RetryPolicy::default().release_wait(Duration::ZERO))
        .build()
        .unwrap()
}

/// A client on `url` with calm timeouts.
fn client(url: &str, lease: Duration) -> LockClient {
    client_on(common::backend(url), lease)
}

/// `dlm.settings.held_until` on `server`, as text.
fn held_until(server: &PostgresServer) -> String {
    server.psql("SELECT held_until FROM dlm.settings")
}

/// A write to the row of `fenced` on `server`, by a holder with fencing token `token`,
/// applied only if no larger token wrote before (`fence < token`): the rows it changed.
fn fenced_write(server: &PostgresServer, who: &str, token: u64) -> String {
    server.psql(&format!(
        "WITH w AS (UPDATE fenced SET v = '{who}', fence = {token} \
         WHERE id = 1 AND fence < {token} RETURNING 1) SELECT count(*) FROM w"
    ))
}

/// The hold-back after a failover: `lock`, asked on the promoted standby (its first
/// attempts may fail transiently), is granted only once the first holder's lease (asked
/// for at `asked`, valid until `first.valid_until()`) has ended, with a token larger than
/// its `first_token`.
fn granted_after_the_first_lease(
    lock: &DistributedLock,
    asked: Instant,
    lease: Duration,
    first: &LockGuard,
    first_token: u64,
) -> LockGuard {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut errors = 0;
    let got = loop {
        match lock.try_lock_timeout(Duration::from_secs(15)) {
            Ok(Some(guard)) => break guard,
            Ok(None) => {}
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                errors += 1;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not granted within 30 s ({errors} transient errors)"
        );
    };
    let granted = Instant::now();
    assert!(
        granted >= first.valid_until() && granted.duration_since(asked) >= lease,
        "granted {:?} after the first holder asked for its {lease:?} lease",
        granted.duration_since(asked)
    );
    let token = got.fencing_token().unwrap().get();
    assert!(
        token > first_token,
        "the token went back: {first_token} then {token}"
    );
    eprintln!(
        "granted {:?} after the first acquisition was asked for (lease {lease:?}, \
         {errors} transient errors); tokens {first_token} then {token}",
        granted.duration_since(asked)
    );
    got
}

/// The negative control. Asynchronous replication, and the standby lags: the primary's
/// WAL sender is stopped before the grant, so the grant's raise of `held_until` never
/// reaches the standby. The primary is killed, the standby promoted: it knows of no
/// lease, and grants the lock to a second client while the first holder's lease is still
/// valid (the documented failure of asynchronous replication). The fencing token still
/// refuses the old holder: the new primary set the token sequence forward to its clock,
/// so the second token is larger, and the old holder's fenced write changes nothing.
#[test]
fn async_failover_before_replay_grants_twice_but_fencing_refuses_the_old_holder() {
    let mut pair = PostgresPair::spawn(Replication::Async);
    let lease = Duration::from_secs(10);
    let name = unique_name("lagging");
    let first = client(&pair.primary.url(), lease);
    let lock = first.get_lock(&name).unwrap();
    // The first call installs dlm's schema (and grants nothing: `held_until` stays
    // -infinity); the fenced resource is a table. Both reach the standby.
    assert!(!lock.is_locked().unwrap());
    pair.primary.psql(
        "CREATE TABLE fenced (id int PRIMARY KEY, v text NOT NULL, fence bigint NOT NULL); \
         INSERT INTO fenced VALUES (1, 'nobody', 0)",
    );
    pair.wait_replayed();
    assert_eq!(held_until(&pair.standby), "-infinity");

    pair.pause_wal_sender();
    let guard = lock.try_lock().unwrap().expect("the lock is free");
    let granted = Instant::now();
    let old_token = guard.fencing_token().unwrap().get();
    assert_ne!(
        held_until(&pair.primary),
        "-infinity",
        "the grant did not raise held_until on the primary"
    );
    pair.primary.kill();
    pair.promote_standby();
    assert_eq!(
        held_until(&pair.standby),
        "-infinity",
        "the raise reached the standby: this test would prove nothing"
    );

    let second = client(&pair.standby.url(), lease);
    let other = second.get_lock(&name).unwrap();
    let got = other
        .try_lock()
        .unwrap()
        .expect("the promoted standby knows of no lease: it grants the lock again");
    let again = Instant::now();
    assert!(
        again < guard.valid_until() && guard.is_held(),
        "the first holder's lease ended before the second grant: no double grant shown"
    );
    let new_token = got.fencing_token().unwrap().get();
    assert!(
        new_token > old_token,
        "the new holder's token {new_token} is not larger than the old holder's {old_token}"
    );
    // Both holders write the fenced resource through the new primary: the new holder
    // first, then the old one, which is refused.
    assert_eq!(fenced_write(&pair.standby, "new holder", new_token), "1");
    assert_eq!(fenced_write(&pair.standby, "old holder", old_token), "0");
    assert_eq!(pair.standby.psql("SELECT v FROM fenced"), "new holder");
    eprintln!(
        "double grant {:?} after the first, {:?} before the first lease's validity ended; \
         tokens {old_token} (old holder) then {new_token} (new holder)",
        again.duration_since(granted),
        guard.valid_until().duration_since(again)
    );
}

/// Asynchronous replication, caught up before the failover (the standby has replayed the
/// grant's raise of `held_until`): the promoted standby grants the lock to nobody before
/// the first holder's lease ends, and with a larger token.
#[test]
fn async_failover_after_replay_grants_nothing_before_the_lease_ends() {
    let mut pair = PostgresPair::spawn(Replication::Async);
    let lease = Duration::from_secs(3);
    let name = unique_name("replayed");
    let first = client(&pair.primary.url(), lease);
    let asked = Instant::now();
    let guard = first
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("the lock is free");
    let token = guard.fencing_token().unwrap().get();
    let raised = held_until(&pair.primary);
    pair.wait_replayed();
    pair.primary.kill();
    pair.promote_standby();
    assert_eq!(held_until(&pair.standby), raised);
    assert_eq!(
        pair.standby.psql("SELECT count(*) FROM dlm.locks"),
        "0",
        "the promoted standby has lease rows: this test would prove nothing"
    );
    let other = client(&pair.standby.url(), lease);
    let lock = other.get_lock(&name).unwrap();
    let _got = granted_after_the_first_lease(&lock, asked, lease, &guard, token);
}

/// Synchronous replication: no wait for the standby before the failover. The primary is
/// killed right after the grant returned; the promoted standby grants nothing before the
/// first holder's lease ends, and with a larger token.
#[test]
fn sync_failover_right_after_the_grant_grants_nothing_before_the_lease_ends() {
    let mut pair = PostgresPair::spawn(Replication::Sync);
    let lease = Duration::from_secs(3);
    let name = unique_name("sync");
    let first = client(&pair.primary.url(), lease);
    let asked = Instant::now();
    let guard = first
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("the lock is free");
    pair.primary.kill();
    let token = guard.fencing_token().unwrap().get();
    pair.promote_standby();
    assert_ne!(held_until(&pair.standby), "-infinity");
    let other = client(&pair.standby.url(), lease);
    let lock = other.get_lock(&name).unwrap();
    let _got = granted_after_the_first_lease(&lock, asked, lease, &guard, token);
}

/// Synchronous replication with the standby down: a grant's raise of `held_until` waits
/// for the standby, so the request times out (a transient `Timeout`, within the io
/// timeout and the undo's) instead of being granted unreplicated, and nobody else is
/// granted the lock meanwhile. Once the standby is back, the lock can be taken.
#[test]
fn sync_grant_waits_for_the_standby_while_it_is_down() {
    let mut pair = PostgresPair::spawn(Replication::Sync);
    let io = Duration::from_secs(1);
    let lease = Duration::from_secs(2);
    let name = unique_name("standby-down");
    let backend = |url: &str| {
        PostgresBackend::builder(url)
            .io_timeout(io)
            .connect_timeout(common::CALM)
            .build()
            .unwrap()
    };
    let url = pair.primary.url();
    let first = client_on(backend(&url), lease);
    let second = client_on(backend(&url), lease);
    let lock = first.get_lock(&name).unwrap();
    let other = second.get_lock(&name).unwrap();
    // Schemas installed and connections open while the standby is up.
    assert!(!lock.is_locked().unwrap());
    assert!(!other.is_locked().unwrap());

    pair.standby.stop();
    let start = Instant::now();
    let err = lock
        .try_lock()
        .expect_err("granted while the synchronous standby was down");
    let took = start.elapsed();
    assert!(
        err.backend().is_some_and(|e| e.is_timeout()) && err.is_transient(),
        "not a transient timeout: {err}"
    );
    // The request's own deadline, and a margin for the undo (a release, which finds no
    // row: the grant's insert is not visible while its commit waits) and a loaded machine.
    assert!(
        took >= io && took <= 2 * io + Duration::from_secs(2),
        "the failed attempt took {took:?} (io timeout {io:?})"
    );
    let waiting = pair
        .primary
        .psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    assert_ne!(waiting, "0", "no session waits for the synchronous standby");
    // Another client's attempt waits for the row the blocked grant inserted.
    let other_err = other
        .try_lock()
        .expect_err("granted to another while the synchronous standby was down");
    assert!(other_err.is_transient(), "{other_err}");

    pair.standby.start();
    pair.wait_streaming();
    let back = Instant::now();
    let got = other
        .try_lock_timeout(Duration::from_secs(15))
        .unwrap()
        .expect("the lock once the standby is back");
    eprintln!(
        "the attempt failed after {took:?} ({err}); {waiting} session(s) waited for the \
         standby; another client's attempt: {other_err}; granted {:?} after the standby was \
         back ({:?} after the first attempt), token {}",
        back.elapsed(),
        start.elapsed(),
        got.fencing_token().unwrap().get()
    );
}

/// Backends built on the pair's URL (both servers) before the failover work after it:
/// dlm asks for `target_session_attrs=read-write`, so once the primary is dead and the
/// standby promoted, their new connections go to the promoted standby (the first attempts
/// may fail transiently). The waiter is granted the lock there, after the holder's lease
/// ends, with a larger token. (Before the failover, a URL that lists the standby first
/// reaches the primary all the same.)
#[test]
fn a_backend_on_the_pair_url_follows_the_failover() {
    let mut pair = PostgresPair::spawn(Replication::Async);
    let url = pair.url();
    let lease = Duration::from_secs(2);
    let name = unique_name("follow");
    let holder = client(&url, lease);
    let waiter = client(&url, lease);
    let waiting = waiter.get_lock(&name).unwrap();
    let asked = Instant::now();
    let guard = holder
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("the lock is free");
    let token = guard.fencing_token().unwrap().get();
    assert!(waiting.try_lock().unwrap().is_none(), "granted twice");
    // Listed first, the standby (read-only) is passed over for the primary.
    let reversed = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        pair.standby.port(),
        pair.primary.port()
    );
    let third = client(&reversed, lease);
    assert!(
        third.get_lock(&name).unwrap().try_lock().unwrap().is_none(),
        "granted twice"
    );
    assert_eq!(
        pair.primary.psql("SELECT count(*) FROM dlm.locks"),
        "1",
        "the lock was not taken on the primary"
    );
    pair.wait_replayed();
    pair.primary.kill();
    pair.promote_standby();
    let got = granted_after_the_first_lease(&waiting, asked, lease, &guard, token);
    assert_eq!(
        pair.standby.psql("SELECT count(*) FROM dlm.locks"),
        "1",
        "the lock was not taken on the promoted standby"
    );
    drop(got);
    assert!(matches!(guard.unlock(), Err(Error::LockLost)));
}
