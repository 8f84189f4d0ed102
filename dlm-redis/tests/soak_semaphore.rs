//! Soak (the reliability plan's single-Redis case, shortened for CI) of a semaphore with 3 permits on each name: never more than 3 holders at once; tokens
//! in order; see `common::soak::through_a_pause_and_a_restart` for the faults and what is
//! checked. (The only test in its binary: no other test's threads disturb the count.)
mod common;

use common::soak::{Take, through_a_pause_and_a_restart};

#[test]
fn permits_stay_within_their_count_and_ordered_through_a_pause_and_a_restart() {
    through_a_pause_and_a_restart(Take::Permits(3));
}
