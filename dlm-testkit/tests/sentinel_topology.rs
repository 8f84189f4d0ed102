//! The Sentinel topology against real processes: it is ready when spawned, replicates,
//! fails over on demand, honours its passwords and leaves no process behind.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::{RedisServer, live_server_pids, require_redis_server};
use dlm_testkit::sentinel::SentinelTopology;
use redis::{Connection, FromRedisValue, RedisResult};

fn client(url: &str) -> Connection {
    let timeout = Duration::from_secs(5);
    let con = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(timeout)
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    con.set_read_timeout(Some(timeout)).unwrap();
    con.set_write_timeout(Some(timeout)).unwrap();
    con
}

/// Runs a command given as words.
fn run<T: FromRedisValue>(con: &mut Connection, args: &[&str]) -> RedisResult<T> {
    redis::cmd(args[0]).arg(&args[1..]).query(con)
}

/// Polls `cond` every 10 ms for up to 5 s.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn get(node: &RedisServer, key: &str) -> Option<String> {
    run(&mut node.connection(), &["GET", key]).unwrap()
}

/// The first element of `ROLE`: `master` or `slave`.
fn role(node: &RedisServer) -> String {
    let reply: Vec<redis::Value> = run(&mut node.connection(), &["ROLE"]).unwrap();
    String::from_redis_value(reply[0].clone()).unwrap()
}

/// One field of the node's `INFO replication`.
fn replication(node: &RedisServer, field: &str) -> String {
    let info = node.info("replication");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {info}"))
        .to_owned()
}

/// The master address that the sentinel at `url` names, asked directly.
fn named_master(url: &str, name: &str) -> (String, u16) {
    run(
        &mut client(url),
        &["SENTINEL", "get-master-addr-by-name", name],
    )
    .unwrap()
}

/// Writes `key` on the master and waits until every other data node has it.
fn assert_replicates(topology: &SentinelTopology, key: &str, value: &str) {
    let master = topology.master_index();
    run::<()>(
        &mut topology.data_node(master).connection(),
        &["SET", key, value],
    )
    .unwrap();
    for r in topology.replica_indexes() {
        let node = topology.data_node(r);
        wait_until(&format!("{key}={value} on data node {r}"), || {
            get(node, key).as_deref() == Some(value)
        });
    }
}

/// Every pid of the topology's processes.
fn pids(topology: &SentinelTopology) -> Vec<u32> {
    let data = topology.data_nodes().iter().map(RedisServer::pid);
    let sentinels = (0..topology.sentinel_count()).map(|i| topology.sentinel(i).pid());
    data.chain(sentinels).collect()
}

#[test]
fn failover_moves_the_master_and_drop_kills_everything() {
    require_redis_server();
    let started = Instant::now();
    let topology = SentinelTopology::spawn();
    eprintln!("spawn: {:?}", started.elapsed());

    assert_eq!(topology.master_name(), "mymaster");
    assert_eq!(topology.data_nodes().len(), 3);
    assert_eq!(topology.sentinel_count(), 3);
    assert_eq!(topology.quorum(), 2);
    let addrs = topology.sentinel_addrs();
    let urls = topology.sentinel_urls();
    for (addr, url) in addrs.iter().zip(&urls) {
        assert_eq!(*url, format!("redis://127.0.0.1:{}/", addr.port()));
    }

    // Spawned ready: every sentinel names the first master, which has two replicas.
    let old = topology.master_index();
    assert_eq!(old, 0);
    assert_eq!(topology.replica_indexes(), [1, 2]);
    let old_port = topology.data_node(old).port();
    for url in &urls {
        assert_eq!(
            named_master(url, "mymaster"),
            ("127.0.0.1".into(), old_port)
        );
    }
    assert_eq!(role(topology.master()), "master");
    for r in [1, 2] {
        assert_eq!(role(topology.data_node(r)), "slave");
        assert_eq!(
            replication(topology.data_node(r), "master_link_status"),
            "up"
        );
    }
    assert_replicates(&topology, "dlm:k", "v1");

    let started = Instant::now();
    let new = topology.failover();
    eprintln!("failover: {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(topology.master_index(), new);
    let new_port = topology.data_node(new).port();
    for url in &urls {
        assert_eq!(
            named_master(url, "mymaster"),
            ("127.0.0.1".into(), new_port)
        );
    }
    assert_eq!(role(topology.data_node(new)), "master");
    let demoted = topology.data_node(old);
    assert_eq!(role(demoted), "slave");
    assert_eq!(replication(demoted, "master_port"), new_port.to_string());
    assert_eq!(replication(demoted, "master_link_status"), "up");
    let refused = run::<()>(&mut demoted.connection(), &["SET", "dlm:k", "x"]);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.code() == Some("READONLY")),
        "the old master took a write: {refused:?}"
    );
    assert_eq!(topology.replica_indexes().len(), 2);
    assert!(topology.replica_indexes().contains(&old));
    assert_replicates(&topology, "dlm:k", "v2");

    let pids = pids(&topology);
    assert_eq!(pids.len(), 6);
    let live = live_server_pids();
    assert!(
        pids.iter().all(|p| live.contains(p)),
        "{pids:?} not in {live:?}"
    );
    drop(topology);
    let live = live_server_pids();
    for pid in pids {
        assert!(!live.contains(&pid), "pid {pid} still registered");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still alive"
        );
    }
}

#[test]
fn a_paused_master_is_replaced_and_rejoins_as_a_replica() {
    require_redis_server();
    let mut topology = SentinelTopology::builder().replicas(1).spawn();
    topology.master().pause();
    let started = Instant::now();
    let new = topology.wait_for_new_master(0, Duration::from_secs(30));
    eprintln!("failover after a pause: {:?}", started.elapsed());
    assert_eq!(new, 1);
    assert_eq!(role(topology.data_node(1)), "master");

    // Resumed, the old master still says it is one, until the sentinels convert it.
    topology.data_node(0).resume();
    let started = Instant::now();
    assert_eq!(topology.wait_settled(Duration::from_secs(10)), 1);
    eprintln!("old master converted: {:?}", started.elapsed());
    assert_eq!(role(topology.data_node(0)), "slave");
    assert_replicates(&topology, "dlm:k", "v1");

    // A restarted sentinel comes back from its rewritten config file, knowing the new
    // master, and finds the other nodes again.
    let pid = topology.sentinel(0).pid();
    topology.restart_sentinel(0);
    assert_ne!(topology.sentinel(0).pid(), pid);
    let port = topology.data_node(1).port();
    assert_eq!(
        named_master(&topology.sentinel_urls()[0], "mymaster"),
        ("127.0.0.1".into(), port)
    );
    let started = Instant::now();
    assert_eq!(topology.wait_settled(Duration::from_secs(10)), 1);
    eprintln!("restarted sentinel settled: {:?}", started.elapsed());
}

/// A raw RESP connection, to see the server's exact error replies.
struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let writer = TcpStream::connect(("127.0.0.1", port)).unwrap();
        writer
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Raw { reader, writer }
    }

    /// Sends a command and returns the first line of the reply.
    fn first_line(&mut self, args: &[&str]) -> String {
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.writer.write_all(req.as_bytes()).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }
}

#[test]
fn passwords_protect_sentinels_and_data_nodes() {
    require_redis_server();
    let started = Instant::now();
    let topology = SentinelTopology::builder()
        .master_name("dlm-main")
        .replicas(1)
        .password("data p@ss:w")
        .sentinel_password("sent/p w!")
        .spawn();
    eprintln!("spawn with passwords: {:?}", started.elapsed());

    let port = topology.sentinel_addrs()[0].port();
    let url = &topology.sentinel_urls()[0];
    assert_eq!(*url, format!("redis://:sent%2Fp%20w%21@127.0.0.1:{port}/"));

    // The sentinel refuses every command until AUTH with its own password.
    let mut raw = Raw::connect(port);
    let ask = ["SENTINEL", "get-master-addr-by-name", "dlm-main"];
    assert!(raw.first_line(&ask).starts_with("-NOAUTH"));
    assert!(raw.first_line(&["PING"]).starts_with("-NOAUTH"));
    assert!(
        raw.first_line(&["AUTH", "data p@ss:w"])
            .starts_with("-WRONGPASS")
    );
    assert_eq!(raw.first_line(&["AUTH", "sent/p w!"]), "+OK");
    assert_eq!(raw.first_line(&["PING"]), "+PONG");
    assert_eq!(raw.first_line(&ask), "*2");
    let master_port = topology.data_node(0).port();
    assert_eq!(
        named_master(url, "dlm-main"),
        ("127.0.0.1".into(), master_port)
    );

    // The data nodes want theirs.
    let mut raw = Raw::connect(master_port);
    assert!(raw.first_line(&["GET", "dlm:k"]).starts_with("-NOAUTH"));
    assert_eq!(raw.first_line(&["AUTH", "data p@ss:w"]), "+OK");
    assert!(
        topology
            .data_node(0)
            .url()
            .starts_with("redis://:data%20p%40ss%3Aw@")
    );

    // Replication (masterauth), monitoring (auth-pass) and a failover work with them: the
    // old master, turned into a replica by the sentinels, authenticates to the new one.
    assert_replicates(&topology, "dlm:k", "v1");
    let started = Instant::now();
    assert_eq!(topology.failover(), 1);
    eprintln!("failover with passwords: {:?}", started.elapsed());
    assert_eq!(role(topology.data_node(0)), "slave");
    assert_replicates(&topology, "dlm:k", "v2");
    assert_eq!(get(topology.data_node(0), "dlm:k").as_deref(), Some("v2"));
}

/// `SENTINEL DEBUG` (no arguments) as field (lower case) → value.
fn sentinel_debug(
    topology: &SentinelTopology,
    i: usize,
) -> std::collections::HashMap<String, String> {
    let flat: Vec<String> = run(
        &mut topology.sentinel(i).connection(),
        &["SENTINEL", "DEBUG"],
    )
    .unwrap();
    flat.chunks_exact(2)
        .map(|kv| (kv[0].to_lowercase(), kv[1].clone()))
        .collect()
}

/// One field of `SENTINEL MASTER <name>` on sentinel `i`.
fn master_field(topology: &SentinelTopology, i: usize, field: &str) -> String {
    let flat: Vec<String> = run(
        &mut topology.sentinel(i).connection(),
        &["SENTINEL", "MASTER", topology.master_name()],
    )
    .unwrap();
    flat.chunks_exact(2)
        .find(|kv| kv[0] == field)
        .unwrap_or_else(|| panic!("no {field} in {flat:?}"))[1]
        .clone()
}

/// The short timings by default; `default_timings()` keeps Sentinel's own (INFO every
/// 10 s, hello every 2 s, down-after 30 s, failover timeout 3 min), and its data nodes
/// take the extra configuration given; each data node's ROLE is readable through the
/// topology.
#[test]
fn default_timings_keep_sentinels_own_periods_and_data_node_config_is_applied() {
    require_redis_server();
    let short = SentinelTopology::builder().replicas(1).sentinels(1).spawn();
    let debug = sentinel_debug(&short, 0);
    assert_eq!(
        debug.get("info-period").map(String::as_str),
        Some("250"),
        "{debug:?}"
    );
    assert_eq!(master_field(&short, 0, "down-after-milliseconds"), "1000");

    let slow = SentinelTopology::builder()
        .default_timings()
        .data_node_config("min-replicas-to-write", "1")
        .spawn();
    for i in 0..slow.sentinel_count() {
        let debug = sentinel_debug(&slow, i);
        assert_eq!(debug["info-period"], "10000", "{debug:?}");
        assert_eq!(debug["publish-period"], "2000", "{debug:?}");
        assert_eq!(debug["ask-period"], "1000", "{debug:?}");
        assert_eq!(master_field(&slow, i, "down-after-milliseconds"), "30000");
        assert_eq!(master_field(&slow, i, "failover-timeout"), "180000");
    }
    for node in slow.data_nodes() {
        let config: Vec<String> = run(
            &mut node.connection(),
            &["CONFIG", "GET", "min-replicas-to-write"],
        )
        .unwrap();
        assert_eq!(config[1], "1");
    }
    let master = slow.master_index();
    assert_eq!(slow.role(master).unwrap(), "master");
    for r in slow.replica_indexes() {
        assert_eq!(slow.role(r).unwrap(), "slave");
    }
}
