//! After warm-up, an uncontended lock+unlock costs exactly two round trips per node, with
//! fencing on or off, when the token is not read, and also when it is read every cycle
//! (the token is then drawn with the acquisition, in the same script); a token drawn on
//! read (`TokenDraw::WhenRead`) costs one more (Redlock too, when the nodes take the
//! proposal); no connection is opened: checked against the servers' own counters
//! (`INFO stats`, `INFO commandstats`).
mod common;

use std::collections::BTreeMap;

use dlm_core::{Lock, LockClient, TokenDraw};
use dlm_testkit::redis_server::RedisServer;

const CYCLES: u64 = 100;

/// Calls per command since the last `CONFIG RESETSTAT`, without the admin's own
/// commands.
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    parse_commandstats(&server.info("commandstats"))
}

fn connections_received(server: &RedisServer) -> u64 {
    server
        .info("stats")
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("INFO stats has total_connections_received")
        .trim()
        .parse()
        .unwrap()
}

fn reset(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
}

fn stat(admin: &mut redis::Connection, field: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("INFO stats has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// What an uncontended cycle may cost on each node.
#[derive(Clone, Copy, PartialEq)]
enum Fence {
    /// The token is not read (or fencing is off): a plain `SET NX PX GET`, then the
    /// release script.
    Unread,
    /// The token is read every cycle, and so drawn with the acquisition: the fenced
    /// acquire script (`SET`, `XADD`, `PEXPIRE`: a draw on one server, the proposal taken
    /// on Redlock), the release script.
    Read,
    /// The token is read, drawn on read (`TokenDraw::WhenRead`): the plain `SET`, the
    /// fence script (`GET`, `XADD`, `PEXPIRE`), the release script.
    ReadWhenRead,
}

/// Runs warm-up cycles, then `CYCLES` cycles on fresh names, and checks each server's
/// counters: round trips (`total_reads_processed`: one read event per request the server
/// receives, pipelined commands included) and every command, those run inside scripts
/// included (`INFO commandstats`), each within `slack` of the expected count per node.
/// Any further request per cycle (a PING, an EXISTS, a retry: `CYCLES` more) or a new
/// connection would show. One server: `slack` 0, exact. Redlock: a round returns once a
/// quorum decided it, and a node that answers later is released in the background (or,
/// for a token, the commit round follows): on a busy machine a few cycles cost a request
/// more or less on one node, so `slack` is 5% of the cycles there. The same holds for new
/// connections: while a late answer is still being read, the next cycle takes another
/// pooled connection to that node, which may have to be opened (seen once under
/// `scripts/test --under-load`).
fn check(client: &LockClient, servers: &[&RedisServer], fencing: Fence, slack: u64) {
    let read = fencing != Fence::Unread;
    // The warm-up takes the names of the measured cycles (with fencing, their slots'
    // streams exist afterwards, as in a system that has run for a while), twice: a token
    // read in the first pass is drawn with the acquisition in the second, so every script
    // the measured cycles run is in the servers' script cache (scripts are loaded on
    // first use).
    for i in (0..CYCLES).chain(0..CYCLES) {
        let lock = client.get_lock(&format!("fresh-{i}")).unwrap();
        let guard = lock.try_lock().unwrap().unwrap();
        if read {
            guard.fencing_token().unwrap();
        }
        guard.unlock().unwrap();
    }
    // The admin connections are opened before the reset and reused after it.
    let mut admins: Vec<redis::Connection> = servers.iter().map(|s| s.connection()).collect();
    let mut reads_before = Vec::new();
    for admin in &mut admins {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(admin).unwrap();
        reads_before.push(stat(admin, "total_reads_processed"));
    }
    for i in 0..CYCLES {
        let lock = client.get_lock(&format!("fresh-{i}")).unwrap();
        let guard = lock.try_lock().unwrap().expect("uncontended");
        if read {
            guard.fencing_token().unwrap();
        }
        guard.unlock().unwrap();
    }
    // Nobody waited, so no release publishes.
    let (round_trips, commands): (u64, &[(&str, u64)]) = match fencing {
        Fence::Unread => (2, &[("set", 1), ("evalsha", 1), ("get", 1), ("del", 1)]),
        // acquire: SET, XADD, PEXPIRE; release: GET, DEL.
        Fence::Read => (
            2,
            &[
                ("set", 1),
                ("get", 1),
                ("xadd", 1),
                ("pexpire", 1),
                ("evalsha", 2),
                ("del", 1),
            ],
        ),
        // fence: GET, XADD, PEXPIRE; release: GET, DEL.
        Fence::ReadWhenRead => (
            3,
            &[
                ("set", 1),
                ("get", 2),
                ("xadd", 1),
                ("pexpire", 1),
                ("evalsha", 2),
                ("del", 1),
            ],
        ),
    };
    for (n, admin) in admins.iter_mut().enumerate() {
        // This INFO's own request is one read too.
        let reads = stat(admin, "total_reads_processed") - reads_before[n] - 1;
        assert!(
            reads.abs_diff(round_trips * CYCLES) <= slack,
            "node {n}: not {round_trips} round trips per cycle: {reads} in {CYCLES} cycles"
        );
        let stats: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
        let calls = parse_commandstats(&stats);
        let expected: BTreeMap<String, u64> = commands
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v * CYCLES))
            .collect();
        // Every command either side names, within `slack` (a PING of the pool's idle
        // check, say, on a busy machine); exact for one server.
        assert!(
            calls.keys().chain(expected.keys()).all(|k| {
                let (got, want) = (
                    calls.get(k).copied().unwrap_or(0),
                    expected.get(k).copied().unwrap_or(0),
                );
                got.abs_diff(want) <= slack
            }),
            "node {n}: unexpected commands: {calls:?}, expected {expected:?}"
        );
        let opened = stat(admin, "total_connections_received");
        assert!(
            opened <= slack,
            "node {n}: {opened} new connections during {CYCLES} cycles"
        );
    }
}

fn parse_commandstats(stats: &str) -> BTreeMap<String, u64> {
    stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

#[test]
fn single_instance_costs_two_requests_and_no_connection_per_cycle() {
    let fixture = common::Single::new();
    let client = LockClient::builder(dlm_testkit::Fixture::backend(&fixture))
        .build()
        .unwrap();
    check(&client, &[&fixture.server], Fence::Unread, 0);
}

#[test]
fn single_instance_reading_the_token_every_cycle_costs_two_requests() {
    let fixture = common::Single::new();
    let client = LockClient::builder(dlm_testkit::Fixture::backend(&fixture))
        .build()
        .unwrap();
    check(&client, &[&fixture.server], Fence::Read, 0);
}

#[test]
fn single_instance_drawing_the_token_when_read_costs_one_more_request() {
    let fixture = common::Single::new();
    let client = LockClient::builder(dlm_testkit::Fixture::backend(&fixture))
        .token_draw(TokenDraw::WhenRead)
        .build()
        .unwrap();
    check(&client, &[&fixture.server], Fence::ReadWhenRead, 0);
}

#[test]
fn redlock_costs_two_requests_per_node_and_no_connection_per_cycle() {
    for fencing in [false, true] {
        let cluster = common::Cluster::new(3);
        let redlock = dlm_redis::Redlock::builder(&cluster.nodes.urls())
            .fencing(fencing)
            .build()
            .unwrap();
        let client = LockClient::new(redlock);
        let servers: Vec<&RedisServer> = (0..3).map(|i| cluster.nodes.get(i)).collect();
        check(&client, &servers, Fence::Unread, CYCLES / 20);
    }
}

#[test]
fn redlock_reading_the_token_every_cycle_costs_two_requests_per_node() {
    // The acquisition round carries the proposal (one above the last token this backend
    // saw), which is above the stream of each name's slot: acquisition and token in one
    // round, no commit. (The first fence in a slot whose stream does not exist yet has
    // the commit round: a proposal never creates a stream.)
    let cluster = common::Cluster::new(3);
    let client = LockClient::new(cluster.redlock());
    let servers: Vec<&RedisServer> = (0..3).map(|i| cluster.nodes.get(i)).collect();
    check(&client, &servers, Fence::Read, CYCLES / 20);
}

/// A proposal never creates a fencing stream, so the first hold of a hash slot commits
/// its token in a round of its own; once the slot's stream exists, the proposal is taken
/// and the token costs nothing more (what `fenced-new-names` and `-warm` measure).
#[test]
fn redlock_commits_a_token_in_a_round_of_its_own_only_on_a_slots_first_hold() {
    let cluster = common::Cluster::new(3);
    let redlock = cluster.redlock();
    // Two names of one slot (the part before the first `}` is the hash tag).
    let (first, second) = ("slot-probe}1", "slot-probe}2");
    let stream = redlock.keys(first).unwrap().fencing_stream;
    assert_eq!(stream, redlock.keys(second).unwrap().fencing_stream);
    let client = LockClient::new(redlock);
    let exists = |server: &RedisServer| -> bool {
        redis::cmd("EXISTS")
            .arg(&stream)
            .query(&mut server.connection())
            .unwrap()
    };
    // Another slot first: the client has a proposal, predicts a read, and every script
    // is loaded.
    for _ in 0..2 {
        let guard = client.get_lock("elsewhere").unwrap().lock().unwrap();
        guard.fencing_token().unwrap();
        guard.unlock().unwrap();
    }
    assert!(
        cluster.nodes.iter().all(|s| !exists(s)),
        "the probe's slot has no stream yet"
    );
    let scripts = |name: &str| -> u64 {
        for server in cluster.nodes.iter() {
            reset(server);
        }
        let guard = client.get_lock(name).unwrap().lock().unwrap();
        guard.fencing_token().unwrap();
        guard.unlock().unwrap();
        cluster
            .nodes
            .iter()
            .map(|s| command_calls(s).get("evalsha").copied().unwrap_or(0))
            .sum()
    };
    // Acquisition and release on each of three nodes, and a commit on at least a quorum.
    let on_first = scripts(first);
    assert!(
        on_first >= 6 + 2,
        "the first hold of the slot: {on_first} scripts"
    );
    assert!(
        cluster.nodes.iter().all(exists),
        "the slot's stream exists now"
    );
    // At most one more: a node that answered late, released in the background.
    let on_second = scripts(second);
    eprintln!("scripts run on three nodes: first hold of the slot {on_first}, second {on_second}");
    assert!(
        on_second <= 6 + 1,
        "a later hold of the slot: {on_second} scripts"
    );
}

#[test]
fn redlock_drawing_the_token_when_read_costs_one_more_request_per_node() {
    let cluster = common::Cluster::new(3);
    let client = LockClient::builder(cluster.redlock())
        .token_draw(TokenDraw::WhenRead)
        .build()
        .unwrap();
    let servers: Vec<&RedisServer> = (0..3).map(|i| cluster.nodes.get(i)).collect();
    check(&client, &servers, Fence::ReadWhenRead, CYCLES / 20);
}

#[test]
fn a_release_publishes_only_when_a_waiter_marked_the_lock() {
    let fixture = common::Single::new();
    let server = &fixture.server;
    let (a, b) = (
        LockClient::builder(dlm_testkit::Fixture::backend(&fixture))
            .build()
            .unwrap(),
        LockClient::builder(dlm_testkit::Fixture::backend(&fixture))
            .build()
            .unwrap(),
    );
    let name = "marked";
    let mut admin = server.connection();
    let publishes = |admin: &mut redis::Connection| {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
        parse_commandstats(&stats)
            .get("publish")
            .copied()
            .unwrap_or(0)
    };
    let guard = a.get_lock(name).unwrap().lock().unwrap();
    guard.unlock().unwrap();
    assert_eq!(publishes(&mut admin), 0, "nobody waited");
    // A waiter in another process (its own backend): its failed attempt marks the key,
    // and the holder's release then announces itself.
    let guard = a.get_lock(name).unwrap().lock().unwrap();
    assert!(
        b.get_lock(name)
            .unwrap()
            .try_lock_timeout(std::time::Duration::from_millis(1))
            .unwrap()
            .is_none()
    );
    let value: String = redis::cmd("GET")
        .arg("dlm:{marked}")
        .query(&mut admin)
        .unwrap();
    assert!(value.ends_with('~'), "the waiter marked the key: {value:?}");
    assert!(
        guard.is_held(),
        "the mark does not take the lock from its holder"
    );
    guard.unlock().unwrap();
    assert_eq!(publishes(&mut admin), 1, "the release of a marked lock");
}

#[test]
fn a_release_hands_the_lock_to_a_waiting_thread_of_its_process_in_one_request() {
    let fixture = common::Single::new();
    let server = &fixture.server;
    let backend = std::sync::Arc::new(
        dlm_redis::RedisBackend::builder(&server.url())
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let name = "handed";
    let (holder, waiter) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    let held = holder.get_lock(name).unwrap().lock().unwrap();
    let first = held.fencing_token().unwrap();
    let lock = waiter.get_lock(name).unwrap();
    let (taken_tx, taken) = crossbeam_channel::bounded(1);
    let (read_tx, read) = crossbeam_channel::bounded::<()>(1);
    let waiting = std::thread::spawn(move || {
        let g = lock.lock().unwrap();
        taken_tx.send(()).unwrap();
        read.recv().unwrap();
        let token = g.fencing_token().unwrap();
        g.unlock().unwrap();
        token
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while backend.handover_offers(name) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never slept"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    reset(server);
    held.unlock().unwrap();
    taken
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the waiter holds the lock");
    let calls = command_calls(server);
    // The script's first use here loads it: NOSCRIPT, SCRIPT LOAD, EVALSHA again.
    let loads = calls.get("script|load").copied().unwrap_or(0);
    assert_eq!(
        calls.get("evalsha").copied(),
        Some(1 + loads),
        "the release, and no request of the waiter: {calls:?}"
    );
    assert_eq!(
        calls.get("del"),
        None,
        "the lock never went free: {calls:?}"
    );
    assert_eq!(calls.get("publish"), None, "nobody to wake: {calls:?}");
    let mut admin = server.connection();
    let (value, pttl): (String, i64) = redis::pipe()
        .cmd("GET")
        .arg("dlm:{handed}")
        .cmd("PTTL")
        .arg("dlm:{handed}")
        .query(&mut admin)
        .unwrap();
    assert!(
        value.ends_with('~'),
        "the waiter's mark stays with the key: {value:?}"
    );
    assert!(
        pttl > 0 && pttl <= dlm_core::DEFAULT_WATCHDOG_TIMEOUT.as_millis() as i64,
        "the successor's key has its own lease: {pttl} ms"
    );
    read_tx.send(()).unwrap();
    let second = waiting.join().unwrap();
    assert!(second > first, "token {second} after {first}");
    let exists: bool = redis::cmd("EXISTS")
        .arg("dlm:{handed}")
        .query(&mut admin)
        .unwrap();
    assert!(!exists, "released");
}

/// Redlock never hands a lock over in its release (a hand-over on one node would not be
/// one on a quorum): with a thread of the same process asleep on the lock, the release
/// deletes the key on every node and announces it, and the waiter takes the lock with an
/// acquisition of its own.
#[test]
fn a_redlock_release_lets_the_lock_go_free_even_with_a_waiter_of_its_process() {
    let cluster = common::Cluster::new(3);
    let backend = std::sync::Arc::new(
        dlm_redis::Redlock::builder(&cluster.nodes.urls())
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let name = "not-handed";
    let key = "dlm:{not-handed}";
    let (holder, waiter) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    let held = holder.get_lock(name).unwrap().lock().unwrap();
    let lock = waiter.get_lock(name).unwrap();
    let (taken_tx, taken) = crossbeam_channel::bounded(1);
    let (done_tx, done) = crossbeam_channel::bounded::<()>(1);
    let waiting = std::thread::spawn(move || {
        let g = lock.lock().unwrap();
        taken_tx.send(()).unwrap();
        done.recv().unwrap();
        g.unlock().unwrap();
    });
    // The waiter has tried and marked the key on every node: it waits.
    common::wait_until(
        std::time::Duration::from_secs(10),
        "the waiter's mark",
        || {
            cluster.nodes.iter().all(|server| {
                let value: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query(&mut server.connection())
                    .unwrap();
                value.is_some_and(|v| v.ends_with('~'))
            })
        },
    );
    for server in cluster.nodes.iter() {
        reset(server);
    }
    held.unlock().unwrap();
    taken
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the waiter holds the lock");
    for (i, server) in cluster.nodes.iter().enumerate() {
        let calls = command_calls(server);
        // At least once: a failed attempt of the waiter's (a race with the release on
        // another node) is undone with a release of its own.
        assert!(
            calls.get("del").copied().unwrap_or(0) >= 1,
            "node {i}: the release deleted the key: {calls:?}"
        );
        assert!(
            calls.get("publish").copied().unwrap_or(0) >= 1,
            "node {i}: and announced it: {calls:?}"
        );
    }
    done_tx.send(()).unwrap();
    waiting.join().unwrap();
}

#[test]
fn the_counters_this_test_reads_do_move() {
    // A negative control for the checks above: a direct SET is counted, a new connection
    // is counted.
    let fixture = common::Single::new();
    let server = &fixture.server;
    reset(server);
    let mut con = server.connection();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    assert_eq!(command_calls(server).get("set"), Some(&1));
    assert!(connections_received(server) >= 1);
    let _: () = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(
        command_calls(server).get("ping"),
        Some(&1),
        "an extra request shows"
    );
    // Round trips: two pipelined commands are one read, two separate ones are two.
    let reads = |con: &mut redis::Connection| stat(con, "total_reads_processed");
    let before = reads(&mut con);
    let _: () = redis::pipe()
        .cmd("PING")
        .ignore()
        .cmd("PING")
        .ignore()
        .query(&mut con)
        .unwrap();
    assert_eq!(reads(&mut con) - before, 2, "one pipeline + one INFO");
    let before = reads(&mut con);
    let _: () = redis::cmd("PING").query(&mut con).unwrap();
    let _: () = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(reads(&mut con) - before, 3, "two requests + one INFO");
}

/// The hand-over script, run directly: it gives the releaser's key to the successor (the
/// mark kept, a lease of its own, a token drawn when asked, larger each time), answers the
/// same when sent again after a lost reply (a cluster retries it on a new master) instead
/// of saying "not yours" for a hand-over it made, and touches a key that is neither's not
/// at all.
#[test]
fn the_hand_over_script_is_idempotent_and_touches_only_its_own_key() {
    let fixture = common::Single::new();
    let mut con = fixture.server.connection();
    let script = redis::Script::new(concat!(
        include_str!("../src/protocol/lua/draw.lua"),
        include_str!("../src/protocol/lua/handover.lua")
    ));
    let (key, stream) = ("dlm:{handed-script}", "dlm:{handed-script}:fence");
    let hand = |con: &mut redis::Connection, from: &str, to: &str, fenced: bool| -> (i64, String) {
        let (code, id): (i64, redis::Value) = script
            .key(key)
            .key(stream)
            .arg(from)
            .arg(to)
            .arg(30_000)
            .arg(if fenced { "1" } else { "0" })
            .arg(86_400_000)
            .invoke(con)
            .unwrap();
        let id = match id {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
            _ => String::new(),
        };
        (code, id)
    };
    let value = |con: &mut redis::Connection| -> (Option<String>, i64) {
        redis::pipe()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query(con)
            .unwrap()
    };
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("a~")
        .arg("PX")
        .arg(1_000)
        .query(&mut con)
        .unwrap();
    let (code, first) = hand(&mut con, "a", "b", true);
    assert_eq!(code, 2, "handed over with a token drawn");
    let (v, pttl) = value(&mut con);
    assert_eq!(v.as_deref(), Some("b~"), "the mark stays");
    assert!(
        pttl > 1_000 && pttl <= 30_000,
        "the successor's own lease: {pttl}"
    );
    let (code, again) = hand(&mut con, "a", "b", true);
    assert_eq!(code, 2, "sent again: the same answer, not 'not yours'");
    let id = |s: &str| -> (u64, u64) {
        let (ms, seq) = s.split_once('-').expect("a stream ID");
        (ms.parse().unwrap(), seq.parse().unwrap())
    };
    assert!(id(&again) > id(&first), "{again} after {first}");
    assert_eq!(value(&mut con).0.as_deref(), Some("b~"));
    assert_eq!(hand(&mut con, "b", "c", false).0, 3, "no token asked for");
    assert_eq!(value(&mut con).0.as_deref(), Some("c~"));
    assert_eq!(hand(&mut con, "a", "d", false).0, 0, "not a's any more");
    assert_eq!(value(&mut con).0.as_deref(), Some("c~"), "untouched");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("foreign")
        .query(&mut con)
        .unwrap();
    assert_eq!(hand(&mut con, "c", "d", false).0, 0);
    let (v, pttl) = value(&mut con);
    assert_eq!(
        (v.as_deref(), pttl),
        (Some("foreign"), -1),
        "a key dlm did not write"
    );
}
