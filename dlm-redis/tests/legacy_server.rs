//! Servers older than 7.0 refuse `SET ... NX GET`: the backends notice on the first
//! acquisition, acquire with the script from then on, and never send the plain request
//! again. Real Redis 6.2 servers (`scripts/legacy-redis-server`).
mod common;

use dlm_core::{Lock, LockClient};

/// `calls` and `failed_calls` of `command` in `INFO commandstats`.
fn calls(server: &dlm_testkit::redis_server::RedisServer, command: &str) -> (u64, u64) {
    (
        common::command_stat(server, command, "calls"),
        common::command_stat(server, command, "failed_calls"),
    )
}

/// Twenty rounds on the names `name(i)`: client a takes the lock, client b (same backend)
/// is refused, a releases. Returns a's fencing tokens.
fn take_turns(
    server: &dlm_testkit::redis_server::RedisServer,
    fencing: bool,
    name: impl Fn(usize) -> String,
) -> Vec<Option<u64>> {
    let backend = dlm_redis::RedisBackend::builder(&server.url())
        .fencing(fencing)
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let (a, b) = (LockClient::new(backend.clone()), LockClient::new(backend));
    (0..20)
        .map(|i| {
            let name = name(i);
            let guard = a
                .get_lock(&name)
                .unwrap()
                .try_lock()
                .unwrap()
                .expect("free");
            assert!(
                b.get_lock(&name).unwrap().try_lock().unwrap().is_none(),
                "mutual exclusion on Redis 6"
            );
            assert!(guard.is_held());
            let token = guard.fencing_token().ok().map(|t| t.get());
            guard.unlock().unwrap();
            token
        })
        .collect()
}

#[test]
#[ignore = "needs a Redis 6.2 server (DLM_REDIS_LEGACY_SERVER); scripts/test runs these"]
fn a_single_redis_6_is_detected_once_and_locked_with_the_script() {
    let fixture = common::Single::legacy();
    let server = &fixture.server;
    assert!(
        server.info("server").contains("redis_version:6."),
        "not a Redis 6 server"
    );
    take_turns(server, false, |i| format!("legacy-{i}"));
    // The one refused SET is the detection (then the same acquisition ran the script);
    // every other acquisition went straight to the script: 20 by a, 20 contended by b,
    // 20 releases. The two failed EVALSHA are the first use of each script (NOSCRIPT,
    // then loaded).
    let (set_calls, set_failed) = calls(server, "set");
    assert_eq!(set_failed, 1, "exactly one SET ... NX GET was refused");
    assert_eq!(
        set_calls,
        1 + 20 + 20,
        "the refused SET and the scripts' SET NX (taken by a, refused to b)"
    );
    let (evalsha, evalsha_failed) = calls(server, "evalsha");
    assert_eq!(evalsha_failed, 2, "NOSCRIPT once per script");
    assert_eq!(
        evalsha - evalsha_failed,
        20 + 20 + 20,
        "acquisitions and releases"
    );
}

#[test]
#[ignore = "needs a Redis 6.2 server (DLM_REDIS_LEGACY_SERVER); scripts/test runs these"]
fn a_fenced_single_redis_6_is_detected_once_and_its_tokens_increase() {
    let fixture = common::Single::legacy();
    let server = &fixture.server;
    let tokens: Vec<u64> = take_turns(server, true, |i| format!("legacy-fenced-{}", i % 2))
        .into_iter()
        .map(|t| t.expect("fenced"))
        .collect();
    for parity in 0..2 {
        let own: Vec<u64> = tokens.iter().skip(parity).step_by(2).copied().collect();
        assert!(
            own.windows(2).all(|w| w[0] < w[1]),
            "tokens of one name must increase: {own:?}"
        );
    }
    // Since tokens are drawn when read, a fenced acquisition whose token is not
    // predicted to be read (each name's first) is the plain SET ... NX GET, as an
    // unfenced one: refused once (the detection), then scripts only.
    assert_eq!(
        calls(server, "set").1,
        1,
        "not exactly one SET ... NX GET refused"
    );

    // A fencing stream that is not a stream: the lock is taken (tokens are drawn when
    // read), reading its token is the typed error, and the foreign key is left as it was.
    let mut admin = server.connection();
    let name = "legacy-badfence";
    let backend = dlm_redis::RedisBackend::builder(&server.url())
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let stream = backend.keys(name).unwrap().fencing_stream;
    let _: () = redis::cmd("SET")
        .arg(&stream)
        .arg("not-a-stream")
        .query(&mut admin)
        .unwrap();
    let client = LockClient::new(backend);
    let guard = client
        .get_lock(name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    let e = guard.fencing_token().unwrap_err();
    assert_eq!(
        e.backend_kind(),
        Some(dlm_core::BackendErrorKind::UnexpectedKey),
        "{e}"
    );
    let foreign: String = redis::cmd("GET").arg(&stream).query(&mut admin).unwrap();
    assert_eq!(foreign, "not-a-stream", "the foreign key was changed");
    guard.unlock().unwrap();
}
