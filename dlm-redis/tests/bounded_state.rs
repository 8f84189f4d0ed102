//! What dlm leaves in Redis: a lock name leaves no key once released; fencing state is one
//! stream per cluster slot (at most 16,384 per prefix, however many names), gone once idle
//! for the fence TTL. And the settings under which Redis itself would lose locks (no
//! persistence, an evicting `maxmemory-policy`) are reported at connect.
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::{RedisServer, RedisServerBuilder};

const NAMES: u64 = 100_000;
const THREADS: u64 = 8;
const FENCE_TTL: Duration = Duration::from_secs(2);

fn dbsize(server: &RedisServer) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .expect("DBSIZE")
}

/// How many keys have not expired (`DBSIZE` also counts expired keys that the server has
/// not reclaimed yet), after checking that all of them are fencing streams.
#[track_caller]
fn streams_only(server: &RedisServer) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .expect("KEYS");
    let other: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("dlm:fence:{"))
        .collect();
    assert_eq!(
        other,
        Vec::<&String>::new(),
        "keys other than fencing streams"
    );
    keys.len() as u64
}

fn used_memory(server: &RedisServer) -> u64 {
    server
        .info("memory")
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .expect("used_memory")
        .trim()
        .parse()
        .expect("a number")
}

#[test]
fn a_hundred_thousand_names_leave_at_most_one_stream_per_slot_then_nothing() {
    common::require();
    let server = RedisServer::spawn();
    let backend = Arc::new(
        RedisBackend::builder(&server.url())
            .fence_ttl(FENCE_TTL)
            .io_timeout(common::CALM)
            .connect_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let memory_before = used_memory(&server);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = LockClient::builder(backend.clone())
                .lease(Duration::from_secs(30))
                .build()
                .unwrap();
            let next = next.clone();
            thread::spawn(move || {
                let mut last = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= NAMES {
                        return;
                    }
                    let guard = client
                        .get_lock(&format!("order:{i}"))
                        .unwrap()
                        .lock()
                        .unwrap();
                    assert!(guard.fencing_token().is_ok());
                    last = last.max(guard.fencing_token().unwrap().get());
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let elapsed = start.elapsed();
    let streams = streams_only(&server);
    let memory_after = used_memory(&server);
    eprintln!(
        "{NAMES} names in {elapsed:?}: {streams} keys left, all fencing streams; used_memory {memory_before} -> {memory_after} bytes"
    );
    assert!(
        streams <= 16_384,
        "{streams} fencing streams: more than one per slot"
    );
    // Idle past the fence TTL: nothing is left.
    let idle = Instant::now();
    common::wait_until(FENCE_TTL + Duration::from_secs(10), "keys expired", || {
        dbsize(&server) == 0
    });
    eprintln!("all keys gone {:?} after the last lock", idle.elapsed());
}

#[test]
fn redlock_names_leave_the_same_bounded_state() {
    common::require();
    let cluster = common::Cluster::new(3);
    let backend = Redlock::builder(&cluster.nodes.urls())
        .fence_ttl(FENCE_TTL)
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let client = LockClient::builder(Arc::new(backend))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    for i in 0..2_000 {
        let guard = client
            .get_lock(&format!("item:{i}"))
            .unwrap()
            .lock()
            .unwrap();
        guard.fencing_token().unwrap(); // tokens are drawn when read
        guard.unlock().unwrap();
    }
    for i in 0..3 {
        let server = cluster.nodes.get(i);
        let streams = streams_only(server);
        assert!(
            (1..=2_000).contains(&streams),
            "node {i}: {streams} streams"
        );
    }
    common::wait_until(FENCE_TTL + Duration::from_secs(10), "keys expired", || {
        (0..3).all(|i| dbsize(cluster.nodes.get(i)) == 0)
    });
}

/// The warnings logged when a client first connects to a server configured by `config`.
fn warnings_for(config: impl FnOnce(RedisServerBuilder) -> RedisServerBuilder) -> Vec<String> {
    let mark = dlm_testkit::logs::capture();
    let server = config(RedisServer::builder()).spawn();
    let client = LockClient::new(RedisBackend::new(&server.url()).unwrap());
    let guard = client.get_lock("warn").unwrap().lock().unwrap();
    guard.unlock().unwrap();
    let port = format!(":{}/", server.port());
    mark.lines()
        .into_iter()
        .filter(|l| l.starts_with("WARN") && l.contains(&port))
        .collect()
}

#[test]
fn settings_that_can_lose_locks_are_reported_once_at_connect() {
    common::require();
    let durable = |b: RedisServerBuilder| b.appendonly(true);
    assert_eq!(warnings_for(durable), Vec::<String>::new());

    let volatile = warnings_for(|b| b.appendonly(true).arg("--maxmemory").arg("100mb"));
    assert_eq!(volatile.len(), 0, "noeviction by default: {volatile:?}");
    for policy in [
        "allkeys-lru",
        "volatile-ttl",
        "volatile-lru",
        "allkeys-random",
    ] {
        let w = warnings_for(|b| {
            b.appendonly(true)
                .arg("--maxmemory")
                .arg("100mb")
                .arg("--maxmemory-policy")
                .arg(policy)
        });
        assert_eq!(w.len(), 1, "{policy}: {w:?}");
        assert!(
            w[0].contains(&format!("maxmemory-policy {policy}")),
            "{w:?}"
        );
    }
    // Without a memory limit nothing is ever evicted.
    let unlimited = warnings_for(|b| {
        b.appendonly(true)
            .arg("--maxmemory-policy")
            .arg("allkeys-lru")
    });
    assert_eq!(unlimited, Vec::<String>::new());

    let no_aof = warnings_for(|b| b);
    assert_eq!(no_aof.len(), 1, "{no_aof:?}");
    assert!(no_aof[0].contains("appendonly no"), "{no_aof:?}");
    let everysec = warnings_for(|b| {
        b.arg("--appendonly")
            .arg("yes")
            .arg("--appendfsync")
            .arg("everysec")
    });
    assert_eq!(everysec.len(), 1, "{everysec:?}");
    assert!(everysec[0].contains("appendfsync everysec"), "{everysec:?}");
}
