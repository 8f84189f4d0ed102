//! Odd names, the key layout, TTLs and fencing tokens, and a leftover key that only
//! delays: what dlm writes to Redis, checked on a real server.
mod common;

use dlm_core::backend::BackendErrorKind;
use dlm_core::{Lock, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;
use std::time::{Duration, Instant};

use common::errors::*;

// ---------------------------------------------------------------------------------------
// 13. Odd names
// ---------------------------------------------------------------------------------------

#[test]
fn odd_names_lock_unlock_and_never_collide() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let _: () = query(&mut admin, redis::cmd("SET").arg("canary").arg("alive"));
    let url = server.url();
    let c1 = client(&url);
    let c2 = client(&url);

    let tag = unique_name("n");
    let long_ascii = format!("{tag}-{}", "L".repeat(512 - tag.len() - 1));
    let long_utf8 = "é".repeat(256);
    let names = [
        "x:fence".to_owned(),
        "x:released".to_owned(),
        "}{".to_owned(),
        "{".to_owned(),
        "}".to_owned(),
        "{x}".to_owned(),
        "return redis.call('FLUSHALL')".to_owned(),
        "'; redis.call('FLUSHALL') --".to_owned(),
        "dlm:{x}".to_owned(),
        "*".to_owned(),
        "a b c".to_owned(),
        "ключ-🔒-名前".to_owned(),
        long_ascii,
        long_utf8,
    ];
    for name in &names {
        assert!(name.len() <= 512, "{name:?}");
        let lock = c1.get_lock(name).unwrap();
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{name:?}: {e:?}"))
            .unwrap_or_else(|| panic!("{name:?}: not acquired"));
        let first = guard.fencing_token().expect("fenced");
        let key = lock_key(name);
        let ttl = pttl(&mut admin, &key);
        assert!(ttl > 0, "{name:?}: key {key:?} has PTTL {ttl}");
        assert!(lock.is_locked().unwrap(), "{name:?}");
        // Another owner is excluded.
        let other = c2.get_lock(name).unwrap();
        assert!(other.try_lock().unwrap().is_none(), "{name:?}: two holders");
        guard.unlock().unwrap_or_else(|e| panic!("{name:?}: {e:?}"));
        assert!(!exists(&mut admin, &key), "{name:?}: key left behind");
        assert!(!lock.is_locked().unwrap(), "{name:?}");
        let g = other.try_lock().unwrap().expect("free after unlock");
        let next = g.fencing_token().expect("fenced");
        assert!(next.get() > first.get(), "{name:?}: {next} after {first}");
        g.unlock().unwrap();
    }
    let canary: Option<String> = query(&mut admin, redis::cmd("GET").arg("canary"));
    assert_eq!(canary.as_deref(), Some("alive"), "a name ran as code");

    // Names that look like another lock's internal keys are independent locks.
    let base = unique_name("a");
    let lookalikes = [
        base.clone(),
        format!("{base}:fence"),
        format!("{base}}}:fence"),
        format!("{base}:released"),
        format!("{base}}}:released"),
        format!("{base}}}"),
        format!("{{{base}"),
    ];
    let clients: Vec<LockClient> = lookalikes.iter().map(|_| client(&url)).collect();
    let guards: Vec<_> = lookalikes
        .iter()
        .zip(&clients)
        .map(|(name, c)| {
            let g = c
                .get_lock(name)
                .unwrap()
                .try_lock()
                .unwrap_or_else(|e| panic!("{name:?}: {e:?}"))
                .unwrap_or_else(|| panic!("{name:?} collided with another name"));
            g.fencing_token().unwrap(); // drawn: the slot's stream exists
            g
        })
        .collect();
    for (name, c) in lookalikes.iter().zip(&clients) {
        assert!(c.get_lock(name).unwrap().is_locked().unwrap(), "{name:?}");
        let key = lock_key(name);
        assert!(pttl(&mut admin, &key) > 0, "{key:?}");
        assert!(pttl(&mut admin, &fence_key(name)) > 0, "{name:?}");
    }
    for g in guards {
        g.unlock().unwrap();
    }
    for name in &lookalikes {
        assert!(!exists(&mut admin, &lock_key(name)), "{name:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 14. Key layout, TTLs and fencing tokens
// ---------------------------------------------------------------------------------------

#[test]
fn every_key_has_a_ttl_and_tokens_increase() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let url = server.url();
    let c1 = client(&url);
    let c2 = client(&url);
    let name = unique_name("job");
    let key = lock_key(&name);
    let fence = fence_key(&name);
    assert_eq!(
        backend(&url).keys(&name).unwrap(),
        dlm_redis::Redlock::new(&[url.as_str()])
            .unwrap()
            .keys(&name)
            .unwrap(),
        "one layout for both backends"
    );

    let guard = c1.get_lock(&name).unwrap().lock().unwrap();
    assert!(
        !exists(&mut admin, &fence),
        "the stream is written when a token is read, not before"
    );
    let first = guard.fencing_token().unwrap().get();
    let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&key));
    assert_eq!(kind, "string");
    let ttl = pttl(&mut admin, &key);
    assert!(ttl > 0 && ttl <= 30_000, "{key}: PTTL {ttl}");
    let value: String = query(&mut admin, redis::cmd("GET").arg(&key));
    assert!(!value.is_empty());
    assert!(!value.contains(&name), "the owner token is not the name");
    let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&fence));
    assert_eq!(kind, "stream");
    let fence_ttl = pttl(&mut admin, &fence);
    assert!(
        fence_ttl > 23 * 3600 * 1000 && fence_ttl <= 24 * 3600 * 1000,
        "the fencing stream keeps the default fence TTL of 24 h: PTTL {fence_ttl}"
    );
    guard.unlock().unwrap();
    assert!(
        !exists(&mut admin, &key),
        "the lock key outlived the unlock"
    );

    let mut tokens = vec![first];
    for c in [&c2, &c1, &c2] {
        let g = c.get_lock(&name).unwrap().lock().unwrap();
        tokens.push(g.fencing_token().unwrap().get());
        assert!(pttl(&mut admin, &key) > 0);
        g.unlock().unwrap();
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let keys: Vec<String> = query(&mut admin, redis::cmd("KEYS").arg("dlm:*"));
    assert_eq!(
        keys,
        std::slice::from_ref(&fence),
        "only the fencing stream stays"
    );

    // Re-entry reuses the acquisition: same token, no new draw.
    let lock = c1.get_lock(&name).unwrap();
    let g1 = lock.lock().unwrap();
    let g2 = lock.lock().unwrap();
    assert_eq!(g1.fencing_token().ok(), g2.fencing_token().ok());
    assert!(g1.fencing_token().unwrap().get() > tokens[3]);
    drop(g2);
    assert!(exists(&mut admin, &key));
    drop(g1);
    assert!(!exists(&mut admin, &key));

    // Fencing off: no stream, no tokens.
    let _: i64 = query(&mut admin, redis::cmd("DEL").arg(&fence));
    let unfenced = LockClient::new(
        RedisBackend::builder(&url)
            .fencing(false)
            .io_timeout(common::CALM)
            .build()
            .unwrap(),
    );
    let g = unfenced.get_lock(&name).unwrap().lock().unwrap();
    assert_eq!(
        g.fencing_token().unwrap_err().backend_kind(),
        Some(dlm_core::BackendErrorKind::Unsupported)
    );
    assert!(pttl(&mut admin, &key) > 0);
    assert!(!exists(&mut admin, &fence));
    g.unlock().unwrap();
    assert!(!exists(&mut admin, &key));
}

#[test]
fn a_fencing_stream_of_another_type_is_reported_and_left_as_it_was() {
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let c = client(&server.url());
    for what in ["a string", "a list"] {
        let name = unique_name("badfence");
        let fence = fence_key(&name);
        let _: redis::Value = match what {
            "a string" => query(&mut admin, redis::cmd("SET").arg(&fence).arg("x")),
            _ => query(&mut admin, redis::cmd("RPUSH").arg(&fence).arg("x")),
        };
        let lock = c.get_lock(&name).unwrap();
        let start = Instant::now();
        let guard = lock
            .try_lock_timeout(Duration::from_secs(5))
            .unwrap()
            .expect("free");
        expect_kind(guard.fencing_token(), BackendErrorKind::UnexpectedKey, what);
        assert!(
            start.elapsed() < PROMPT,
            "{what}: took {:?}",
            start.elapsed()
        );
        guard.unlock().unwrap();
        assert!(
            !exists(&mut admin, &lock_key(&name)),
            "{what}: the lock was not released"
        );
        let kind: String = query(&mut admin, redis::cmd("TYPE").arg(&fence));
        assert_ne!(kind, "stream", "{what}: the foreign key was replaced");
        let _: i64 = query(&mut admin, redis::cmd("DEL").arg(&fence));
    }
}

// ---------------------------------------------------------------------------------------
// 15. A leftover key with a TTL only delays
// ---------------------------------------------------------------------------------------

#[test]
fn a_leftover_key_with_a_ttl_only_delays_the_acquisition() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    let client = client(&server.url());
    let name = unique_name("left");
    let lock = client.get_lock(&name).unwrap();
    // Warm up on another name so that the measured wait is the key's, not a connect.
    let warm = client.get_lock(&unique_name("warm")).unwrap();
    warm.try_lock().unwrap().unwrap().unlock().unwrap();

    let start = Instant::now();
    let _: () = query(
        &mut admin,
        redis::cmd("SET")
            .arg(lock_key(&name))
            .arg("other")
            .arg("PX")
            .arg(300),
    );
    assert!(lock.is_locked().unwrap());
    let guard = lock
        .try_lock_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("acquired once the leftover key expired");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "acquired after {waited:?}, before the leftover key expired"
    );
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    let value: String = query(&mut admin, redis::cmd("GET").arg(lock_key(&name)));
    assert_ne!(value, "other");
    // The token is the stream's latest ID.
    assert_eq!(
        guard.fencing_token().ok().map(|t| t.get()),
        Some(common::last_fence_token(&server, &fence_key(&name)))
    );
    guard.unlock().unwrap();
    assert!(!exists(&mut admin, &lock_key(&name)));
}
