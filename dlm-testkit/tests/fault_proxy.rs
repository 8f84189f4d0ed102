//! The fault proxy against a real redis-server: each fault does what it says, and the
//! proxy leaves no thread behind.

use std::time::{Duration, Instant};

use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::redis_server::{RedisServer, require_redis_server};

fn connect(url: &str, timeout: Duration) -> redis::Connection {
    let con = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    con.set_read_timeout(Some(timeout)).unwrap();
    con.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    con
}

fn get(con: &mut redis::Connection, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(con)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn setup() -> (RedisServer, FaultProxy) {
    require_redis_server();
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    (server, proxy)
}

#[test]
fn forwards_both_ways_and_counts_connections() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_secs(5));
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    assert_eq!(get(&mut con, "k").unwrap().as_deref(), Some("v"));
    assert_eq!(
        get(&mut server.connection(), "k").unwrap().as_deref(),
        Some("v")
    );
    assert_eq!((proxy.connections(), proxy.accepted()), (1, 1));
    drop(con);
    wait_until("the connection closed", || proxy.connections() == 0);
}

#[test]
fn latency_delays_each_round_trip() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_secs(5));
    let latency = Duration::from_millis(60);
    proxy.set_latency(Direction::Both, latency);
    let start = Instant::now();
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    let took = start.elapsed();
    assert!(
        took >= latency * 2 && took < latency * 2 + Duration::from_secs(1),
        "one round trip took {took:?}"
    );
    // Pipelined commands share the delay: a delay line, not one chunk per latency.
    let start = Instant::now();
    let mut pipe = redis::pipe();
    for _ in 0..50 {
        pipe.cmd("PING");
    }
    let _: Vec<String> = pipe.query(&mut con).unwrap();
    assert!(start.elapsed() < latency * 2 + Duration::from_secs(1));
    proxy.heal();
    let start = Instant::now();
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    assert!(start.elapsed() < latency);
}

#[test]
fn a_stall_keeps_the_bytes_until_healed() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_millis(200));
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    proxy.stall(Direction::ToServer);
    let r: redis::RedisResult<()> = redis::cmd("SET").arg("stalled").arg("1").query(&mut con);
    assert!(
        r.is_err_and(|e| e.is_timeout()),
        "no reply during the stall"
    );
    let mut admin = server.connection();
    assert_eq!(
        get(&mut admin, "stalled").unwrap(),
        None,
        "the stalled SET ran"
    );
    proxy.heal();
    wait_until("the stalled SET delivered", || {
        get(&mut admin, "stalled").unwrap().is_some()
    });
}

#[test]
fn a_black_hole_loses_replies_while_the_server_works() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_millis(200));
    proxy.blackhole(Direction::ToClient);
    let r: redis::RedisResult<()> = redis::cmd("SET").arg("applied").arg("1").query(&mut con);
    assert!(r.is_err_and(|e| e.is_timeout()));
    let mut admin = server.connection();
    wait_until("the SET applied", || {
        get(&mut admin, "applied").unwrap().is_some()
    });
    proxy.heal();
    let mut fresh = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(get(&mut fresh, "applied").unwrap().as_deref(), Some("1"));
}

#[test]
fn dropped_replies_vanish_and_later_ones_arrive() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_millis(300));
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    proxy.drop_replies(1);
    // The INCR's reply is dropped; the client waits in vain, and the server counted it.
    let r: redis::RedisResult<i64> = redis::cmd("INCR").arg("n").query(&mut con);
    assert!(r.is_err_and(|e| e.is_timeout()));
    assert_eq!(proxy.replies_to_drop(), 0);
    let mut admin = server.connection();
    assert_eq!(get(&mut admin, "n").unwrap().as_deref(), Some("1"));
    // The next reply, on a fresh connection, arrives.
    let mut fresh = connect(&proxy.url(), Duration::from_secs(5));
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut fresh).unwrap();
    assert_eq!(n, 2);
}

#[test]
fn a_reset_breaks_open_connections_and_new_ones_work() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy.url(), Duration::from_secs(5));
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    proxy.reset_all();
    wait_until("the connection reset", || proxy.connections() == 0);
    let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut con);
    let e = r.expect_err("a reset connection answered");
    assert!(e.is_io_error() || e.is_connection_dropped(), "{e:?}");
    let mut fresh = connect(&proxy.url(), Duration::from_secs(5));
    let _: String = redis::cmd("PING").query(&mut fresh).unwrap();
}

#[test]
fn refused_connections_are_reset_at_once() {
    let (_server, proxy) = setup();
    proxy.refuse_new(true);
    let refused = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(refused.is_err());
    proxy.refuse_new(false);
    let mut con = connect(&proxy.url(), Duration::from_secs(5));
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
}

#[test]
fn dropping_the_proxy_ends_its_threads_and_closes_its_port() {
    let (_server, proxy) = setup();
    let baseline = threads();
    let port = proxy.port();
    let cons: Vec<_> = (0..3)
        .map(|_| connect(&proxy.url(), Duration::from_secs(5)))
        .collect();
    wait_until("three connections", || proxy.connections() == 3);
    assert!(threads() >= baseline + 6, "two threads per connection");
    drop(proxy);
    assert!(
        threads() < baseline,
        "threads left: {} after {baseline}",
        threads()
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    drop(cons);
}
