//! Two clients taking the multi-locks {a, b} and {b, a} in a loop for 10 s against one
//! real redis-server: both make progress, none waits out its 10 s timeout (no deadlock),
//! no overlap.
mod common;

use std::time::Duration;

#[test]
fn opposite_orders_for_ten_seconds() {
    let done = dlm_testkit::conformance::multi_locks_in_opposite_orders_for(
        &common::Single::new(),
        Duration::from_secs(10),
    );
    eprintln!("sets taken by each side in 10 s: {done:?}");
}
