//! Servers older than 7.0 refuse `SET ... NX GET`: the backends notice on the first
//! acquisition, acquire with the script from then on, and never send the plain request
//! again. Real Redis 6.2 servers (`scripts/legacy-redis-server`).
mod common;

use dlm_core::{Lock, LockClient};

/// `calls` and `failed_calls` of `command` in `INFO commandstats`.
fn calls(server: &dlm_testkit::redis_server::RedisServer, command: &str) -> (u64, u64) {
    let stats = server.info("commandstats");
    let line = stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .unwrap_or("");
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |v| v.parse().unwrap())
    };
    (field("calls"), field("failed_calls"))
}

#[test]
fn a_single_redis_6_is_detected_once_and_locked_with_the_script() {
    let Some(fixture) = common::Single::legacy() else {
        return;
    };
    let server = &fixture.server;
    assert!(
        server.info("server").contains("redis_version:6."),
        "not a Redis 6 server"
    );
    let backend = dlm_redis::RedisBackend::builder(&server.url())
        .fencing(false)
        .io_timeout(common::CALM)
        .build()
        .unwrap();
    let (a, b) = (LockClient::new(backend.clone()), LockClient::new(backend));
    for i in 0..20 {
        let name = format!("legacy-{i}");
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
        guard.unlock().unwrap();
    }
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
