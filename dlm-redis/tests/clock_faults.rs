//! Real wall-clock jumps on servers (the testkit's `LD_PRELOAD` shim) and what they do
//! to locks and fencing tokens:
//!
//! - a forward jump on a majority of Redlock nodes expires a holder's keys early: a
//!   second client gets the lock (Redlock's documented unsafety, a negative control),
//!   and the fencing tokens, checked by the resource, keep the first holder's late write
//!   out;
//! - a clock that goes back while a fencing stream lives does not reorder tokens (the
//!   stream only grows);
//! - the stated assumption of fencing, broken on purpose (negative controls): a server
//!   whose clock went back and that lost its fencing stream issues tokens lower than
//!   before; a Redlock node whose clock runs ahead of the others, with another node losing
//!   its data, lets a later holder get a lower token. The history checker sees both.
//!
//! These tests restart servers and jump clocks: one at a time.
mod common;

use std::sync::Arc;
use std::time::Duration;

use dlm_core::{FencedResource, FencingToken, Lock, LockClient, StaleToken};
use dlm_redis::{FencedWriteError, RedisBackend, Redlock, fenced_set};
use dlm_testkit::history::History;
use dlm_testkit::redis_server::{RedisServer, RedisServerBuilder};
use dlm_testkit::skew::ClockSkew;
use dlm_testkit::unique_name;

static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// `n` servers, each with a clock of its own.
fn skewed(
    n: usize,
    config: impl Fn(RedisServerBuilder) -> RedisServerBuilder,
) -> Vec<(ClockSkew, RedisServer)> {
    common::require();
    (0..n)
        .map(|_| {
            let skew = ClockSkew::new();
            let server = config(RedisServer::builder().clock_skew(&skew)).spawn();
            (skew, server)
        })
        .collect()
}

fn urls(servers: &[(ClockSkew, RedisServer)]) -> Vec<String> {
    servers.iter().map(|(_, s)| s.url()).collect()
}

fn redlock_client(urls: &[String], lease: Duration) -> LockClient {
    LockClient::builder(Arc::new(
        Redlock::builder(urls)
            .connect_timeout(Duration::from_millis(100))
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    ))
    .lease(lease)
    .build()
    .unwrap()
}

fn single_client(url: &str) -> LockClient {
    LockClient::builder(Arc::new(
        RedisBackend::builder(url)
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    ))
    .lease(Duration::from_secs(30))
    .build()
    .unwrap()
}

#[test]
fn a_forward_jump_on_two_of_three_nodes_grants_the_lock_twice_and_fencing_refuses_the_stale_write()
{
    let _serial = SERIAL.lock();
    let servers = skewed(3, |b| b);
    let urls = urls(&servers);
    let name = unique_name("jump");
    let a = redlock_client(&urls, Duration::from_secs(30));
    let b = redlock_client(&urls, Duration::from_secs(30));
    let history = History::new();
    let ga = a.get_lock(&name).unwrap().lock().unwrap();
    let hold_a = history.begin("A", &ga);
    // Two nodes' clocks jump a minute ahead: A's 30 s keys there are expired.
    servers[0].0.forward(Duration::from_secs(60));
    servers[1].0.forward(Duration::from_secs(60));
    let gb = b
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("B got no quorum after the jump");
    let hold_b = history.begin("B", &gb);
    assert!(
        ga.is_held() && gb.is_held(),
        "the negative control needs two clients that both believe they hold the lock"
    );
    history.end(hold_a, &ga);
    history.end(hold_b, &gb);
    let report = history.check();
    assert!(
        report.has_overlap(),
        "the checker must see the double grant"
    );
    assert!(!report.has_token_disorder(), "{:?}", report.violations);
    let (ta, tb) = (ga.fencing_token().unwrap(), gb.fencing_token().unwrap());
    assert!(tb > ta, "token {tb} after {ta}");
    // A writes late, after B: refused by the resource and by the Redis-side check.
    let resource = FencedResource::new(Vec::new());
    resource.write(tb, |w| w.push("B")).unwrap();
    assert!(matches!(
        resource.write(ta, |w| w.push("A, late")),
        Err(StaleToken { .. })
    ));
    let mut con = servers[2].1.connection();
    let key = format!("resource:{name}");
    fenced_set(&mut con, &key, tb, b"B").unwrap();
    assert!(matches!(
        fenced_set(&mut con, &key, ta, b"A, late"),
        Err(FencedWriteError::Stale(_))
    ));
    ga.into_hold();
    gb.unlock().unwrap();
}

#[test]
fn a_clock_that_goes_back_while_the_stream_lives_does_not_reorder_tokens() {
    let _serial = SERIAL.lock();
    let servers = skewed(1, |b| b);
    let c = single_client(&servers[0].1.url());
    let name = unique_name("back");
    let token = || {
        c.get_lock(&name)
            .unwrap()
            .lock()
            .unwrap()
            .fencing_token()
            .unwrap()
    };
    let before = token();
    servers[0].0.back(Duration::from_secs(3600));
    let after: Vec<FencingToken> = (0..5).map(|_| token()).collect();
    assert!(before < after[0], "token {} after {before}", after[0]);
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");
}

#[test]
fn tokens_go_back_when_a_server_whose_clock_went_back_loses_its_stream() {
    // The stated assumption of single-instance fencing, broken: the server's clock goes
    // back an hour, and the server restarts without persistence (the stream is gone).
    // The new stream is seeded from the clock, an hour behind: tokens go back, and the
    // checker flags it.
    let _serial = SERIAL.lock();
    let mut servers = skewed(1, |b| b);
    let name = unique_name("assumption");
    let history = History::new();
    let c = single_client(&servers[0].1.url());
    let g1 = c.get_lock(&name).unwrap().lock().unwrap();
    let hold = history.begin("first holder", &g1);
    history.end(hold, &g1);
    let t1 = g1.fencing_token().unwrap();
    g1.unlock().unwrap();
    servers[0].0.back(Duration::from_secs(3600));
    servers[0].1.restart();
    let c = single_client(&servers[0].1.url());
    let g2 = c.get_lock(&name).unwrap().lock().unwrap();
    let hold = history.begin("second holder", &g2);
    history.end(hold, &g2);
    let t2 = g2.fencing_token().unwrap();
    assert!(t2 < t1, "tokens did not go back: {t2} after {t1}");
    let report = history.check();
    assert!(report.has_token_disorder(), "the checker must see it");
    // What a resource then does: it refuses the newer holder (it looks older): safe for
    // the data, but the new holder cannot write until its tokens pass the old ones.
    let resource = FencedResource::new(());
    resource.write(t1, |_| ()).unwrap();
    assert!(resource.write(t2, |_| ()).is_err());
    g2.unlock().unwrap();
}

#[test]
fn redlock_tokens_go_back_when_a_node_clock_runs_ahead_and_another_node_loses_its_data() {
    // The stated assumption of Redlock fencing, broken: node 0's clock is an hour ahead of
    // the others. A commits on {0, 1} (node 2 down): its token comes from node 0's clock.
    // Node 1 restarts empty, node 0 goes down; B's quorum is {1, 2}, whose clocks are an
    // hour behind A's token: B gets a lower one. With the clocks in agreement the same
    // sequence keeps tokens in order (tests/fencing.rs).
    let _serial = SERIAL.lock();
    let mut servers = skewed(3, |b| b);
    servers[0].0.forward(Duration::from_secs(3600));
    let urls = urls(&servers);
    let name = unique_name("ahead");
    let lease = Duration::from_millis(300);
    let history = History::new();
    servers[2].1.kill();
    let a = redlock_client(&urls, lease);
    let ga = a.get_lock(&name).unwrap().lock().unwrap();
    let hold = history.begin("A", &ga);
    history.end(hold, &ga);
    let ta = ga.fencing_token().unwrap();
    ga.into_hold(); // its lease runs out
    servers[2].1.restart();
    servers[1].1.kill();
    servers[1].1.restart();
    servers[0].1.kill();
    let b = redlock_client(&urls, lease);
    let gb = b.get_lock(&name).unwrap().lock().unwrap();
    let hold = history.begin("B", &gb);
    history.end(hold, &gb);
    let tb = gb.fencing_token().unwrap();
    assert!(tb < ta, "tokens did not go back: {tb} after {ta}");
    assert!(
        history.check().has_token_disorder(),
        "the checker must see it"
    );
    gb.unlock().unwrap();
}
