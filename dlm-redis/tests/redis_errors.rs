//! Bad input and refusals against real `redis-server` processes: every failure comes back
//! as the right typed error, promptly, without leaking secrets (bad URLs and settings,
//! passwords, authentication, foreign keys, OOM, READONLY, NOPERM). Server faults are in
//! `server_faults.rs`, names and key layout in `names_and_keys.rs`.
mod common;

use dlm_core::backend::BackendErrorKind;
use dlm_core::{Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::unique_name;
use std::time::{Duration, Instant};

use common::errors::*;

// ---------------------------------------------------------------------------------------
// 1. Bad URLs and settings: InvalidArgument, before any I/O
// ---------------------------------------------------------------------------------------

#[test]
fn malformed_urls_and_bad_settings_are_invalid_arguments_without_io() {
    let start = Instant::now();
    for url in [
        "not a url",
        "http://x",
        "",
        "redis://:s3cret@127.0.0.1:notaport/",
    ] {
        let r = RedisBackend::new(url);
        expect_invalid(r, "url", &format!("RedisBackend::new({url:?})"));
        let r = RedisBackend::builder(url).build();
        expect_invalid(r, "url", &format!("RedisBackend::builder({url:?})"));
        let r = Redlock::builder(&[url]).verify_distinct(false).build();
        expect_invalid(r, "url", &format!("Redlock::builder([{url:?}])"));
        let r = Redlock::new(&[url]);
        expect_invalid(r, "url", &format!("Redlock::new([{url:?}])"));
    }
    // The rejection of a URL with a password never echoes the URL.
    let e = RedisBackend::new("redis://:s3cret@127.0.0.1:notaport/").unwrap_err();
    let text = error_texts(&e);
    assert!(!text.contains("s3cret"), "password in the error: {text}");
    expect_invalid(Redlock::new::<&str>(&[]), "urls", "Redlock over no nodes");

    // Port 1: nothing listens there. Any I/O would fail with a backend error (after the
    // connect timeout), not InvalidArgument, and would take time.
    let url = "redis://127.0.0.1:1/";
    let b = || RedisBackend::builder(url);
    let r = || Redlock::builder(&[url]).verify_distinct(false);
    let long_prefix = "p".repeat(65);
    for prefix in ["", "a{b", "a}b", "a\nb", long_prefix.as_str()] {
        expect_invalid(b().prefix(prefix).build(), "prefix", &format!("{prefix:?}"));
        expect_invalid(r().prefix(prefix).build(), "prefix", &format!("{prefix:?}"));
    }
    expect_invalid(b().pool_size(0).build(), "pool_size", "pool_size 0");
    expect_invalid(r().pool_size(0).build(), "pool_size", "pool_size 0");
    for factor in [0.5, -0.1, 1.0, f64::NAN, f64::INFINITY] {
        let what = format!("drift_factor {factor}");
        expect_invalid(b().drift_factor(factor).build(), "drift_factor", &what);
        expect_invalid(r().drift_factor(factor).build(), "drift_factor", &what);
    }
    let zero = Duration::ZERO;
    expect_invalid(b().connect_timeout(zero).build(), "timeout", "zero connect");
    expect_invalid(b().io_timeout(zero).build(), "timeout", "zero io");
    expect_invalid(r().connect_timeout(zero).build(), "timeout", "zero connect");
    expect_invalid(r().io_timeout(zero).build(), "timeout", "zero io");

    // The limits themselves are accepted (and still need no server).
    let ok = b()
        .prefix(&"p".repeat(64))
        .pool_size(1)
        .drift_factor(0.0)
        .connect_timeout(Duration::from_millis(1))
        .io_timeout(Duration::from_millis(1))
        .build();
    assert!(ok.is_ok(), "limits rejected: {ok:?}");
    assert!(b().drift_factor(0.49).build().is_ok());

    // Bad lock names are rejected before any I/O too.
    let client = LockClient::new(RedisBackend::new(url).unwrap());
    expect_invalid(client.get_lock(""), "name", "empty name");
    expect_invalid(client.get_lock(&"n".repeat(513)), "name", "513-byte name");
    expect_invalid(client.get_lock("a\0b"), "name", "NUL in name");
    expect_invalid(client.get_lock("a\nb"), "name", "newline in name");

    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "validation took {elapsed:?}: it must not do I/O"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Passwords never leak
// ---------------------------------------------------------------------------------------

#[test]
fn passwords_never_appear_in_errors_debug_output_or_logs() {
    let mark = dlm_testkit::logs::capture();
    const RIGHT: &str = "s3ntinel-pw-XYZ";
    const WRONG: &str = "wrong-s3ntinel";
    let mut checks = Checks::default();
    let server = spawn(RedisServer::builder().password(RIGHT));
    let port = server.port();
    let wrong_url = format!("redis://:{WRONG}@127.0.0.1:{port}/");
    let no_secret = |checks: &mut Checks, what: &str, text: &str| {
        checks.check(
            !text.contains(WRONG) && !text.contains(RIGHT),
            format!("a password in {what}: {text}"),
        );
    };

    let builder = RedisBackend::builder(&wrong_url).io_timeout(common::CALM);
    no_secret(&mut checks, "the builder's Debug", &format!("{builder:?}"));
    let wrong = builder.build().unwrap();
    no_secret(&mut checks, "the backend's Debug", &format!("{wrong:?}"));
    let client = LockClient::new(wrong);
    no_secret(&mut checks, "the client's Debug", &format!("{client:?}"));

    let lock = client.get_lock(&unique_name("pw")).unwrap();
    let r = lock.try_lock();
    if let Err(e) = &r {
        no_secret(&mut checks, "the try_lock error", &error_texts(e));
    }
    checks.kind(r, BackendErrorKind::Auth, "try_lock with a wrong password");
    let r = lock.is_locked();
    if let Err(e) = &r {
        no_secret(&mut checks, "the is_locked error", &error_texts(e));
    }
    checks.kind(r, BackendErrorKind::Auth, "is_locked with a wrong password");

    // Redlock builder, build and errors (one node) do not show it either.
    let rl_builder = Redlock::builder(&[wrong_url.as_str()]);
    no_secret(
        &mut checks,
        "the Redlock builder's Debug",
        &format!("{rl_builder:?}"),
    );
    match rl_builder.build() {
        Ok(rl) => {
            no_secret(&mut checks, "the Redlock's Debug", &format!("{rl:?}"));
            let c = LockClient::new(rl);
            let r = c.get_lock(&unique_name("pw")).unwrap().try_lock();
            if let Err(e) = &r {
                no_secret(&mut checks, "the Redlock error", &error_texts(e));
            }
            checks.kind(
                r,
                BackendErrorKind::Auth,
                "Redlock try_lock, wrong password",
            );
        }
        Err(e) => no_secret(&mut checks, "the Redlock build error", &error_texts(&e)),
    }

    // With the right password everything works, and nothing shows it.
    let right_url = server.url();
    assert!(
        right_url.contains(RIGHT),
        "the fixture URL carries the password"
    );
    let good = backend(&right_url);
    let d = format!("{good:?} {:?}", RedisBackend::builder(&right_url));
    no_secret(&mut checks, "Debug output", &d);
    let client = LockClient::new(good);
    no_secret(&mut checks, "the client's Debug", &format!("{client:?}"));
    let lock = client.get_lock(&unique_name("pw")).unwrap();
    let guard = lock.try_lock().unwrap().expect("a free lock");
    assert!(lock.is_locked().unwrap());
    no_secret(&mut checks, "Debug output", &format!("{guard:?} {lock:?}"));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());

    let logs = mark.lines();
    // The capture works: this test's server and its failed connections were logged.
    assert!(
        logs.iter().any(|l| l.contains(&port.to_string())),
        "nothing about port {port} in {} captured log lines",
        logs.len()
    );
    for line in &logs {
        no_secret(&mut checks, "the log", line);
    }
    checks.finish();
}

// ---------------------------------------------------------------------------------------
// 3. Authentication failures are not retried
// ---------------------------------------------------------------------------------------

#[test]
fn auth_errors_are_returned_at_once_not_retried_for_the_error_timeout() {
    let _serial = serial();
    let mut checks = Checks::default();
    let server = spawn(RedisServer::builder().password("right-pw"));
    let wrong = format!("redis://:wrong-pw@127.0.0.1:{}/", server.port());
    // No password at all (the server requires one): NOAUTH, also Auth.
    let none = format!("redis://127.0.0.1:{}/", server.port());
    for (url, what) in [(wrong, "wrong password"), (none, "no password")] {
        let client = LockClient::new(backend(&url));
        let lock = client.get_lock(&unique_name("auth")).unwrap();
        let start = Instant::now();
        let r = lock.lock();
        let elapsed = start.elapsed();
        checks.kind(r, BackendErrorKind::Auth, &format!("lock() with {what}"));
        checks.check(
            elapsed < Duration::from_secs(3),
            format!(
                "lock() with {what} took {elapsed:?}: an auth failure must not be retried \
                 (error timeout 10 s)"
            ),
        );
    }
    checks.finish();
}

// ---------------------------------------------------------------------------------------
// 4. Foreign keys at the lock name
// ---------------------------------------------------------------------------------------

#[test]
fn foreign_keys_at_the_lock_name_are_reported_not_waited_on() {
    let _serial = serial();
    let server = spawn(RedisServer::builder());
    let mut admin = server.connection();
    // With fencing the single instance acquires with the script; without, with a plain
    // SET ... NX GET: both must spot foreign keys.
    for fencing in [true, false] {
        let client = LockClient::new(
            RedisBackend::builder(&server.url())
                .fencing(fencing)
                .io_timeout(common::CALM)
                .connect_timeout(common::CALM)
                .build()
                .unwrap(),
        );
        foreign_keys_are_reported(&client, &mut admin);
    }
}

fn foreign_keys_are_reported(client: &LockClient, admin: &mut redis::Connection) {
    // A list.
    let list = unique_name("list");
    let _: i64 = query(admin, redis::cmd("LPUSH").arg(lock_key(&list)).arg("x"));
    let lock = client.get_lock(&list).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::UnexpectedKey, "list at the lock name");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::UnexpectedKey,
        "is_locked",
    );
    let r = lock.remaining_lease();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "remaining_lease");
    let r = lock.force_unlock();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "force_unlock on a list");
    let len: i64 = query(admin, redis::cmd("LLEN").arg(lock_key(&list)));
    assert_eq!(len, 1, "the foreign list was modified");
    assert_eq!(pttl(admin, &lock_key(&list)), -1);
    // (The counter next to it may have counted the refused attempts: it is dlm's own key,
    // and no token was handed out.)

    // A string without expiry (not written by dlm).
    let plain = unique_name("plain");
    let _: () = query(admin, redis::cmd("SET").arg(lock_key(&plain)).arg("v"));
    let lock = client.get_lock(&plain).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::UnexpectedKey, "string without TTL");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    expect_kind(
        lock.is_locked(),
        BackendErrorKind::UnexpectedKey,
        "is_locked",
    );
    let r = lock.remaining_lease();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "remaining_lease");
    let value: String = query(admin, redis::cmd("GET").arg(lock_key(&plain)));
    assert_eq!(value, "v", "the foreign value was modified");
    assert_eq!(pttl(admin, &lock_key(&plain)), -1, "an expiry was set");

    // A blocking lock() is not stuck on it either (not transient: no retries).
    let start = Instant::now();
    expect_kind(lock.lock(), BackendErrorKind::UnexpectedKey, "lock()");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());

    // A hash too.
    let hash = unique_name("hash");
    let _: i64 = query(
        admin,
        redis::cmd("HSET").arg(lock_key(&hash)).arg("f").arg("v"),
    );
    let lock = client.get_lock(&hash).unwrap();
    expect_kind(lock.try_lock(), BackendErrorKind::UnexpectedKey, "hash");
    let r = lock.force_unlock();
    expect_kind(r, BackendErrorKind::UnexpectedKey, "force_unlock on a hash");
    assert!(exists(admin, &lock_key(&hash)));
}

// ---------------------------------------------------------------------------------------
// 5. OOM
// ---------------------------------------------------------------------------------------

#[test]
fn out_of_memory_is_reported_as_out_of_memory() {
    let _serial = serial();
    let server = spawn(
        RedisServer::builder()
            .arg("--maxmemory-policy")
            .arg("noeviction"),
    );
    let mut admin = server.connection();
    let client = client(&server.url());
    let name = unique_name("oom");
    let lock = client.get_lock(&name).unwrap();
    // Warm up: the connection exists before memory runs out.
    let warm = lock.try_lock().unwrap().expect("free");
    let first = warm.fencing_token().expect("fenced");
    warm.unlock().unwrap();

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1"),
    );
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    let e = expect_kind(r, BackendErrorKind::OutOfMemory, "acquire at maxmemory 1");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert!(!e.is_transient());
    assert!(
        !exists(&mut admin, &lock_key(&name)),
        "a lock key was written"
    );
    // A name in another slot as well (its fencing stream does not exist yet).
    let fresh = client.get_lock(&unique_name("oom")).unwrap();
    expect_kind(
        fresh.try_lock(),
        BackendErrorKind::OutOfMemory,
        "fresh name",
    );

    let _: () = query(
        &mut admin,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"),
    );
    let guard = lock.try_lock().unwrap().expect("free again after the OOM");
    assert!(
        guard.fencing_token().ok() > Some(first),
        "tokens go on increasing"
    );
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 6. READONLY
// ---------------------------------------------------------------------------------------

#[test]
fn a_read_only_replica_is_reported_as_read_only() {
    let _serial = serial();
    let master = spawn(RedisServer::builder());
    let replica = spawn(RedisServer::builder());
    let mut admin = replica.connection();
    let _: () = query(
        &mut admin,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master.port()),
    );
    common::wait_until(Duration::from_secs(10), "replica link up", || {
        let info: String = query(&mut admin, redis::cmd("INFO").arg("replication"));
        info_field(&info, "master_link_status").as_deref() == Some("up")
    });

    let client = client(&replica.url());
    let lock = client.get_lock(&unique_name("ro")).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    expect_kind(r, BackendErrorKind::ReadOnly, "acquire on a replica");
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    // Reads still work on a replica.
    assert!(!lock.is_locked().unwrap());

    // The master takes locks, and the replica then sees them.
    let on_master = self::client(&master.url());
    let name = unique_name("ro");
    let guard = on_master
        .get_lock(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .unwrap();
    let on_replica = client.get_lock(&name).unwrap();
    common::wait_until(Duration::from_secs(5), "replicated lock", || {
        on_replica.is_locked().unwrap()
    });
    guard.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 7. NOPERM
// ---------------------------------------------------------------------------------------

#[test]
fn acl_denials_are_reported_as_permission_errors() {
    let _serial = serial();
    let mut checks = Checks::default();
    let server = spawn(
        RedisServer::builder()
            .acl_user("noeval", "on >pw1 ~* &* +@all -evalsha -eval")
            .acl_user("otherkeys", "on >pw2 ~other:* &* +@all")
            .acl_user("noload", "on >pw3 ~* &* +@all -script")
            .acl_user("noget", "on >pw4 ~* &* +@all -get")
            .acl_user("noset", "on >pw5 ~* &* +@all -set")
            .acl_user("noxadd", "on >pw6 ~* &* +@all -xadd")
            .credentials("noeval", "pw1"),
    );
    let port = server.port();
    let url = |user: &str, pw: &str| format!("redis://{user}:{pw}@127.0.0.1:{port}/");
    assert_eq!(server.url(), url("noeval", "pw1"));
    let mut admin = server.connection();

    // Scripts denied (not loaded yet and the NOSCRIPT fallback, SCRIPT LOAD, denied; or
    // EVALSHA and EVAL denied, checked by the server before the script runs) or GET
    // denied (the scripts read the holder with GET), with fencing and without. Taking a
    // free lock needs neither (the plain SET NX, fenced or not), so it succeeds; the
    // denial shows at the first call that needs one (the token's draw, inspect,
    // release): it is reported at once, and the key keeps its lease, so nothing is left
    // behind for good.
    for (user, pw, what, fencing) in [
        ("noload", "pw3", "SCRIPT LOAD denied", false),
        ("noload", "pw3", "SCRIPT LOAD denied, fenced", true),
        ("noeval", "pw1", "EVALSHA denied", false),
        ("noeval", "pw1", "EVALSHA denied, fenced", true),
        ("noget", "pw4", "GET denied", false),
        ("noget", "pw4", "GET denied, fenced", true),
    ] {
        let name = unique_name("perm");
        let c = LockClient::new(
            RedisBackend::builder(&url(user, pw))
                .io_timeout(common::CALM)
                .fencing(fencing)
                .build()
                .unwrap(),
        );
        let lock = c
            .get_lock(&name)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap();
        match lock.try_lock_timeout(Duration::from_secs(5)) {
            Ok(Some(guard)) => {
                checks.kind(
                    guard.fencing_token(),
                    if fencing {
                        BackendErrorKind::Permission
                    } else {
                        BackendErrorKind::Unsupported
                    },
                    &format!("fencing token, {what}"),
                );
                checks.kind(
                    lock.is_locked(),
                    BackendErrorKind::Permission,
                    &format!("is_locked, {what}"),
                );
                let start = Instant::now();
                checks.kind(
                    guard.unlock(),
                    BackendErrorKind::Permission,
                    &format!("unlock, {what}"),
                );
                checks.prompt(start, &format!("unlock, {what}"));
                let ttl: i64 = query(&mut admin, redis::cmd("PTTL").arg(lock_key(&name)));
                checks.check(
                    (1..=30_000).contains(&ttl),
                    format!("{what}: the unreleasable key must keep its lease, PTTL {ttl}"),
                );
                let _: i64 = query(&mut admin, redis::cmd("DEL").arg(lock_key(&name)));
            }
            other => checks.0.push(format!("{what}: a free lock: got {other:?}")),
        }
    }

    // Keys outside the user's patterns (checked against KEYS before the script runs).
    let c = client(&url("otherkeys", "pw2"));
    let lock = c.get_lock(&unique_name("perm")).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    checks.kind(r, BackendErrorKind::Permission, "key pattern denied");
    checks.prompt(start, "key pattern denied");
    checks.kind(
        lock.is_locked(),
        BackendErrorKind::Permission,
        "is_locked, keys denied",
    );
    let r = lock.force_unlock();
    checks.kind(r, BackendErrorKind::Permission, "force_unlock, keys denied");

    // XADD denied: the acquisition (no XADD) succeeds, the token's draw is refused
    // inside the fence script, and the lock is released as usual.
    let name = unique_name("perm");
    let c = client(&url("noxadd", "pw6"));
    match c.get_lock(&name).unwrap().try_lock() {
        Ok(Some(guard)) => {
            checks.kind(
                guard.fencing_token(),
                BackendErrorKind::Permission,
                "fencing token, XADD denied",
            );
            checks.check(
                guard.unlock().is_ok(),
                "XADD denied: the release failed".into(),
            );
        }
        other => checks
            .0
            .push(format!("XADD denied: a free lock: got {other:?}")),
    }
    // SET denied: the plain SET is refused.
    let what = "SET denied";
    let c = client(&url("noset", "pw5"));
    let lock = c.get_lock(&name).unwrap();
    let start = Instant::now();
    let r = lock.try_lock_timeout(Duration::from_secs(5));
    checks.kind(r, BackendErrorKind::Permission, what);
    checks.prompt(start, what);
    checks.check(
        !exists(&mut admin, &lock_key(&name)),
        format!("{what}: a denied acquisition left a lock key"),
    );
    checks.finish();
}

/// dlm-redis/src/lib.rs, "Minimal ACL", with the default prefix.
const MINIMAL_ACL: &str = "+eval +evalsha +script|load +ping +info +get +set +pexpire +pttl +xadd +append +del +publish +psubscribe ~dlm:* &dlm:*";

/// Locks and unlocks one name four times as a user with `rules`, another client trying
/// each time; returns the tokens.
fn lock_as_user_with(rules: &str) -> Vec<u64> {
    let server = spawn(
        RedisServer::builder()
            .acl_user("user", &format!("on >pw {rules}"))
            .credentials("user", "pw"),
    );
    let url = server.url();
    let (c1, c2) = (client(&url), client(&url));
    let name = unique_name("perm");
    let lock = c1.get_lock(&name).unwrap();
    let mut tokens = Vec::new();
    for round in 0..4 {
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{rules}: must be enough to lock: {e}"))
            .expect("free");
        tokens.push(guard.fencing_token().expect("fenced").get());
        assert!(lock.is_locked().unwrap());
        assert!(
            c2.get_lock(&name).unwrap().try_lock().unwrap().is_none(),
            "round {round}: two holders"
        );
        guard.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must increase: {tokens:?}"
    );
    let mut admin = server.connection();
    assert!(!exists(&mut admin, &lock_key(&name)));
    tokens
}

#[test]
fn the_documented_minimal_acl_is_enough_to_lock() {
    let tokens = lock_as_user_with(MINIMAL_ACL);
    assert_eq!(tokens.len(), 4);
}
