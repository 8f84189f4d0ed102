//! Redis Sentinel, on real topologies the testkit starts (a master, two replicas, three
//! sentinels): the backend finds the master through the sentinels, follows a failover
//! under load (locks taken after it work, waiters are woken by releases on the new
//! master), refuses bad settings at build, and shows the documented failure: a lock
//! granted on a master that dies before replicating it is granted twice, which fencing
//! catches.
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlm_core::{BackendErrorKind, Error, Lock, LockClient};
use dlm_redis::{RedisBackend, redis};
use dlm_testkit::sentinel::SentinelTopology;
use dlm_testkit::unique_name;

fn backend(t: &SentinelTopology) -> RedisBackend {
    RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .unwrap()
}

fn client(t: &SentinelTopology) -> LockClient {
    LockClient::builder(backend(t))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The lock's key is on the server `t` names as the master.
fn on_master(t: &SentinelTopology, name: &str) -> bool {
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut t.master().connection())
        .unwrap();
    exists == 1
}

#[test]
fn finds_the_master_through_the_sentinels() {
    common::require();
    let t = SentinelTopology::spawn();
    let c = client(&t);
    let name = unique_name("sentinel");
    let g = c.get_lock(&name).unwrap().lock().unwrap();
    assert!(on_master(&t, &name), "the key is not on the master");
    assert!(g.fencing_token().is_ok());
    g.unlock().unwrap();
    assert!(!on_master(&t, &name));

    // `master_db`: the lock lives in that database of the master.
    let in_db_5 = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
            .master_db(5)
            .build()
            .unwrap(),
    );
    let g = in_db_5.get_lock(&name).unwrap().lock().unwrap();
    let mut con = t.master().connection();
    let _: () = redis::cmd("SELECT").arg(5).query(&mut con).unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, 1, "the key is not in database 5");
    assert!(!on_master(&t, &name), "the key is in database 0");
    g.unlock().unwrap();
}

/// Four threads take and release locks while `SENTINEL FAILOVER` moves the master: every
/// thread takes locks again after the failover, on the new master, and a waiter that
/// waits across the failover is woken by a release on the new master (its backoff is
/// 10 s: only a release hint wakes it sooner).
#[test]
fn a_failover_under_load_keeps_locks_available_and_waiters_woken() {
    common::require();
    let t = SentinelTopology::spawn();
    let old_master = t.master_index();
    let stop = AtomicBool::new(false);
    let failed_over = AtomicBool::new(false);
    let after = AtomicUsize::new(0);
    let errors = AtomicUsize::new(0);
    let lost_releases = AtomicUsize::new(0);
    // The longest time without a hold by any thread (the failover's unavailability).
    let last_hold = std::sync::Mutex::new(None::<Instant>);
    let longest_gap = std::sync::Mutex::new(Duration::ZERO);
    let holder_client = client(&t);
    let waited = unique_name("waited");
    let held = holder_client.get_lock(&waited).unwrap().lock().unwrap();
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(1);
    /// Stops the load threads also when an assertion fails (the scope joins them).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for i in 0..4 {
            let (t, stop, failed_over, after, errors) = (&t, &stop, &failed_over, &after, &errors);
            let (last_hold, longest_gap, lost_releases) =
                (&last_hold, &longest_gap, &lost_releases);
            s.spawn(move || {
                let c = client(t);
                let mut lock = c.get_lock(&format!("load-{i}")).unwrap();
                let mut renamed = 0;
                while !stop.load(Ordering::Acquire) {
                    let moved = failed_over.load(Ordering::Acquire);
                    match lock.try_lock_timeout(Duration::from_secs(10)) {
                        Ok(Some(g)) => {
                            let now = Instant::now();
                            if let Some(last) = last_hold.lock().unwrap().replace(now) {
                                let mut gap = longest_gap.lock().unwrap();
                                *gap = (*gap).max(now - last);
                            }
                            // A release that failed during the switch is not an error
                            // of the lock: it ends with its lease (30 s), and the thread
                            // goes on with another name.
                            if let Err(e) = g.unlock() {
                                eprintln!("thread {i}: release failed: {e}");
                                lost_releases.fetch_add(1, Ordering::AcqRel);
                                renamed += 1;
                                lock = c.get_lock(&format!("load-{i}-{renamed}")).unwrap();
                            }
                            if moved {
                                after.fetch_add(1, Ordering::AcqRel);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            errors.fetch_add(1, Ordering::AcqRel);
                            eprintln!("thread {i}: {e}");
                        }
                    }
                }
            });
        }
        // The waiter: waits across the failover, with a backoff that only a hint beats.
        let waiter = s.spawn(|| common::waiter(backend(&t), &waited, started_tx));
        started_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(300)); // load before the failover
        let new_master = t.failover();
        assert_ne!(new_master, old_master);
        failed_over.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(15);
        while after.load(Ordering::Acquire) < 40 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The holder's lock replicated before the failover: still held, on the new master.
        assert!(
            on_master(&t, &waited),
            "the held lock is not on the new master"
        );
        let released = Instant::now();
        held.unlock().unwrap();
        let got = waiter.join().unwrap();
        let woken = got.saturating_duration_since(released);
        eprintln!("waiter woken {woken:?} after the release on the new master");
        assert!(
            woken < Duration::from_secs(3),
            "the waiter was not woken by the release on the new master ({woken:?})"
        );
    });
    let after = after.load(Ordering::Acquire);
    eprintln!(
        "holds after the failover: {after}; errors during it: {}; releases that failed: {}; longest time without a hold: {:?}",
        errors.load(Ordering::Acquire),
        lost_releases.load(Ordering::Acquire),
        longest_gap.lock().unwrap()
    );
    assert!(after >= 40, "only {after} holds after the failover");
    assert_eq!(errors.load(Ordering::Acquire), 0, "acquisitions failed");
}

/// The documented failure: the replicas are cut off, A takes the lock on the master, the
/// master dies, and Sentinel promotes a replica that never saw A's lock: B takes it too.
/// The history checker sees two holders; fencing keeps A's late write out.
#[test]
fn a_failover_before_replication_grants_the_lock_twice_and_fencing_refuses_the_old_holder() {
    common::require();
    let mut t = SentinelTopology::spawn();
    let name = unique_name("lost");
    let a = client(&t);
    for _ in 0..3 {
        a.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
    }
    let old = t.master_index();
    // Both replicas have everything so far (the earlier holders' fencing stream), then
    // are cut off.
    common::replicated(t.master(), 2);
    let replicas: Vec<_> = t
        .replica_indexes()
        .into_iter()
        .map(|r| t.data_node(r))
        .collect();
    common::cut_off_replicas(t.master(), &replicas);
    let holder = common::OldHolder::new(a.get_lock(&name).unwrap().lock().unwrap());
    // The master dies with the grant; the sentinels promote a replica.
    t.data_node_mut(old).kill();
    for r in t.replica_indexes() {
        t.data_node(r).resume();
    }
    let new = t.wait_for_new_master(old, Duration::from_secs(30));
    assert_ne!(new, old);

    holder.assert_granted_again(&client(&t));
}

#[test]
fn data_node_and_sentinel_passwords() {
    common::require();
    let t = SentinelTopology::builder()
        .password("data pw%41")
        .sentinel_password("sentinel pw")
        .spawn();
    let c = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
            .master_auth(None, "data pw%41")
            .build()
            .unwrap(),
    );
    let name = unique_name("auth");
    c.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();

    // A wrong data password: the sentinels answer (build succeeds), the master refuses.
    let wrong = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_urls())
            .master_auth(None, "wrong")
            .build()
            .unwrap(),
    );
    let e = wrong.get_lock(&name).unwrap().try_lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth), "{e}");
    assert!(!e.to_string().contains("data pw") && !e.to_string().contains("wrong"));

    // Sentinel URLs without the sentinels' password: refused at build.
    let plain: Vec<String> = t
        .sentinel_addrs()
        .iter()
        .map(|a| format!("redis://{a}"))
        .collect();
    let e = RedisBackend::sentinel_builder(t.master_name(), &plain)
        .master_auth(None, "data pw%41")
        .build()
        .unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth), "{e}");
}

/// Each bad setting is a typed error from `build`, before any lock is attempted.
#[test]
fn bad_settings_are_refused_at_build() {
    common::require();
    let t = SentinelTopology::spawn();
    let urls = t.sentinel_urls();
    let invalid = |r: dlm_core::Result<RedisBackend>| match r {
        Err(Error::InvalidArgument(e)) => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };

    let m = invalid(RedisBackend::sentinel_builder("no-such-master", &urls).build());
    assert!(
        m.contains("no-such-master") && m.contains("do not know"),
        "{m}"
    );
    invalid(RedisBackend::sentinel_builder("", &urls).build());
    invalid(RedisBackend::sentinel_builder::<&str>(t.master_name(), &[]).build());
    let mixed = vec![
        urls[0].clone(),
        urls[1].replacen("redis://", "rediss://", 1),
    ];
    invalid(RedisBackend::sentinel_builder(t.master_name(), &mixed).build());
    // A Sentinel setting on another deployment's builder does not compile (the
    // builders' compile_fail doc tests).

    // Sentinels of two deployments that both monitor "mymaster": they disagree.
    let other = SentinelTopology::spawn();
    let both = vec![
        urls[0].clone(),
        urls[1].clone(),
        other.sentinel_urls()[0].clone(),
    ];
    let m = invalid(RedisBackend::sentinel_builder(t.master_name(), &both).build());
    assert!(m.contains("disagree"), "{m}");

    // No sentinel answers: a backend error, within the connect timeout per sentinel.
    let nobody = ["redis://127.0.0.1:1", "redis://127.0.0.1:2"];
    let started = Instant::now();
    let e = RedisBackend::sentinel_builder(t.master_name(), &nobody)
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unavailable), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// `ACL SETUSER user rules...` on each of `servers`.
fn acl_user(servers: &[&dlm_testkit::redis_server::RedisServer], user: &str, rules: &str) {
    for server in servers {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg(rules.split(' ').collect::<Vec<_>>())
            .query(&mut server.connection())
            .unwrap();
    }
}

/// ACL users, on the sentinels (only what discovery needs) and on the data nodes (only
/// dlm's keys and channels): the sentinels' user in their URLs, the data nodes' with
/// `master_auth(Some(user), ..)`.
#[test]
fn acl_users_on_the_sentinels_and_the_data_nodes() {
    common::require();
    let t = SentinelTopology::spawn();
    let sentinels: Vec<_> = (0..t.sentinel_count()).map(|i| t.sentinel(i)).collect();
    let finder = "on >finder-pw -@all +sentinel|get-master-addr-by-name +ping";
    acl_user(&sentinels, "finder", finder);
    acl_user(
        &t.data_nodes().iter().collect::<Vec<_>>(),
        "app",
        "on >app-pw ~dlm:* &dlm:* +@all",
    );
    let urls: Vec<String> = t
        .sentinel_addrs()
        .iter()
        .map(|a| format!("redis://finder:finder-pw@{a}"))
        .collect();
    let c = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &urls)
            .master_auth(Some("app"), "app-pw")
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let name = unique_name("acl");
    let g = c.get_lock(&name).unwrap().lock().unwrap();
    assert!(on_master(&t, &name));
    g.unlock().unwrap();
    // The sentinels' user with the data nodes' password: refused by the master.
    let wrong = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &urls)
            .master_auth(Some("app"), "finder-pw")
            .build()
            .unwrap(),
    );
    let e = wrong.get_lock(&name).unwrap().try_lock().unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Auth), "{e}");
    // A sentinel user that may not ask: refused at build, as a permission error.
    let denied: Vec<String> = t
        .sentinel_addrs()
        .iter()
        .map(|a| format!("redis://nobody:x@{a}"))
        .collect();
    acl_user(&sentinels, "nobody", "on >x -@all +ping");
    let e = RedisBackend::sentinel_builder(t.master_name(), &denied)
        .build()
        .unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Permission), "{e}");
}

/// A deployment that uses TLS everywhere (data nodes, replication, sentinels): the
/// `rediss://` sentinel URLs make the data nodes reached over TLS too, verified against
/// the test CA and the address the sentinels name; a failover is followed. A client that
/// does not trust the CA is refused at build.
#[test]
fn a_tls_deployment_is_reached_over_tls_and_followed_through_a_failover() {
    common::require();
    let t = SentinelTopology::builder().tls().spawn();
    let tls = || dlm_redis::TlsOptions::new().ca_file(t.tls_ca_file());
    let c = LockClient::new(
        RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_tls_urls())
            .tls(tls())
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let name = unique_name("tls");
    let g = c.get_lock(&name).unwrap().lock().unwrap();
    assert!(on_master(&t, &name));
    g.unlock().unwrap();
    // Every connection of the backend went to a TLS port: the plain ports saw none.
    let plain_clients = |i: usize| -> usize {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut t.data_node(i).connection())
            .unwrap();
        list.lines()
            .filter(|l| l.contains(&format!("laddr=127.0.0.1:{} ", t.data_node(i).port())))
            .count()
    };
    let old = t.master_index();
    // One plain connection: the CLIENT LIST's own.
    assert_eq!(plain_clients(old), 1, "a plain connection to the master");
    let new = t.failover();
    assert_ne!(new, old);
    let g = c
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("taken on the new master");
    assert!(on_master(&t, &name));
    g.unlock().unwrap();
    assert_eq!(
        plain_clients(new),
        1,
        "a plain connection to the new master"
    );

    let e = RedisBackend::sentinel_builder(t.master_name(), &t.sentinel_tls_urls())
        .build()
        .unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Tls), "{e}");
}
