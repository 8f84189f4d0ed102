//! Tests of the real-redis-server harness.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Duration;

use dlm_testkit::redis_server::{RedisNodes, RedisServer, live_server_pids, require_redis_server};
use redis::{Connection, FromRedisValue, RedisResult};

fn client(url: &str, timeout: Duration) -> RedisResult<Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

/// Runs a command given as words.
fn run<T: FromRedisValue>(con: &mut Connection, args: &[&str]) -> RedisResult<T> {
    redis::cmd(args[0]).arg(&args[1..]).query(con)
}

/// Whether a fresh connection to `url` answers PING.
fn pong(url: &str) -> bool {
    let con = client(url, Duration::from_secs(5));
    con.and_then(|mut c| run::<String>(&mut c, &["PING"]))
        .is_ok_and(|p| p == "PONG")
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    run(&mut server.connection(), &["GET", key]).unwrap()
}

fn proc_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn spawn_answers_ping() {
    require_redis_server();
    let server = RedisServer::spawn();
    assert!(server.is_running());
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(pong(&server.url()));
    let pid_line = format!("process_id:{}", server.pid());
    assert!(server.info("server").contains(&pid_line));
    assert!(
        server
            .log_contents()
            .contains("Ready to accept connections")
    );
    assert!(live_server_pids().contains(&server.pid()));
}

#[test]
fn servers_get_different_ports() {
    require_redis_server();
    let nodes = RedisNodes::spawn(3);
    assert_eq!(nodes.len(), 3);
    let mut ports: Vec<u16> = (0..3).map(|i| nodes.get(i).port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "ports: {:?}", nodes.urls());
    assert!(nodes.urls().iter().all(|url| pong(url)));
}

#[test]
fn pause_times_out_and_resume_answers() {
    require_redis_server();
    let server = RedisServer::spawn();
    let timeout = Duration::from_millis(200);
    let mut con = client(&server.url(), timeout).unwrap();
    server.pause();
    assert!(server.is_paused());
    let err = run::<String>(&mut con, &["PING"]).expect_err("a paused server must not answer");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    server.resume();
    assert!(!server.is_paused());
    let mut fresh = client(&server.url(), timeout).unwrap();
    assert_eq!(run::<String>(&mut fresh, &["PING"]).unwrap(), "PONG");
}

#[test]
fn kill_makes_connections_fail() {
    require_redis_server();
    let mut server = RedisServer::spawn();
    let pid = server.pid();
    let mut con = client(&server.url(), Duration::from_secs(1)).unwrap();
    server.kill();
    assert!(!server.is_running());
    assert!(run::<String>(&mut con, &["PING"]).is_err());
    assert!(client(&server.url(), Duration::from_secs(1)).is_err());
    assert!(!proc_exists(pid), "pid {pid} not reaped");
    assert!(!live_server_pids().contains(&pid));
    server.kill(); // a second kill is a no-op
}

#[test]
fn restart_with_aof_keeps_data() {
    require_redis_server();
    let mut server = RedisServer::builder().appendonly(true).spawn();
    let (port, pid) = (server.port(), server.pid());
    run::<()>(&mut server.connection(), &["SET", "dlm:k", "v1"]).unwrap();
    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    assert!(server.is_running());
    assert_eq!(get(&server, "dlm:k").as_deref(), Some("v1"));
}

#[test]
fn restart_without_aof_loses_data() {
    require_redis_server();
    let mut server = RedisServer::spawn();
    run::<()>(&mut server.connection(), &["SET", "dlm:k", "v1"]).unwrap();
    server.pause();
    server.restart(); // also from the paused state
    assert!(!server.is_paused());
    assert_eq!(get(&server, "dlm:k"), None);
}

#[test]
fn password_and_acl_user() {
    require_redis_server();
    let server = RedisServer::builder()
        .password("s3cr:t@")
        .acl_user("app", "on >app-pw ~dlm:* &dlm:* +@all")
        .credentials("app", "app-pw")
        .spawn();
    let port = server.port();
    assert_eq!(
        server.url(),
        format!("redis://app:app-pw@127.0.0.1:{port}/")
    );
    let mut app = client(&server.url(), Duration::from_secs(5)).unwrap();
    run::<()>(&mut app, &["SET", "dlm:x", "1"]).unwrap();
    let denied = run::<()>(&mut app, &["SET", "other", "1"]);
    assert!(denied.is_err(), "ACL key pattern not applied");
    assert_eq!(get(&server, "dlm:x").as_deref(), Some("1"));
    assert!(pong(&format!("redis://:s3cr%3At%40@127.0.0.1:{port}/")));
    assert!(!pong(&format!("redis://:nope@127.0.0.1:{port}/")));
    assert!(!pong(&format!("redis://127.0.0.1:{port}/")));
}

#[test]
fn password_only_url() {
    require_redis_server();
    let server = RedisServer::builder().password("pw").spawn();
    assert_eq!(
        server.url(),
        format!("redis://:pw@127.0.0.1:{}/", server.port())
    );
    assert!(pong(&server.url()));
}

#[test]
fn controls_expire_flush_args() {
    require_redis_server();
    let server = RedisServer::builder().arg("--maxmemory").arg("7mb").spawn();
    assert!(server.info("memory").contains("maxmemory:7340032"));
    let mut con = server.connection();
    run::<()>(&mut con, &["SET", "dlm:e", "v"]).unwrap();
    server.expire_now("dlm:e");
    assert_eq!(get(&server, "dlm:e"), None);
    server.expire_now("dlm:missing");
    let sha: String = run(&mut con, &["SCRIPT", "LOAD", "return 1"]).unwrap();
    server.flush_scripts();
    let exists: Vec<bool> = run(&mut con, &["SCRIPT", "EXISTS", &sha]).unwrap();
    assert_eq!(exists, [false]);
}

#[test]
fn drop_leaves_no_process_or_dir() {
    require_redis_server();
    let server = RedisServer::spawn();
    let paused = RedisServer::spawn();
    paused.pause();
    let pids = [server.pid(), paused.pid()];
    let dirs = [server.dir().to_owned(), paused.dir().to_owned()];
    drop(server);
    drop(paused);
    for (pid, dir) in pids.iter().zip(&dirs) {
        assert!(!proc_exists(*pid), "pid {pid} outlived its handle");
        assert!(!live_server_pids().contains(pid));
        assert!(!dir.exists(), "{} not removed", dir.display());
    }
}

#[test]
fn bad_argument_panics_with_log() {
    require_redis_server();
    let msg = panic_message(|| {
        RedisServer::builder().arg("--no-such-option").spawn();
    });
    assert!(
        msg.contains("failed to start") && msg.contains("no-such-option"),
        "{msg}"
    );
}

#[test]
fn restart_panics_when_port_taken() {
    require_redis_server();
    let mut server = RedisServer::spawn();
    server.kill();
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", server.port())).unwrap();
    let msg = panic_message(|| server.restart());
    assert!(msg.contains("Address already in use"), "{msg}");
    assert!(!server.is_running());
}

/// A process killed outright (no destructors run) takes its servers with it: they are
/// started with a parent-death signal. `with-redis` stands in for a test binary.
#[test]
fn a_killed_process_leaves_no_server_running() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    require_redis_server();
    let mut runner = Command::new(env!("CARGO_BIN_EXE_with-redis"))
        // `exec cat` ends when our end of its stdin closes: nothing outlives the test.
        .args(["1", "sh", "-c", "echo {urls}; exec cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(runner.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_owned();
    assert!(pong(&url), "the server at {url:?} is not up");
    runner.kill().unwrap(); // SIGKILL: with-redis's Drop never runs
    runner.wait().unwrap();
    drop(runner.stdin.take());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client(&url, Duration::from_millis(200)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server at {url} outlived the process that started it"
        );
        std::thread::yield_now();
    }
}
