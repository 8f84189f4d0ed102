//! Fencing tokens against real servers: durability across restarts (and the documented
//! limit without it), Redlock's two-round tokens under a lost minority and under an early
//! expiry that lets two clients believe they hold the lock, and the Redis-side check.
mod common;

use dlm_core::{FencedResource, FencingToken, Lock, LockClient, StaleToken};
use dlm_redis::{FencedWriteError, RedisBackend, Redlock, fenced_get, fenced_set};
use dlm_testkit::history::History;
use dlm_testkit::redis_server::{RedisNodes, RedisServer};
use dlm_testkit::unique_name;

/// These tests kill and restart servers: one at a time.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn single(url: &str) -> LockClient {
    LockClient::new(
        RedisBackend::builder(url)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    )
}

fn redlock(urls: &[String]) -> LockClient {
    LockClient::new(
        Redlock::builder(urls)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    )
}

fn token(client: &LockClient, name: &str) -> u64 {
    let guard = client.get_lock(name).unwrap().lock().unwrap();
    guard.fencing_token().expect("fencing is on").get()
}

#[test]
fn single_instance_tokens_survive_a_restart_with_aof_always() {
    let _serial = SERIAL.lock();
    common::Single::new();
    let mut server = RedisServer::builder().appendonly(true).spawn();
    let name = unique_name("aof");
    let c = single(&server.url());
    assert_eq!([token(&c, &name), token(&c, &name)], [1, 2]);
    server.kill();
    server.restart();
    let c = single(&server.url());
    assert_eq!(
        token(&c, &name),
        3,
        "the counter did not survive the restart"
    );
}

#[test]
fn without_persistence_a_restart_reissues_old_tokens_and_the_resource_refuses_them() {
    // The documented limit: the counter is lost with the data. Fencing then fails safe
    // (the resource refuses the reissued, older-looking tokens) rather than unsafe.
    let _serial = SERIAL.lock();
    let mut fixture = common::Single::new();
    let name = unique_name("no-aof");
    let resource = FencedResource::new(0);
    let c = single(&fixture.server.url());
    for _ in 0..2 {
        let t = FencingToken::new(token(&c, &name));
        resource.write(t, |v| *v += 1).unwrap();
    }
    fixture.server.kill();
    fixture.server.restart();
    let c = single(&fixture.server.url());
    let reissued = FencingToken::new(token(&c, &name));
    assert_eq!(
        reissued.get(),
        1,
        "tokens restarted from 1 after losing the data"
    );
    assert_eq!(
        resource.write(reissued, |v| *v += 1),
        Err(StaleToken {
            presented: reissued,
            highest: FencingToken::new(2)
        })
    );
}

#[test]
fn redlock_tokens_keep_increasing_when_a_minority_loses_its_counters() {
    let _serial = SERIAL.lock();
    let mut cluster = common::Cluster::new(3);
    let urls = cluster.nodes.urls();
    let name = unique_name("minority");
    let c = redlock(&urls);
    let mut last = 0;
    for round in 0..6 {
        let t = token(&c, &name);
        assert!(t > last, "round {round}: token {t} after {last}");
        last = t;
        // Each round one node (in turn) restarts WITHOUT persistence: its counter is gone.
        let node = cluster.nodes.get_mut(round % 3);
        node.kill();
        node.restart();
    }
}

#[test]
fn redlock_tokens_survive_restarting_every_node_with_aof_always() {
    let _serial = SERIAL.lock();
    common::Single::new();
    let mut nodes = RedisNodes::spawn_with(3, |b| b.appendonly(true));
    let urls = nodes.urls();
    let name = unique_name("all-aof");
    let before = token(&redlock(&urls), &name);
    for i in 0..3 {
        nodes.get_mut(i).kill();
        nodes.get_mut(i).restart();
    }
    let after = token(&redlock(&urls), &name);
    assert!(after > before, "token {after} after {before}");
}

#[test]
fn an_early_expiry_gives_two_holders_but_the_resource_accepts_only_the_newer() {
    // A stand-in for a clock jump on two of three nodes: A's keys there expire early.
    // Redlock then grants the lock to B while A still believes it holds it (the
    // documented failure mode: this is the negative control), and only the fencing
    // tokens, checked by the resource, keep A's late write out.
    let _serial = SERIAL.lock();
    let cluster = common::Cluster::new(3);
    let urls = cluster.nodes.urls();
    let name = unique_name("jump");
    let a = redlock(&urls).get_lock(&name).unwrap();
    let b = redlock(&urls).get_lock(&name).unwrap();
    let history = History::new();
    let ga = a.lock().unwrap();
    let hold_a = history.begin("A", &ga);
    for i in 0..2 {
        cluster.nodes.get(i).expire_now(&format!("dlm:{{{name}}}"));
    }
    let gb = b.try_lock().unwrap().expect("B got no quorum");
    let hold_b = history.begin("B", &gb);
    assert!(
        ga.is_held() && gb.is_held(),
        "the negative control needs two clients that both believe they hold the lock"
    );
    history.end(hold_a, &ga);
    history.end(hold_b, &gb);
    // The checker flags the double grant; the tokens are still in order.
    let report = history.check();
    assert!(report.has_overlap(), "{:?}", report.violations);
    assert!(!report.has_token_disorder(), "{:?}", report.violations);
    let (ta, tb) = (ga.fencing_token().unwrap(), gb.fencing_token().unwrap());
    assert!(tb > ta, "token {tb} after {ta}");
    let resource = FencedResource::new(Vec::new());
    resource.write(ta, |w| w.push("A")).unwrap(); // A writes first: fine, B has not
    resource.write(tb, |w| w.push("B")).unwrap();
    assert!(resource.write(ta, |w| w.push("A late")).is_err());
    assert_eq!(resource.read(|w| w.clone()), ["A", "B"]);
    // The same through the Redis-side check.
    let mut con = cluster.nodes.get(2).connection();
    let key = format!("resource:{name}");
    fenced_set(&mut con, &key, tb, b"B").unwrap();
    assert!(matches!(
        fenced_set(&mut con, &key, ta, b"A late"),
        Err(FencedWriteError::Stale(StaleToken { .. }))
    ));
    assert_eq!(
        fenced_get(&mut con, &key).unwrap(),
        Some((b"B".to_vec(), tb))
    );
}

#[test]
fn fenced_set_accepts_newer_or_equal_tokens_and_refuses_older_ones() {
    let fixture = common::Single::new();
    let mut con = fixture.server.connection();
    let key = unique_name("value");
    let t = FencingToken::new;
    assert_eq!(fenced_get(&mut con, &key).unwrap(), None);
    fenced_set(&mut con, &key, t(5), b"five").unwrap();
    fenced_set(&mut con, &key, t(5), b"five again").unwrap();
    match fenced_set(&mut con, &key, t(4), b"four") {
        Err(FencedWriteError::Stale(e)) => {
            assert_eq!((e.presented, e.highest), (t(4), t(5)));
        }
        other => panic!("expected a stale token, got {other:?}"),
    }
    fenced_set(&mut con, &key, t(9), b"nine").unwrap();
    assert_eq!(
        fenced_get(&mut con, &key).unwrap(),
        Some((b"nine".to_vec(), t(9)))
    );
}

#[test]
fn fencing_can_be_switched_off() {
    let fixture = common::Single::new();
    let c = LockClient::new(
        RedisBackend::builder(&fixture.server.url())
            .fencing(false)
            .build()
            .unwrap(),
    );
    let g = c.get_lock("plain").unwrap().lock().unwrap();
    assert_eq!(g.fencing_token(), None);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("dlm:{plain}:fence")
        .query(&mut fixture.server.connection())
        .unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn a_commit_round_without_a_quorum_releases_everywhere() {
    // On two of three nodes the user may not load scripts, and only the acquire and
    // release scripts are preloaded (by the admin): round 1 succeeds everywhere, round 2
    // (the commit script) fails with NOSCRIPT then NOPERM on those two, so the
    // acquisition must fail and leave no key behind on any node.
    let _serial = SERIAL.lock();
    common::Single::new();
    let open = RedisServer::spawn();
    let restricted: Vec<RedisServer> = (0..2)
        .map(|_| {
            let server = RedisServer::builder()
                .acl_user("app", "on >app-pw ~* &* +@all -script|load")
                .credentials("app", "app-pw")
                .spawn();
            for script in [
                include_str!("../src/lua/acquire.lua"),
                include_str!("../src/lua/release.lua"),
            ] {
                let _: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query(&mut server.connection())
                    .unwrap();
            }
            server
        })
        .collect();
    let urls = [open.url(), restricted[0].url(), restricted[1].url()];
    let name = unique_name("commit");
    let c = LockClient::new(
        Redlock::builder(&urls)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .release_hints(false)
            .build()
            .unwrap(),
    );
    let e = c.get_lock(&name).unwrap().try_lock().unwrap_err();
    let kind = e.backend().map(|b| b.kind());
    assert!(
        matches!(
            kind,
            Some(dlm_core::BackendErrorKind::NoQuorum | dlm_core::BackendErrorKind::Permission)
        ),
        "{e}"
    );
    for server in [&open, &restricted[0], &restricted[1]] {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("dlm:{{{name}}}"))
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(exists, 0, "a key was left on {}", server.url());
    }
    // Round 2 did run: it committed on the open node and was refused on the others.
    let counter = |server: &RedisServer| -> Option<u64> {
        redis::cmd("GET")
            .arg(format!("dlm:{{{name}}}:fence"))
            .query(&mut server.connection())
            .unwrap()
    };
    assert_eq!(counter(&open), Some(1));
    assert_eq!(counter(&restricted[0]), None);
    assert_eq!(counter(&restricted[1]), None);
}
