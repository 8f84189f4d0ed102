//! The conformance suite: what every backend must do, as one `pub fn` per case.
//!
//! Each case takes a [`Fixture`] and panics on a violation. Timing assertions use wide
//! margins (they run on loaded 2-core machines); where a case must know that a thread is
//! blocked, it checks that the thread has not finished within a bounded wait instead of
//! sleeping.
//!
//! The cases are grouped by theme, one file each: the basics, waiting (hints and
//! hand-over), leases (the watchdog and the lost signal), fencing, the semaphore and the
//! read-write lock (primitives), multi-locks (multi), elections (election), and the rules every kind of hold keeps (rules: undo
//! after a lost reply, releases sent again, renewals in one round); the [`Fixture`] trait
//! and the [`conformance_tests!`](crate::conformance_tests) macro are in `fixture.rs`.

mod basics;
mod election;
mod fencing;
pub(crate) mod fixture;
mod leases;
mod multi;
mod primitives;
mod rules;
mod waiting;

pub use basics::{
    acquire_is_idempotent_for_its_owner, bad_input_is_rejected_before_io,
    double_unlock_is_not_held, force_unlock_frees_and_the_holder_learns,
    guard_dropped_during_panic_releases, guard_moves_to_another_thread,
    id_generator_has_no_duplicates, introspection, lock_again_after_unlock,
    mutual_exclusion_no_lost_updates, non_reentrant_mode_refuses_second_hold,
    reentrant_other_thread_blocks, reentrant_partial_unlock_keeps_the_lock, reentrant_same_thread,
    reentry_does_no_io, release_by_non_owner_is_refused, release_gives_back_every_hold,
    try_lock_never_blocks, try_lock_timeout_honours_its_timeout,
    unbounded_timeout_waits_without_overflow, zero_timeout_is_exactly_one_attempt,
};
pub use election::{
    election_leader_is_seen_by_everyone, election_lost_lead_is_signalled,
    election_observers_see_every_change_in_order, election_one_leader_at_a_time,
    election_refuses_bad_values_before_io, election_resign_wakes_the_next_candidate,
    elections_unsupported_are_refused_at_the_call,
};
pub use fencing::{
    a_mispredicted_draw_is_released_with_the_lock, a_paused_holder_is_fenced_off,
    a_read_token_comes_with_the_next_acquisition, a_token_read_after_the_lock_was_lost_is_an_error,
    an_unread_token_writes_no_fencing_key, fencing_tokens_strictly_increase,
    the_token_is_stable_within_a_hold, token_draw_settings_are_followed,
};
pub use leases::{
    a_lost_lock_is_signalled, a_released_lock_is_not_reported_lost, expiry_frees_the_lock,
    extend_after_expiry_fails_and_does_not_recreate, extend_prolongs_the_lease,
    leaked_guard_expires, watchdog_keeps_the_lock_while_held, watchdog_respects_max_hold,
};
pub use multi::{
    multi_lock_gives_each_name_its_token, multi_lock_refuses_bad_input_before_io,
    multi_lock_reports_which_member_was_lost, multi_lock_takes_every_name_or_none,
    multi_lock_waits_and_is_woken_by_a_release, multi_locks_in_opposite_orders_for,
    multi_locks_in_opposite_orders_never_deadlock,
};
pub use primitives::{
    primitive_tokens_increase, primitives_leave_no_key_without_expiry, primitives_refuse_bad_input,
    rw_a_writer_is_not_starved_by_readers, rw_a_writer_that_gave_up_holds_readers_back_briefly,
    rw_readers_share_and_a_writer_is_alone, rw_release_wakes_readers_and_writers,
    rw_upgrade_is_refused_and_downgrade_keeps_the_hold, semaphore_admits_at_most_its_permits,
    semaphore_leaked_permit_comes_back_with_its_lease, semaphore_permit_count_is_fixed_while_held,
    semaphore_release_wakes_a_waiter, semaphore_second_permit_on_a_thread_is_refused,
    semaphore_watchdog_keeps_a_permit, unsupported_primitives_are_refused_at_the_call,
};
pub use rules::{
    a_release_that_failed_is_sent_again, a_step_whose_reply_was_lost_leaves_no_hold,
    renewals_of_every_kind_share_one_round,
};
pub use waiting::{
    hand_over_within_a_process_keeps_every_rule, interrupt_wakes_a_waiter,
    local_waiters_are_served_in_turn, one_release_wakes_one_of_sixteen_waiters,
    release_between_failed_try_and_wait_is_not_lost, release_wakes_a_waiter, try_lock_never_queues,
};

use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use dlm_core::LockClient;

use crate::Fixture;

/// Generous bound for "returns promptly" on a loaded CI machine.
const PROMPT: Duration = Duration::from_secs(2);

fn client(f: &dyn Fixture) -> LockClient {
    LockClient::builder(f.backend()).build().unwrap()
}

fn client_with_lease(f: &dyn Fixture, lease: Duration) -> LockClient {
    LockClient::builder(f.backend())
        .lease(lease)
        .build()
        .unwrap()
}

/// Asserts that `rx` receives nothing for `within`: the thread behind it is blocked.
fn assert_still_blocked<T>(rx: &crossbeam_channel::Receiver<T>, within: Duration, what: &str) {
    match rx.recv_timeout(within) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(_) => panic!("{what}: finished while it should still be blocked"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: thread died"),
    }
}
