//! After warm-up, an uncontended lock+unlock costs exactly two requests per node and opens
//! no connection: checked against the servers' own counters (`INFO commandstats`,
//! `INFO stats`).
mod common;

use std::collections::BTreeMap;

use dlm_core::{Lock, LockClient};
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

/// Runs warm-up cycles, then `CYCLES` cycles on fresh names, and checks each server's
/// counters. `INFO commandstats` counts the commands a script runs inside the server as
/// well as the requests, so the check is exact: two EVALSHA per cycle, plus exactly what
/// the scripts run, and nothing else.
#[derive(Clone, Copy, PartialEq)]
enum Fence {
    Off,
    /// Single instance: INCR inside the acquire script.
    Increment,
    /// Redlock: a commit round (one more EVALSHA per node).
    TwoRounds,
}

fn check(client: &LockClient, servers: &[&RedisServer], fencing: Fence) {
    for i in 0..20 {
        let lock = client.get_lock(&format!("warm-{i}")).unwrap();
        lock.try_lock().unwrap().unwrap().unlock().unwrap();
    }
    // The admin connections are opened before the reset and reused after it.
    let mut admins: Vec<redis::Connection> = servers.iter().map(|s| s.connection()).collect();
    for admin in &mut admins {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(admin).unwrap();
    }
    for i in 0..CYCLES {
        let lock = client.get_lock(&format!("fresh-{i}")).unwrap();
        let guard = lock.try_lock().unwrap().expect("uncontended");
        guard.unlock().unwrap();
    }
    for (n, admin) in admins.iter_mut().enumerate() {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
        let calls = parse_commandstats(&stats);
        let requests = if fencing == Fence::TwoRounds { 3 } else { 2 };
        assert_eq!(
            calls.get("evalsha"),
            Some(&(requests * CYCLES)),
            "node {n}: not {requests} EVALSHA per cycle: {calls:?}"
        );
        // Everything else must be what the scripts run inside the server (acquire: GET,
        // SET, and INCR or a GET of the counter; commit: GET, GET, SET; release: GET, DEL,
        // PUBLISH): any further request (a PING, an EXISTS, a retry) would show here.
        let (gets, sets) = match fencing {
            Fence::Off | Fence::Increment => (2, 1),
            Fence::TwoRounds => (5, 2),
        };
        let mut inside_scripts: BTreeMap<String, u64> = [
            ("get", gets * CYCLES),
            ("set", sets * CYCLES),
            ("del", CYCLES),
            ("publish", CYCLES),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if fencing == Fence::Increment {
            inside_scripts.insert("incr".into(), CYCLES);
        }
        let mut others = calls.clone();
        others.remove("evalsha");
        assert_eq!(others, inside_scripts, "node {n}: unexpected requests");
        assert_eq!(
            stat(admin, "total_connections_received"),
            0,
            "node {n}: new connections during the cycles"
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
    let client = LockClient::builder(dlm_testkit::Fixture::backend(&fixture)).build();
    check(&client, &[&fixture.server], Fence::Increment);
}

#[test]
fn redlock_costs_two_requests_per_node_and_no_connection_per_cycle() {
    let cluster = common::Cluster::new(3);
    let redlock = dlm_redis::Redlock::builder(&cluster.nodes.urls())
        .fencing(false)
        .build()
        .unwrap();
    let client = LockClient::new(redlock);
    let servers: Vec<&RedisServer> = (0..3).map(|i| cluster.nodes.get(i)).collect();
    check(&client, &servers, Fence::Off);
}

#[test]
fn redlock_with_fencing_costs_one_more_request_per_node() {
    let cluster = common::Cluster::new(3);
    let client = LockClient::new(cluster.redlock());
    let servers: Vec<&RedisServer> = (0..3).map(|i| cluster.nodes.get(i)).collect();
    check(&client, &servers, Fence::TwoRounds);
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
}
