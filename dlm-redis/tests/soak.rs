//! Soak (the reliability plan's single-Redis case, shortened for CI) of the mutex: no two holds overlap; tokens
//! in order; see `common::soak::through_a_pause_and_a_restart` for the faults and what is
//! checked. (The only test in its binary: no other test's threads disturb the count.)
mod common;

use common::soak::{Take, through_a_pause_and_a_restart};

#[test]
fn holds_stay_exclusive_and_ordered_through_a_pause_and_a_restart() {
    through_a_pause_and_a_restart(Take::Mutex);
}
