//! Redis Cluster, on real clusters the testkit starts (three masters, one replica each):
//! each lock's keys live in one slot, whatever braces its name holds; a slot migration
//! under load keeps the locks of that slot working through `ASK` and `MOVED`; a master
//! that dies under load is replaced and locks are available again (a lock that had
//! replicated survives, and its waiter is woken); bad settings are refused at build; and
//! the documented failure: a lock granted on a master that dies before replicating it is
//! granted twice, which fencing catches.
mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlm_core::{Error, Lock, LockClient, TokenDraw};
use dlm_redis::{RedisBackend, redis};
use dlm_testkit::cluster::{RedisCluster, slot_of};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;

fn backend(c: &RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(&c.seed_urls()[..2])
        .io_timeout(common::CALM)
        .connect_timeout(common::CALM)
        .build()
        .unwrap()
}

fn client(c: &RedisCluster) -> LockClient {
    LockClient::builder(backend(c))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Whether node `i` holds `key` (`ASKING` first: it may be importing the key's slot).
fn has_key(c: &RedisCluster, i: usize, key: &str) -> bool {
    let ((), exists): ((), i64) = redis::pipe()
        .cmd("ASKING")
        .cmd("EXISTS")
        .arg(key)
        .query(&mut c.node(i).connection())
        .unwrap();
    exists == 1
}

#[test]
fn each_locks_keys_live_in_one_slot_whatever_braces_its_name_holds() {
    common::require();
    let c = RedisCluster::spawn();
    let backend = std::sync::Arc::new(backend(&c));
    let client = LockClient::new(backend.clone());
    let names = ["plain", "a{b}c", "{x}", "}y{", "{}", "{{}}", "x}", "é{ü}"];
    let mut masters = std::collections::BTreeSet::new();
    for name in names {
        let name = unique_name(name);
        let keys = backend.keys(&name).unwrap();
        let slot = slot_of(keys.lock.as_bytes());
        assert_eq!(
            slot_of(keys.fencing_stream.as_bytes()),
            slot,
            "{name}: the fencing stream is in another slot"
        );
        let master = c.master_of_slot(slot);
        masters.insert(master);
        let lock = client.get_lock(&name).unwrap();
        let g = lock.lock().unwrap();
        assert!(g.fencing_token().is_ok());
        assert!(has_key(&c, master, &keys.lock), "{name}: not on its master");
        assert!(has_key(&c, master, &keys.fencing_stream));
        assert!(lock.is_locked().unwrap());
        // The value next to the lock, fenced, goes to its slot's master too.
        let value = format!("value:{{{name}}}");
        backend
            .fenced_set(&value, g.fencing_token().unwrap(), b"v")
            .unwrap();
        assert_eq!(
            backend.fenced_get(&value).unwrap().map(|(v, _)| v),
            Some(b"v".to_vec())
        );
        g.unlock().unwrap();
        assert!(!has_key(&c, master, &keys.lock));
        // Force-unlock reaches the right node as well.
        let g = lock.lock().unwrap();
        assert!(lock.force_unlock().unwrap());
        assert!(!lock.is_locked().unwrap());
        g.into_hold();
    }
    assert!(masters.len() > 1, "the names all went to one master");
}

/// The load of the migration and failover tests: threads that lock and unlock names of
/// one slot (a name of their own each), counting holds and the longest time without one.
struct Load {
    stop: AtomicBool,
    holds: AtomicUsize,
    /// Acquisitions that failed (the front retries transient errors for 10 s first).
    errors: AtomicUsize,
    /// Releases that failed: a master that died with the lock (see `run`).
    lost_releases: AtomicUsize,
    /// The longest time between two holds of any thread, from `since` on.
    last_hold: Mutex<Option<Instant>>,
    longest_gap: Mutex<Duration>,
}

impl Load {
    fn new() -> Load {
        Load {
            stop: AtomicBool::new(false),
            holds: AtomicUsize::new(0),
            errors: AtomicUsize::new(0),
            lost_releases: AtomicUsize::new(0),
            last_hold: Mutex::new(None),
            longest_gap: Mutex::new(Duration::ZERO),
        }
    }

    /// Locks and unlocks `name` until stopped. A release that failed (the master died
    /// with the lock) is not a lock error: the lock ends with its lease (30 s), and the
    /// thread goes on with another name of the same slot instead of waiting for it.
    fn run(&self, c: &RedisCluster, name: &str) {
        let client = client(c);
        let mut lock = client.get_lock(name).unwrap();
        let mut renamed = 0;
        // The names of one thread share a slot, so its tokens come from one fencing
        // stream, wherever the slot is served: they increase across the migration and
        // the failover.
        let mut last_token = None;
        while !self.stop.load(Ordering::Acquire) {
            match lock.try_lock_timeout(Duration::from_secs(15)) {
                Ok(Some(g)) => {
                    let token = g.fencing_token().expect("fencing is on");
                    assert!(
                        last_token.is_none_or(|last| token > last),
                        "{name}: token {token} after {last_token:?}"
                    );
                    last_token = Some(token);
                    self.holds.fetch_add(1, Ordering::AcqRel);
                    let now = Instant::now();
                    if let Some(last) = self.last_hold.lock().unwrap().replace(now) {
                        let mut gap = self.longest_gap.lock().unwrap();
                        *gap = (*gap).max(now - last);
                    }
                    if let Err(e) = g.unlock() {
                        eprintln!("{name}: release failed: {e}");
                        self.lost_releases.fetch_add(1, Ordering::AcqRel);
                        renamed += 1;
                        lock = client.get_lock(&format!("{name}-{renamed}")).unwrap();
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("{name}: {e}");
                    self.errors.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Waits until `n` more holds were made (at most `limit`).
    fn wait_for_holds(&self, n: usize, limit: Duration) -> usize {
        let start = self.holds.load(Ordering::Acquire);
        common::wait_until(limit, "holds under load", || {
            self.holds.load(Ordering::Acquire) >= start + n
        });
        self.holds.load(Ordering::Acquire) - start
    }
}

/// Stops the load threads also when an assertion fails (the scope joins them).
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A slot migrated key by key (as `redis-cli --cluster reshard` does) while threads lock
/// and unlock names of that slot. What Redis Cluster allows during the migration: a held
/// lock is released (and renewed) through `ASK` once its key has moved; an unfenced
/// acquisition (one key) follows `ASK` too, and so does a fenced one (the same `SET NX`
/// while its token is unread); one that draws its token with it names two keys (the lock
/// and the slot's fencing stream), one of them absent, gets `TRYAGAIN`, and falls back to
/// the plain acquisition at once (the token is then drawn on read).
#[test]
fn a_slot_migration_under_load_keeps_the_slots_locks_working() {
    common::require();
    let c = RedisCluster::spawn();
    // Names whose hash tag is "mig{x": all in one slot (the name's first '}' ends it).
    let names: Vec<String> = (0..3).map(|i| format!("mig{{x}}-{i}")).collect();
    let slot = slot_of(b"mig{x");
    let keys = backend(&c).keys(&names[0]).unwrap();
    assert_eq!(slot_of(keys.lock.as_bytes()), slot);
    let source = c.master_of_slot(slot);
    let target = c.masters().into_iter().find(|&m| m != source).unwrap();
    let unfenced = LockClient::builder(
        RedisBackend::cluster_builder(&c.seed_urls())
            .fencing(false)
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    )
    .lease(Duration::from_secs(30))
    .build()
    .unwrap();
    let unfenced_lock = unfenced.get_lock("mig{x}-unfenced").unwrap();
    let holder = client(&c);
    let renewing = LockClient::builder(backend(&c))
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .unwrap();
    let held_lock = holder.get_lock("mig{x}-held").unwrap();
    let held = held_lock.lock().unwrap();
    let renewed = renewing.get_lock("mig{x}-renewed").unwrap().lock().unwrap();
    let load = Load::new();
    let (moving, migrating, unfenced_holds) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&load.stop);
        for name in &names {
            let (load, c) = (&load, &c);
            s.spawn(move || load.run(c, name));
        }
        load.wait_for_holds(50, Duration::from_secs(20));
        let began = Instant::now();
        let migration = c.begin_migration(slot, target);
        let mut moved = 0;
        while migration.move_some(1) > 0 {
            moved += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        let moving = began.elapsed();
        // Every key of the slot is on the target; the source answers ASK for all.
        assert!(
            moved >= 2,
            "only {moved} keys moved (the held lock and the stream at least)"
        );
        assert!(has_key(
            &c,
            target,
            &backend(&c).keys("mig{x}-held").unwrap().lock
        ));
        let mut unfenced_holds = 0;
        for _ in 0..5 {
            let g = unfenced_lock
                .try_lock()
                .unwrap()
                .expect("an unfenced acquisition follows ASK");
            g.unlock().unwrap();
            unfenced_holds += 1;
        }
        // A fenced acquisition of a free lock follows ASK (the plain SET NX), and so does
        // one that draws its token with it: that script names two keys, the lock's on
        // neither side, and gets TRYAGAIN until the slot is assigned, so it falls back to
        // the plain acquisition at once. Its token is drawn on read, on the target, where
        // both keys now are.
        let eager = LockClient::builder(backend(&c))
            .token_draw(TokenDraw::AtAcquisition)
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        for client in [&holder, &eager] {
            let start = Instant::now();
            let g = client
                .get_lock("mig{x}-free")
                .unwrap()
                .try_lock()
                .unwrap()
                .expect("a free lock, through ASK");
            assert!(g.known_fencing_token().is_none());
            assert!(g.fencing_token().is_ok());
            g.unlock().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{:?}",
                start.elapsed()
            );
        }
        // The held lock is renewed and released through ASK.
        held.extend(Duration::from_secs(30)).unwrap();
        held.unlock().unwrap();
        // The watchdog-renewed lock, moved with the slot, outlives its 900 ms lease while
        // the slot is still half moved: its renewals (batched per master, refused by the
        // source with ASK one by one) reach the target.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            renewed.is_held(),
            "the watchdog's renewals did not reach the target"
        );
        let pttl: i64 = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("PTTL")
            .arg(backend(&c).keys("mig{x}-renewed").unwrap().lock)
            .query::<(i64,)>(&mut c.node(target).connection())
            .unwrap()
            .0;
        assert!(
            pttl > 0,
            "the renewed lock is not on the target (PTTL {pttl})"
        );
        renewed.unlock().unwrap();
        migration.finish();
        let migrating = began.elapsed();
        load.wait_for_holds(50, Duration::from_secs(20));
        (moving, migrating, unfenced_holds)
    });
    let errors = load.errors.load(Ordering::Acquire) + load.lost_releases.load(Ordering::Acquire);
    let asking = common::command_stat(c.node(target), "asking", "calls");
    eprintln!(
        "keys moved in {moving:?}, slot assigned after {migrating:?} (held half moved for 1.5 s); {errors} errors; {unfenced_holds} unfenced holds through ASK; ASKING sent {asking} times; longest time without a fenced hold {:?}",
        load.longest_gap.lock().unwrap()
    );
    assert_eq!(errors, 0);
    assert!(
        asking >= 7,
        "too few requests redirected with ASK: {asking}"
    );
    assert_eq!(c.master_of_slot(slot), target);
    // Everything of the slot is on the target now: nothing was left on the source.
    let left: Vec<Vec<u8>> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut c.node(source).connection())
        .unwrap();
    assert!(left.is_empty());
    assert!(has_key(&c, target, &keys.fencing_stream));
}

#[test]
fn a_master_that_dies_under_load_is_replaced_and_its_replicated_locks_survive() {
    common::require();
    let mut c = RedisCluster::spawn();
    let names: Vec<String> = (0..4).map(|i| format!("fo{{y}}-{i}")).collect();
    let slot = slot_of(b"fo{y");
    let master = c.master_of_slot(slot);
    let holder = client(&c);
    let waited = unique_name("fo{y}-waited");
    let held = holder.get_lock(&waited).unwrap().lock().unwrap();
    // The held lock reached the replica before the master dies.
    common::replicated(c.node(master), 1);
    let load = Load::new();
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(1);
    let mut killed_at = None;
    let (new_master, after) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&load.stop);
        for name in &names {
            let (load, c) = (&load, &c);
            s.spawn(move || load.run(c, name));
        }
        let waiter = s.spawn(|| common::waiter(backend(&c), &waited, started_tx));
        started_rx.recv().unwrap();
        load.wait_for_holds(50, Duration::from_secs(20));
        let c = &c;
        // The threads borrow the cluster, so the master is killed by its pid (reaped
        // by the testkit, which sees it gone).
        let pid = c.node(master).pid();
        killed_at = Some(Instant::now());
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        let new_master = c.wait_for_master_change(master, Duration::from_secs(30));
        let after = load.wait_for_holds(50, Duration::from_secs(30));
        assert!(
            has_key(c, new_master, &backend(c).keys(&waited).unwrap().lock),
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
        (new_master, after)
    });
    c.node_mut(master).kill();
    let gap = *load.longest_gap.lock().unwrap();
    eprintln!(
        "master {master} killed {:?} ago, node {new_master} took over; holds after: {after}; acquisition errors: {}; releases lost with the master: {}; longest time without a hold: {gap:?}",
        killed_at.unwrap().elapsed(),
        load.errors.load(Ordering::Acquire),
        load.lost_releases.load(Ordering::Acquire),
    );
    assert_eq!(load.errors.load(Ordering::Acquire), 0);
    // Availability came back: holds went on after the failover, and the time without
    // one is the failover's (node timeout 2 s, then the election), not the lease's.
    assert!(gap < Duration::from_secs(20), "{gap:?} without a hold");
}

/// The documented failure: the replica is cut off, A takes the lock on the master, the
/// master dies, and the cluster promotes the replica, which never saw A's lock: B takes
/// it too. The history checker sees two holders; fencing keeps A's late write out.
#[test]
fn a_failover_before_replication_grants_the_lock_twice_and_fencing_refuses_the_old_holder() {
    common::require();
    let mut c = RedisCluster::spawn();
    let name = unique_name("lost");
    let a = client(&c);
    for _ in 0..3 {
        a.get_lock(&name).unwrap().lock().unwrap().unlock().unwrap();
    }
    let slot = slot_of(backend(&c).keys(&name).unwrap().lock.as_bytes());
    let master = c.master_of_slot(slot);
    let replica = c.replicas_of(master)[0];
    // The replica has everything so far (the earlier holders' fencing stream), then is
    // cut off.
    common::replicated(c.node(master), 1);
    common::cut_off_replicas(c.node(master), &[c.node(replica)]);
    let holder = common::OldHolder::new(a.get_lock(&name).unwrap().lock().unwrap());
    // The master dies with the grant; the cluster promotes the replica.
    c.node_mut(master).kill();
    c.node(replica).resume();
    let new = c.wait_for_master_change(master, Duration::from_secs(30));
    assert_eq!(new, replica);

    holder.assert_granted_again(&client(&c));
}

#[test]
fn bad_settings_are_refused_at_build() {
    common::require();
    let c = RedisCluster::spawn();
    let invalid = |r: dlm_core::Result<RedisBackend>| match r {
        Err(Error::InvalidArgument(e)) => e,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    // A server without cluster mode.
    let single = RedisServer::spawn();
    let e = invalid(RedisBackend::cluster_builder(&[single.url()]).build());
    assert_eq!(e.argument(), "seeds");
    assert!(e.reason().contains("not in cluster mode"), "{e}");
    // Seeds of two clusters.
    let other = RedisCluster::builder().replicas(0).spawn();
    let e = invalid(
        RedisBackend::cluster_builder(&[c.seed_urls()[0].clone(), other.seed_urls()[0].clone()])
            .build(),
    );
    assert_eq!(e.argument(), "seeds");
    assert!(e.reason().contains("different clusters"), "{e}");
    // No seed, a malformed one. (A Sentinel setting on the cluster's builder does not
    // compile: the builders' compile_fail doc tests.)
    assert_eq!(
        invalid(RedisBackend::cluster_builder::<&str>(&[]).build()).argument(),
        "seeds"
    );
    assert_eq!(
        invalid(RedisBackend::cluster_builder(&["http://x"]).build()).argument(),
        "url"
    );
    // No seed answers: a backend error, not a hang.
    let mut gone = RedisServer::spawn();
    let url = gone.url();
    gone.kill();
    let start = Instant::now();
    match RedisBackend::cluster_builder(&[url])
        .connect_timeout(common::CALM)
        .build()
    {
        Err(Error::Backend(e)) => assert!(e.is_transient(), "{e}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
}
