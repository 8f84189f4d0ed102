//! The shared conformance suite against one real redis-server.
mod common;
dlm_testkit::conformance_tests!(common::Single::new());

/// Two clients taking the multi-locks {a, b} and {b, a} in a loop for 10 s: both make
/// progress, none waits out its 10 s timeout (no deadlock), no overlap.
#[test]
fn multi_locks_in_opposite_orders_for_ten_seconds() {
    let done = dlm_testkit::conformance::multi_locks_in_opposite_orders_for(
        &common::Single::new(),
        std::time::Duration::from_secs(10),
    );
    eprintln!("sets taken by each side in 10 s: {done:?}");
}
