//! Fencing tokens across processes: several `fenced_writer` processes take one lock in
//! turn and write through the fencing check while they hold it; none may be refused, and
//! no token may be issued twice. On one Redis server and on Redlock over three.

use std::collections::HashSet;
use std::process::{Command, Stdio};

use dlm_testkit::redis_server::{RedisNodes, require_redis_server};

fn run_writers(urls: &[String]) {
    const PROCESSES: usize = 3;
    const COUNT: usize = 15;
    let name = dlm_testkit::unique_name("processes");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_fenced_writer"))
                .args(["--redis", &urls.join(","), "--count", &COUNT.to_string()])
                .args(["--name", &name, "--key", &format!("{name}:value")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start fenced_writer")
        })
        .collect();
    let mut tokens = HashSet::new();
    for child in children {
        let out = child.wait_with_output().expect("wait for fenced_writer");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a writer failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            let t: u64 = line.strip_prefix("token ").unwrap().parse().unwrap();
            assert!(tokens.insert(t), "token {t} issued twice");
        }
    }
    assert_eq!(tokens.len(), PROCESSES * COUNT);
}

#[test]
fn tokens_increase_across_processes_on_one_server() {
    require_redis_server().expect("redis-server is required");
    let nodes = RedisNodes::spawn(1);
    run_writers(&nodes.urls());
}

#[test]
fn tokens_increase_across_processes_on_redlock() {
    require_redis_server().expect("redis-server is required");
    let nodes = RedisNodes::spawn(3);
    run_writers(&nodes.urls());
}
