//! The lease a holder may rely on: `valid_until = start + lease - (lease x drift_factor +
//! 2 ms)`, where `start` is when the acquisition's first request went out (Redlock:
//! whatever the rounds that follow).
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_core::{Lock, LockClient};
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::unique_name;

const LEASE: Duration = Duration::from_secs(10);

/// Takes a lock with a fixed `LEASE` and checks its validity against the formula, from
/// the instants just before and after the call.
fn check(backend: Arc<dyn LockBackend>, factor: f64, what: &str) {
    let client = LockClient::builder(backend).lease(LEASE).build().unwrap();
    let drift = LEASE.mul_f64(factor) + Duration::from_millis(2);
    for _ in 0..5 {
        let lock = client.get_lock(&unique_name("validity")).unwrap();
        let before = Instant::now();
        let guard = lock.lock().unwrap();
        let after = Instant::now();
        let valid_until = guard.valid_until();
        assert!(
            valid_until >= before + LEASE - drift && valid_until <= after + LEASE - drift,
            "{what}: valid until {:?} after the call began; the formula says {:?} ({:?} of drift)",
            valid_until - before,
            LEASE - drift,
            drift
        );
        guard.unlock().unwrap();
    }
}

#[test]
fn the_lease_is_reduced_by_the_drift_allowance_from_the_start_of_the_request() {
    let single = common::Single::new();
    let cluster = common::Cluster::new(3);
    for factor in [0.0, 0.01, 0.2] {
        let backend = RedisBackend::builder(&single.server.url())
            .drift_factor(factor)
            .build()
            .unwrap();
        check(
            Arc::new(backend),
            factor,
            &format!("single, factor {factor}"),
        );
        let redlock = Redlock::builder(&cluster.nodes.urls())
            .drift_factor(factor)
            .io_timeout(common::CALM)
            .build()
            .unwrap();
        check(
            Arc::new(redlock),
            factor,
            &format!("Redlock, factor {factor}"),
        );
    }
}
