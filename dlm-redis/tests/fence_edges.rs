//! The edges of stream-ID tokens (`ms << 20 | seq`):
//!
//! - a stream whose last ID is ahead of the server's clock hands out `ms-(seq+1)`; a draw
//!   that would pass sequence 2^20 - 1 carries to `(ms+1)-0` in the same step, so no
//!   draw ever fails for it (an earlier version refused it with a `Protocol` error, and
//!   every fenced acquisition of every name of the slot failed until the server's clock
//!   passed that millisecond): single server and Redlock, with seeded streams;
//! - on Redlock, a node whose stream is far ahead of the others (its clock an hour ahead)
//!   is left out of the tokens: the others' streams stay near their clocks, tokens keep
//!   increasing, and the node is logged once.
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::{RedisNodes, RedisServer};
use dlm_testkit::unique_name;

const SEQ_LIMIT: u64 = 1 << 20;
const HOUR_MS: u64 = 3_600_000;

/// The server's clock, in ms (`TIME`).
fn server_ms(server: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    s * 1000 + us / 1000
}

/// Sets the stream `key` on `server` to the last ID `ms-seq` (as a fence would leave it).
fn seed(server: &RedisServer, key: &str, ms: u64, seq: u64) {
    let mut con = server.connection();
    let _: () = redis::cmd("DEL").arg(key).query(&mut con).unwrap();
    let _: String = redis::cmd("XADD")
        .arg(key)
        .arg("MAXLEN")
        .arg(0)
        .arg(format!("{ms}-{seq}"))
        .arg("f")
        .arg("1")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(60_000)
        .query(&mut con)
        .unwrap();
}

fn read_token(client: &LockClient, name: &str) -> u64 {
    let guard = client.get_lock(name).unwrap().lock().unwrap();
    let token = guard.fencing_token().unwrap().get();
    guard.unlock().unwrap();
    token
}

fn split(token: u64) -> (u64, u64) {
    (token >> 20, token & (SEQ_LIMIT - 1))
}

#[test]
fn a_draw_past_the_sequence_limit_carries_to_the_next_millisecond() {
    let fixture = common::Single::new();
    let server = &fixture.server;
    let backend = RedisBackend::builder(&server.url())
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let name = unique_name("carry");
    let stream = backend.keys(&name).unwrap().fencing_stream;
    let client = LockClient::new(backend);
    // A stream an hour ahead of the server's clock, three IDs short of the limit.
    let ahead = server_ms(server) + HOUR_MS;
    seed(server, &stream, ahead, SEQ_LIMIT - 3);
    let tokens: Vec<u64> = (0..6).map(|_| read_token(&client, &name)).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let parts: Vec<(u64, u64)> = tokens.iter().map(|t| split(*t)).collect();
    assert_eq!(
        parts,
        [
            (ahead, SEQ_LIMIT - 2),
            (ahead, SEQ_LIMIT - 1),
            (ahead + 1, 0),
            (ahead + 1, 1),
            (ahead + 1, 2),
            (ahead + 1, 3),
        ]
    );
    assert_eq!(
        common::last_fence_token(server, &stream),
        *tokens.last().unwrap()
    );
}

#[test]
fn redlock_draws_past_the_sequence_limit_carry_too() {
    let cluster = common::Cluster::new(3);
    let urls = cluster.nodes.urls();
    let name = unique_name("carry");
    let stream = Redlock::new(&urls)
        .unwrap()
        .keys(&name)
        .unwrap()
        .fencing_stream;
    let ahead = server_ms(cluster.nodes.get(0)) + HOUR_MS;
    for server in cluster.nodes.iter() {
        seed(server, &stream, ahead, SEQ_LIMIT - 3);
    }
    // A new client each time (another process): no proposal, every node draws.
    let mut tokens = Vec::new();
    for _ in 0..4 {
        tokens.push(read_token(&LockClient::new(cluster.redlock()), &name));
    }
    // And one client that proposes one above its last token, across the limit too.
    let client = LockClient::new(cluster.redlock());
    for _ in 0..4 {
        tokens.push(read_token(&client, &name));
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let last = split(*tokens.last().unwrap());
    assert!(
        last.0 > ahead && last.0 < ahead + 1_000 && last.1 < 64,
        "the tokens carried to the next milliseconds: {tokens:?}"
    );
    for server in cluster.nodes.iter() {
        let (_, seq) = split(common::last_fence_token(server, &stream));
        assert!(seq < SEQ_LIMIT, "a stream past the limit");
    }
}

/// Node 0's stream is an hour ahead of the others' (as if its clock were): its draws are
/// left out of the token, so the other nodes' streams stay near their clocks.
fn one_node_an_hour_ahead(nodes: &RedisNodes, name: &str) -> u64 {
    let stream = Redlock::new(&nodes.urls())
        .unwrap()
        .keys(name)
        .unwrap()
        .fencing_stream;
    let ahead = server_ms(nodes.get(0)) + HOUR_MS;
    seed(nodes.get(0), &stream, ahead, 0);
    ahead
}

#[test]
fn a_node_far_ahead_does_not_raise_the_other_streams_and_is_logged_once() {
    let mark = dlm_testkit::logs::capture();
    let cluster = common::Cluster::new(3);
    let name = unique_name("ahead");
    let ahead = one_node_an_hour_ahead(&cluster.nodes, &name);
    let stream = Redlock::new(&cluster.nodes.urls())
        .unwrap()
        .keys(&name)
        .unwrap()
        .fencing_stream;
    let client = LockClient::new(cluster.redlock());
    let mut tokens = Vec::new();
    for i in 0..8 {
        // Half from new clients (no proposal: every node draws, a commit round follows),
        // half from one client (its proposal taken by the two nodes behind).
        let token = if i % 2 == 0 {
            read_token(&LockClient::new(cluster.redlock()), &name)
        } else {
            read_token(&client, &name)
        };
        tokens.push(token);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    for i in [1, 2] {
        let server = cluster.nodes.get(i);
        let (ms, _) = split(common::last_fence_token(server, &stream));
        let now = server_ms(server);
        assert!(
            ms <= now + 1_000,
            "node {i}'s stream was raised to {} ms ahead of its clock",
            ms - now
        );
    }
    let (ms, _) = split(common::last_fence_token(cluster.nodes.get(0), &stream));
    assert!(ms >= ahead, "node 0's own stream only grows");
    assert!(
        split(*tokens.last().unwrap()).0 < ahead - HOUR_MS / 2,
        "the tokens follow the quorum's clocks, not node 0's: {tokens:?}"
    );
    // One warning per node and backend (each new client above is a new backend: it
    // warns once too), naming the node.
    let port = format!(":{}", cluster.nodes.get(0).port());
    let warnings: Vec<String> = mark
        .lines()
        .into_iter()
        .filter(|l| l.contains("its fencing stream is") && l.contains(&port))
        .collect();
    assert_eq!(warnings.len(), 5, "{warnings:#?}");
    assert!(
        !mark
            .lines()
            .iter()
            .any(|l| l.contains("its fencing stream is")
                && (l.contains(&format!(":{}", cluster.nodes.get(1).port()))
                    || l.contains(&format!(":{}", cluster.nodes.get(2).port())))),
        "only node 0 is ahead"
    );
}

#[test]
fn with_one_node_far_ahead_tokens_still_pass_every_earlier_one() {
    // The case the exclusion must not break: A's token was raised by node 0 (a quorum of
    // exactly {0, 1} answered, so node 0 could not be left out), then B's quorum is
    // {1, 2}. B's token is above A's because node 1, in both quorums, holds A's token:
    // quorum intersection, not node 0's clock.
    let mut cluster = common::Cluster::new(3);
    let name = unique_name("ahead-intersection");
    let ahead = one_node_an_hour_ahead(&cluster.nodes, &name);
    let lease = Duration::from_millis(300);
    let urls = cluster.nodes.urls();
    let client = || {
        LockClient::builder(std::sync::Arc::new(
            Redlock::builder(&urls)
                .io_timeout(common::CALM)
                .connect_timeout(Duration::from_millis(100))
                .build()
                .unwrap(),
        ))
        .lease(lease)
        .build()
        .unwrap()
    };
    cluster.nodes.get_mut(2).kill();
    let a = client();
    let ga = a.get_lock(&name).unwrap().lock().unwrap();
    let ta = ga.fencing_token().unwrap().get();
    assert!(split(ta).0 >= ahead, "with two answers, node 0 counts");
    ga.unlock().unwrap();
    cluster.nodes.get_mut(2).restart();
    cluster.nodes.get_mut(0).kill();
    let b = client();
    let gb = b.get_lock(&name).unwrap().lock().unwrap();
    let tb = gb.fencing_token().unwrap().get();
    assert!(tb > ta, "token {tb} after {ta}");
    gb.unlock().unwrap();
}
