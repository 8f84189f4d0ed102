//! Owner tokens are secrets (whoever knows one can release or extend the lock): they
//! never appear in logs, `Debug` output or error messages, whatever goes wrong.
mod common;

use std::sync::Arc;
use std::time::Duration;

use dlm_core::{Lock, LockClient, RetryPolicy};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::unique_name;

/// The owner token held at `key` on `server` (without a waiter's `~`), and its 32 hex
/// digits of client id.
fn token_at(server: &dlm_testkit::redis_server::RedisServer, key: &str) -> (String, String) {
    let value: String = redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap();
    let token = value.trim_end_matches('~').to_owned();
    let id = token.split(':').next().unwrap().to_owned();
    assert_eq!(
        id.len(),
        32,
        "an owner token starts with 32 hex digits: {token}"
    );
    (token, id)
}

#[test]
fn owner_tokens_appear_in_no_log_debug_output_or_error() {
    let mark = dlm_testkit::logs::capture();
    let mut secrets = Vec::new();
    let mut texts = Vec::new();

    // Single instance: a renewed lock found gone by its renewal, then dropped (both
    // logged as warnings), a renewal failing while the server is stopped, and a release
    // that fails.
    let mut fixture = common::Single::new();
    let url = fixture.server.url();
    let backend = RedisBackend::builder(&url)
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let client = LockClient::builder(Arc::new(backend))
        .watchdog_timeout(Duration::from_millis(300))
        .retry(RetryPolicy::new().error_timeout(Duration::from_millis(300)))
        .build()
        .unwrap();
    let name = unique_name("secret");
    let lock = client.get_lock(&name).unwrap();
    let guard = lock.lock().unwrap();
    secrets.push(token_at(&fixture.server, &format!("dlm:{{{name}}}")));
    texts.push(format!("{guard:?} {lock:?} {client:?}"));
    lock.force_unlock().unwrap();
    common::wait_until(Duration::from_secs(5), "the renewal noticed", || {
        !guard.is_held()
    });
    texts.push(format!("{:?}", guard.unlock()));

    let other = client.get_lock(&unique_name("secret")).unwrap();
    let held = other.lock().unwrap();
    secrets.push(token_at(
        &fixture.server,
        &format!("dlm:{{{}}}", other.name()),
    ));
    fixture.server.pause();
    common::wait_until(Duration::from_secs(5), "the renewal failed", || {
        !held.is_held()
    });
    texts.push(format!("{:?}", held.unlock()));
    texts.push(format!("{:?}", other.try_lock()));
    fixture.server.resume();
    fixture.server.kill();
    texts.push(format!("{:?}", other.lock()));
    fixture.server.restart();

    // Redlock: a node down, a lock taken and released anyway.
    let mut cluster = common::Cluster::new(3);
    let redlock = Redlock::builder(&cluster.nodes.urls())
        .connect_timeout(Duration::from_millis(100))
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let rc = LockClient::new(redlock);
    let name = unique_name("secret");
    let rl = rc.get_lock(&name).unwrap();
    let g = rl.lock().unwrap();
    secrets.push(token_at(cluster.nodes.get(0), &format!("dlm:{{{name}}}")));
    cluster.nodes.get_mut(2).kill();
    texts.push(format!(
        "{g:?} {rl:?} {rc:?} {:?}",
        g.extend(Duration::from_secs(30))
    ));
    texts.push(format!("{:?}", g.unlock()));

    let logs = mark.lines();
    assert!(
        logs.iter().any(|l| l.contains("lost")),
        "the lost lock was not logged: the test does not exercise what it should"
    );
    for (token, id) in &secrets {
        for line in logs.iter().chain(&texts) {
            assert!(
                !line.contains(token.as_str()) && !line.contains(id.as_str()),
                "an owner token in: {line}"
            );
        }
    }
}
