//! Semaphores and read-write locks on `RedisBackend`, against real servers: at most N
//! holders, one permit count per name, a leaked permit back within its lease, readers
//! share and a writer excludes, a waiting writer holds new readers back, downgrade,
//! fencing tokens across holders, wake-on-release for every waiter, a TTL on every key
//! after every step, foreign keys refused and left alone; the basic admission on Redis
//! Cluster.
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlm_core::{BackendErrorKind, LockClient};
use dlm_redis::{RedisBackend, redis};
use dlm_testkit::cluster::RedisCluster;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;

/// A client with its own backend (its own pool and hint listener: another process).
fn client(single: &common::Single) -> LockClient {
    LockClient::builder(dlm_testkit::Fixture::backend(single))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `PTTL` of every `dlm:*` key on `server` (a key without expiry shows -1).
fn ttls(server: &RedisServer) -> Vec<(String, i64)> {
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("dlm:*").query(&mut con).unwrap();
    keys.into_iter()
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut con).unwrap();
            (k, ttl)
        })
        .collect()
}

#[track_caller]
fn assert_all_keys_expire(server: &RedisServer, step: &str) {
    for (key, ttl) in ttls(server) {
        assert!(ttl > 0, "after {step}: {key} has PTTL {ttl}");
    }
}

fn backend_kind(e: &dlm_core::Error) -> Option<BackendErrorKind> {
    e.backend_kind()
}

#[test]
fn a_semaphore_admits_at_most_its_permits_across_threads_and_clients() {
    let single = common::Single::new();
    let clients = [client(&single), client(&single)];
    let name = unique_name("sem-n");
    let (inside, most, total) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    std::thread::scope(|s| {
        for t in 0..8 {
            let sem = clients[t % 2].get_semaphore(&name, 3).unwrap();
            let (inside, most, total) = (inside.clone(), most.clone(), total.clone());
            s.spawn(move || {
                for _ in 0..15 {
                    let guard = sem.acquire().unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(3)); // the work
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().unwrap();
                    total.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::SeqCst), 120);
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders of 3 permits at once");
    assert!(
        most >= 2,
        "never more than {most} holder at once: no sharing"
    );
    assert!(
        ttls(&single.server)
            .iter()
            .all(|(k, _)| k.starts_with("dlm:fence:")),
        "every hold released: no key left but the fencing stream"
    );
}

#[test]
fn another_permit_count_is_a_conflict_while_a_permit_is_held() {
    let single = common::Single::new();
    let (a, b) = (client(&single), client(&single));
    let name = unique_name("sem-count");
    let held = a.get_semaphore(&name, 2).unwrap().acquire().unwrap();
    let e = b
        .get_semaphore(&name, 3)
        .unwrap()
        .try_acquire()
        .unwrap_err();
    assert_eq!(backend_kind(&e), Some(BackendErrorKind::Conflict), "{e}");
    // The same count is fine; once nobody holds, another count is too.
    let second = b.get_semaphore(&name, 2).unwrap().try_acquire().unwrap();
    assert!(second.is_some());
    drop((held, second));
    let other = b.get_semaphore(&name, 3).unwrap().try_acquire().unwrap();
    assert!(other.is_some(), "free again: any count");
}

#[test]
fn a_leaked_permit_comes_back_within_its_lease() {
    let single = common::Single::new();
    let (a, b) = (client(&single), client(&single));
    let name = unique_name("sem-leak");
    let lease = Duration::from_millis(300);
    let leaked = a
        .get_semaphore(&name, 1)
        .unwrap()
        .with_lease(lease)
        .unwrap()
        .acquire()
        .unwrap();
    let start = Instant::now();
    std::mem::forget(leaked); // a holder that dies without releasing
    let sem = b.get_semaphore(&name, 1).unwrap();
    assert!(sem.try_acquire().unwrap().is_none(), "the permit is held");
    let back = sem.try_acquire_timeout(Duration::from_secs(5)).unwrap();
    let waited = start.elapsed();
    assert!(back.is_some(), "the leaked permit never came back");
    assert!(
        waited >= Duration::from_millis(250),
        "back after {waited:?}: before the lease ended"
    );
    assert!(waited < Duration::from_secs(3), "back after {waited:?}");
}

#[test]
fn readers_share_and_a_writer_excludes() {
    let single = common::Single::new();
    let (a, b) = (client(&single), client(&single));
    let name = unique_name("rw-share");
    let (ra, rb) = (a.get_rw_lock(&name).unwrap(), b.get_rw_lock(&name).unwrap());
    let r1 = ra.read().unwrap();
    let r2 = rb.try_read().unwrap().expect("readers share");
    assert_eq!(ra.holders().unwrap(), 2);
    let writer = std::thread::scope(|s| {
        s.spawn(|| rb.try_write().unwrap().is_some())
            .join()
            .unwrap()
    });
    assert!(!writer, "a writer beside readers");
    drop((r1, r2));
    let w = rb.try_write().unwrap().expect("free: the writer gets in");
    assert!(ra.try_read().unwrap().is_none(), "a reader beside a writer");
    assert!(ra.try_write().unwrap().is_none(), "two writers");
    drop(w);
    // The refused try_write left its mark (new readers wait up to 3 s): a writer gets in.
    assert!(ra.try_write().unwrap().is_some());
}

/// The fields of a resource's hash on the server.
fn fields(server: &RedisServer, key: &str) -> Vec<String> {
    redis::cmd("HKEYS")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

#[test]
fn a_waiting_writer_holds_new_readers_back() {
    let single = common::Single::new();
    let (a, b, c) = (client(&single), client(&single), client(&single));
    let name = unique_name("rw-pref");
    let key = format!("dlm:{{{name}}}:rw");
    let reading = a.get_rw_lock(&name).unwrap().read().unwrap();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let w = b.get_rw_lock(&name).unwrap().write().unwrap();
            let t = w.fencing_token().unwrap();
            (w, t)
        });
        // The writer was refused once: its mark is set.
        common::wait_until(Duration::from_secs(5), "the writer's mark", || {
            fields(&single.server, &key).contains(&"m".to_owned())
        });
        let late = c.get_rw_lock(&name).unwrap();
        assert!(
            late.try_read().unwrap().is_none(),
            "a new reader got in while a writer waits"
        );
        drop(reading);
        let (w, _) = writer.join().unwrap();
        assert!(
            late.try_read().unwrap().is_none(),
            "a reader beside the writer"
        );
        drop(w);
        assert!(late.try_read().unwrap().is_some(), "the writer left");
    });
}

#[test]
fn downgrade_keeps_the_token_and_lets_readers_in() {
    let single = common::Single::new();
    let (a, b, c) = (client(&single), client(&single), client(&single));
    let name = unique_name("rw-down");
    let w = a.get_rw_lock(&name).unwrap().write().unwrap();
    let token = w.fencing_token().unwrap();
    let other = b.get_rw_lock(&name).unwrap();
    assert!(other.try_read().unwrap().is_none());
    let r = w.downgrade().unwrap();
    assert_eq!(r.fencing_token().unwrap(), token, "the write hold's token");
    let r2 = other
        .try_read()
        .unwrap()
        .expect("a reader beside the downgraded one");
    assert!(r2.fencing_token().unwrap() > token);
    let third = c.get_rw_lock(&name).unwrap();
    assert!(third.try_write().unwrap().is_none(), "still readers inside");
    assert_eq!(third.holders().unwrap(), 2);
    drop((r, r2));
    assert!(third.try_write().unwrap().is_some());
}

#[test]
fn fencing_tokens_increase_across_permits_and_from_writers_to_readers() {
    let single = common::Single::new();
    let (a, b) = (client(&single), client(&single));
    let name = unique_name("fence");
    let mut last = None;
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = c.get_semaphore(&name, 2).unwrap().acquire().unwrap();
        let t = g.fencing_token().unwrap();
        assert!(
            last.is_none_or(|l| t > l),
            "permit {i}: {t:?} after {last:?}"
        );
        assert_eq!(g.fencing_token().unwrap(), t, "one token per hold");
        last = Some(t);
    }
    let rw = a.get_rw_lock(&name).unwrap();
    let w = rw.write().unwrap();
    let tw = w.fencing_token().unwrap();
    drop(w);
    let r = b.get_rw_lock(&name).unwrap().read().unwrap();
    assert!(r.fencing_token().unwrap() > tw, "a reader after a writer");
}

#[test]
fn every_release_wakes_every_waiter() {
    let single = common::Single::new();
    let holders = [client(&single), client(&single)];
    let waiter = client(&single);
    let name = unique_name("sem-wake");
    // Two permits held for 30 s: a waiter not woken would poll at the end of the lease.
    let held: Vec<_> = holders
        .iter()
        .map(|c| c.get_semaphore(&name, 2).unwrap().acquire().unwrap())
        .collect();
    let evalsha = || common::command_stat(&single.server, "evalsha", "calls");
    let before = evalsha();
    std::thread::scope(|s| {
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let sem = waiter.get_semaphore(&name, 2).unwrap();
                s.spawn(move || {
                    let start = Instant::now();
                    // Kept until both are in: its release must not be what wakes the other.
                    let got = sem.try_acquire_timeout(Duration::from_secs(10)).unwrap();
                    (got, start.elapsed())
                })
            })
            .collect();
        // Each waiter tried twice: before and after subscribing to the hints.
        common::wait_until(Duration::from_secs(5), "both waiters waiting", || {
            evalsha() >= before + 4
        });
        drop(held);
        let got: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
        for (guard, waited) in &got {
            // Not woken, a waiter would look again when the holders' 30 s leases end (and
            // get in at its 10 s deadline, at its last attempt).
            assert!(
                guard.is_some() && *waited < Duration::from_secs(5),
                "a waiter not woken by the releases (waited {waited:?})"
            );
        }
    });
}

#[test]
fn every_key_has_a_ttl_after_each_step() {
    let single = common::Single::new();
    let (a, b) = (client(&single), client(&single));
    let name = unique_name("ttl");
    let server = &single.server;
    let sem = |c: &LockClient| c.get_semaphore(&name, 1).unwrap();
    let p = sem(&a).acquire().unwrap();
    assert_all_keys_expire(server, "a permit");
    p.fencing_token().unwrap();
    assert_all_keys_expire(server, "a permit's token");
    assert!(sem(&b).try_acquire().unwrap().is_none());
    assert_all_keys_expire(server, "a refused permit");
    drop(p);
    assert_all_keys_expire(server, "a released permit");
    let rw = |c: &LockClient| c.get_rw_lock(&name).unwrap();
    let r = rw(&a).read().unwrap();
    assert_all_keys_expire(server, "a read hold");
    assert!(rw(&b).try_write().unwrap().is_none());
    assert_all_keys_expire(server, "a refused writer (its mark)");
    drop(r);
    assert_all_keys_expire(server, "a released reader, the mark left");
    let w = rw(&b).write().unwrap();
    assert_all_keys_expire(server, "a write hold");
    let r = w.downgrade().unwrap();
    assert_all_keys_expire(server, "a downgrade");
    drop(r);
    assert_all_keys_expire(server, "the end");
    let left: Vec<_> = ttls(server)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("dlm:fence:"))
        .collect();
    assert!(left.is_empty(), "keys left after every release: {left:?}");
}

#[test]
fn a_key_of_another_type_is_refused_and_left_untouched() {
    let single = common::Single::new();
    let c = client(&single);
    let mut admin = single.server.connection();
    // A string where the semaphore's hash goes, and a hash without expiry where the
    // read-write lock's goes.
    let name = unique_name("foreign");
    let (sem_key, rw_key) = (format!("dlm:{{{name}}}:sem"), format!("dlm:{{{name}}}:rw"));
    let () = redis::cmd("SET")
        .arg(&sem_key)
        .arg("not dlm's")
        .query(&mut admin)
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(&rw_key)
        .arg("owner")
        .arg("someone")
        .query(&mut admin)
        .map(|_: i64| ())
        .unwrap();
    let sem = c.get_semaphore(&name, 2).unwrap();
    let rw = c.get_rw_lock(&name).unwrap();
    for e in [
        sem.try_acquire().unwrap_err(),
        sem.force_unlock().unwrap_err(),
        sem.holders().unwrap_err(),
        rw.try_read().unwrap_err(),
        rw.try_write().map(|_| ()).unwrap_err(),
        rw.force_unlock().unwrap_err(),
    ] {
        assert_eq!(
            backend_kind(&e),
            Some(BackendErrorKind::UnexpectedKey),
            "{e}"
        );
    }
    let v: String = redis::cmd("GET").arg(&sem_key).query(&mut admin).unwrap();
    assert_eq!(v, "not dlm's");
    let h: Vec<String> = redis::cmd("HGETALL")
        .arg(&rw_key)
        .query(&mut admin)
        .unwrap();
    assert_eq!(h, ["owner", "someone"]);
    for key in [&sem_key, &rw_key] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut admin).unwrap();
        assert_eq!(ttl, -1, "{key} was given an expiry");
    }
}

#[test]
fn on_a_cluster_a_semaphore_and_a_read_write_lock_admit_as_on_one_server() {
    common::require();
    let c = RedisCluster::spawn();
    let client = || {
        let backend = RedisBackend::cluster_builder(&c.seed_urls()[..2])
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap();
        LockClient::builder(backend)
            .lease(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b, d) = (client(), client(), client());
    // A plain name and one that starts with '}' (its key hashes as a whole).
    for name in [unique_name("cl"), format!("}}{}", unique_name("cl"))] {
        let sem = |x: &LockClient| x.get_semaphore(&name, 2).unwrap();
        let p1 = sem(&a).acquire().unwrap();
        let t1 = p1.fencing_token().unwrap();
        let p2 = sem(&b).acquire().unwrap();
        assert!(
            sem(&d).try_acquire().unwrap().is_none(),
            "{name}: a third permit"
        );
        assert!(p2.fencing_token().unwrap() > t1);
        assert_eq!(sem(&d).holders().unwrap(), 2);
        drop(p1);
        let p3 = sem(&d)
            .try_acquire()
            .unwrap()
            .expect("a permit was released");
        assert!(p3.fencing_token().unwrap() > p2.fencing_token().unwrap());
        drop((p2, p3));
        let rw = |x: &LockClient| x.get_rw_lock(&name).unwrap();
        let r1 = rw(&a).read().unwrap();
        let r2 = rw(&b).try_read().unwrap().expect("readers share");
        assert!(
            rw(&d).try_write().unwrap().is_none(),
            "{name}: a writer beside readers"
        );
        drop((r1, r2));
        let w = rw(&d).try_write().unwrap().expect("free");
        assert!(
            rw(&a).try_read().unwrap().is_none(),
            "{name}: a reader beside a writer"
        );
        drop(w);
    }
}

#[test]
fn an_uncontended_acquire_and_release_are_one_script_call_each() {
    let single = common::Single::new();
    let c = client(&single);
    let name = unique_name("one-trip");
    let sem = c.get_semaphore(&name, 2).unwrap();
    let rw = c.get_rw_lock(&name).unwrap();
    drop(sem.acquire().unwrap()); // the script loaded
    let calls = |cmd: &str| common::command_stat(&single.server, cmd, "calls");
    let (evalsha, others) = (calls("evalsha"), calls("eval") + calls("script|load"));
    drop(sem.acquire().unwrap());
    drop(rw.read().unwrap());
    drop(rw.write().unwrap());
    assert_eq!(
        calls("evalsha") - evalsha,
        6,
        "three acquisitions, three releases"
    );
    assert_eq!(calls("eval") + calls("script|load"), others);
}
