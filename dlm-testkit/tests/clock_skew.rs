//! Clock jumps on real servers through the shim: TIME, key expiry and stream IDs follow
//! the shifted clock; an unshifted server is unaffected; the shim survives a restart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlm_testkit::redis_server::{RedisServer, require_redis_server};
use dlm_testkit::skew::ClockSkew;

/// The server's `TIME`, minus the real wall clock, in seconds.
fn ahead_by(server: &RedisServer) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    let server = secs as f64 + micros as f64 / 1e6;
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    server - real
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

fn set_px(server: &RedisServer, key: &str, ms: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("v")
        .arg("PX")
        .arg(ms)
        .query(&mut server.connection())
        .unwrap();
}

#[test]
fn time_follows_the_offset_and_other_servers_do_not() {
    require_redis_server();
    let skew = ClockSkew::new();
    let mut skewed = RedisServer::builder().clock_skew(&skew).spawn();
    let plain = RedisServer::spawn();
    assert!(ahead_by(&skewed).abs() < 2.0);
    skew.forward(Duration::from_secs(3600));
    assert!(
        (ahead_by(&skewed) - 3600.0).abs() < 2.0,
        "{}",
        ahead_by(&skewed)
    );
    assert!(ahead_by(&plain).abs() < 2.0);
    skew.back(Duration::from_secs(7200));
    assert!((ahead_by(&skewed) + 3600.0).abs() < 2.0);
    assert_eq!(skew.offset(), -3_600_000_000_000);
    // The shim and its offset survive a restart.
    skewed.restart();
    assert!((ahead_by(&skewed) + 3600.0).abs() < 2.0);
}

#[test]
fn keys_expire_early_when_the_clock_jumps_forward_and_late_when_it_goes_back() {
    require_redis_server();
    let skew = ClockSkew::new();
    let skewed = RedisServer::builder().clock_skew(&skew).spawn();
    let plain = RedisServer::spawn();
    set_px(&skewed, "k", 60_000);
    set_px(&plain, "k", 60_000);
    skew.forward(Duration::from_secs(120));
    assert_eq!(get(&skewed, "k"), None, "expired by the jump");
    assert_eq!(get(&plain, "k").as_deref(), Some("v"));
    skew.set(0);
    set_px(&skewed, "short", 300);
    skew.back(Duration::from_secs(60));
    // Far past its 300 ms by the real clock, still there by the server's.
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < deadline {
        assert_eq!(get(&skewed, "short").as_deref(), Some("v"));
        std::thread::sleep(Duration::from_millis(50));
    }
    skew.set(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while get(&skewed, "short").is_some() {
        assert!(std::time::Instant::now() < deadline, "never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn stream_ids_follow_the_clock() {
    require_redis_server();
    let skew = ClockSkew::new();
    let skewed = RedisServer::builder().clock_skew(&skew).spawn();
    skew.forward(Duration::from_secs(86_400));
    let id: String = redis::cmd("XADD")
        .arg("s")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut skewed.connection())
        .unwrap();
    let ms: u64 = id.split_once('-').unwrap().0.parse().unwrap();
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = ms as i64 - real as i64;
    assert!(
        (ahead - 86_400_000).abs() < 2_000,
        "the stream ID is {ahead} ms ahead"
    );
}
