//! Soak (the reliability plan's single-Redis case, shortened for CI) of read-write locks (one hold in four a write): never a writer beside anyone; tokens
//! in order; see `common::soak::through_a_pause_and_a_restart` for the faults and what is
//! checked. (The only test in its binary: no other test's threads disturb the count.)
mod common;

use common::soak::{Take, through_a_pause_and_a_restart};

#[test]
fn writers_stay_alone_and_ordered_through_a_pause_and_a_restart() {
    through_a_pause_and_a_restart(Take::ReadWrite);
}
