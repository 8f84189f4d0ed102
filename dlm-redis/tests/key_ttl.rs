//! Every key dlm writes carries a TTL.
mod common;

use dlm_core::{Lock, LockClient};

#[test]
fn every_lock_key_has_a_ttl() {
    let single = common::Single::new();
    let client = LockClient::builder(dlm_testkit::Fixture::backend(&single))
        .build()
        .unwrap();
    let guards: Vec<_> = (0..20)
        .map(|i| client.get_lock(&format!("k{i}")).unwrap().lock().unwrap())
        .collect();
    let mut admin = single.server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("dlm:*").query(&mut admin).unwrap();
    let lock_keys = keys.iter().filter(|k| !k.starts_with("dlm:fence:")).count();
    assert_eq!(lock_keys, 20);
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut admin).unwrap();
        assert!(ttl > 0, "{key} has PTTL {ttl}");
    }
    drop(guards);
    let left: Vec<String> = redis::cmd("KEYS").arg("dlm:*").query(&mut admin).unwrap();
    assert!(left.iter().all(|k| k.starts_with("dlm:fence:")), "{left:?}");
}
