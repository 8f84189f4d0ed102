//! What a backend fixture provides to the conformance cases ([`Fixture`]), and the
//! [`conformance_tests!`](crate::conformance_tests) macro that stamps one `#[test]` per case.

use std::sync::Arc;

use dlm_core::backend::LockBackend;

/// What a conformance case needs from the backend under test.
pub trait Fixture {
    /// A backend over the store under test. Every call must reach the same store (the
    /// same servers); a case builds one client per simulated process.
    fn backend(&self) -> Arc<dyn LockBackend>;

    /// Whether the backend issues fencing tokens.
    fn fencing(&self) -> bool {
        true
    }

    /// How many fencing keys the store holds now (the Redis fencing streams under the
    /// backend's prefix), or `None` for a store without such keys, or one the fixture
    /// cannot count. An acquisition whose token is never read must not write one.
    fn fencing_keys(&self) -> Option<usize> {
        None
    }

    /// How many keys of the backend the store holds now that have no expiry, or `None`
    /// for a store without expiring keys, or one the fixture cannot count. dlm never
    /// leaves a key without one.
    fn keys_without_expiry(&self) -> Option<usize> {
        None
    }

    /// Whether the backend supports release hints ([`LockBackend::watch`]).
    fn watch(&self) -> bool {
        true
    }
}

/// Servers shared by every case of one test binary: made by the first case that asks and
/// kept until the process ends. Cases use names of their own (and a fixture that counts
/// keys gives each case a key prefix of its own), so they may share servers; a topology
/// that takes seconds to form (a Redis Cluster, Sentinel, an etcd cluster) is then started
/// once per binary instead of once per case. The servers end with the test process: the
/// testkit starts every server with a parent-death signal (see
/// [`redis_server`](crate::redis_server)), so no drop is needed.
///
/// ```no_run
/// use dlm_testkit::Shared;
/// use dlm_testkit::etcd::EtcdCluster;
///
/// static CLUSTER: Shared<EtcdCluster> = Shared::new();
/// let cluster = CLUSTER.get(|| EtcdCluster::spawn(3));
/// # let _ = cluster;
/// ```
#[derive(Debug)]
pub struct Shared<T>(std::sync::OnceLock<Arc<T>>);

impl<T> Shared<T> {
    /// Nothing made yet.
    pub const fn new() -> Self {
        Shared(std::sync::OnceLock::new())
    }

    /// The shared value, made by `make` on the first call.
    pub fn get(&self, make: impl FnOnce() -> T) -> Arc<T> {
        self.0.get_or_init(|| Arc::new(make())).clone()
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Shared::new()
    }
}

/// Stamps one `#[test]` per conformance case. The argument is an expression that builds
/// a [`Fixture`]; it is evaluated once per test, so each test gets a fresh fixture (and,
/// for Redis, its own servers).
///
/// ```
/// # use std::sync::Arc;
/// # use dlm_core::backend::LockBackend;
/// struct Memory(dlm_memory::MemoryBackend);
/// impl dlm_testkit::Fixture for Memory {
///     fn backend(&self) -> Arc<dyn LockBackend> { Arc::new(self.0.clone()) }
/// }
/// dlm_testkit::conformance_tests!(Memory(dlm_memory::MemoryBackend::new()));
/// # fn main() {}
/// ```
///
/// `conformance_tests!(ignore = "why", EXPR)` marks every test `#[ignore = "why"]`, for
/// fixtures that need something a developer's machine may lack (a test that cannot run
/// must say so, never pass without running): `cargo test -- --ignored` runs them, and
/// the fixture should then fail loudly if what it needs is missing.
///
/// The cases of the semaphore and the read-write lock run too. For a backend that keeps
/// neither, `conformance_tests!(mutex_only = "why", EXPR)` lists them as ignored with that
/// reason in every run (run anyway, each checks that the backend refuses them) and checks
/// that the backend refuses both with a typed error;
/// `conformance_tests!(ignore = "why", mutex_only = "why", EXPR)` combines the two. The
/// election cases run on every backend that keeps semaphores; a backend that keeps them
/// but no elections says so with `no_elections = "why"` (its election cases are listed
/// as ignored with the reason, and a case checks that `get_election` is refused).
#[macro_export]
macro_rules! conformance_tests {
    (ignore = $why:literal, $fixture:expr) => {
        $crate::conformance_tests!(@all (all(), $why) $fixture);
        $crate::conformance_tests!(@primitives (all(), $why) $fixture);
        $crate::conformance_tests!(@elections (all(), $why) $fixture);
    };
    (no_elections = $why:literal, $fixture:expr) => {
        $crate::conformance_tests!(@all (any(), "") $fixture);
        $crate::conformance_tests!(@primitives (any(), "") $fixture);
        $crate::conformance_tests!(@no_elections $why, $fixture);
    };
    (mutex_only = $why:literal, $fixture:expr) => {
        $crate::conformance_tests!(@all (any(), "") $fixture);
        $crate::conformance_tests!(@skipped $why, $fixture);
        $crate::conformance_tests!(@cases read (any(), "") $fixture;
            unsupported_primitives_are_refused_at_the_call
        );
        $crate::conformance_tests!(@no_elections $why, $fixture);
    };
    (ignore = $why:literal, mutex_only = $why2:literal, $fixture:expr) => {
        $crate::conformance_tests!(@all (all(), $why) $fixture);
        $crate::conformance_tests!(@skipped $why2, $fixture);
    };
    // The election cases of a backend that keeps no elections: listed as ignored with the
    // reason (run anyway, each checks the refusal), and the refusal checked.
    (@no_elections $why:literal, $fixture:expr) => {
        $crate::conformance_tests!(@cases read (any(), "") $fixture;
            elections_unsupported_are_refused_at_the_call
        );
        $crate::conformance_tests!(@skip_with elections_unsupported_are_refused_at_the_call, $why, $fixture;
            election_one_leader_at_a_time,
            election_leader_is_seen_by_everyone,
            election_resign_wakes_the_next_candidate,
            election_observers_see_every_change_in_order,
            election_lost_lead_is_signalled,
            election_refuses_bad_values_before_io
        );
    };
    (@elections ($pred:meta, $why:literal) $fixture:expr) => {
        $crate::conformance_tests!(@cases read ($pred, $why) $fixture;
            elections_unsupported_are_refused_at_the_call,
            election_leader_is_seen_by_everyone,
            election_refuses_bad_values_before_io
        );
        $crate::conformance_tests!(@cases write ($pred, $why) $fixture;
            election_one_leader_at_a_time,
            election_resign_wakes_the_next_candidate,
            election_observers_see_every_change_in_order,
            election_lost_lead_is_signalled
        );
    };
    (@skip_with $check:ident, $why:literal, $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[ignore = $why]
            #[test]
            fn $case() {
                let fixture = $fixture;
                $crate::conformance::$check(&fixture);
            }
        )*
    };
    // The primitives' cases of a backend that keeps neither: listed as ignored with the
    // reason; run anyway (`--ignored`), each checks that the backend refuses them.
    (@skipped $why:literal, $fixture:expr) => {
        $crate::conformance_tests!(@skip $why, $fixture;
            primitives_refuse_bad_input,
            semaphore_admits_at_most_its_permits,
            semaphore_permit_count_is_fixed_while_held,
            semaphore_second_permit_on_a_thread_is_refused,
            semaphore_leaked_permit_comes_back_with_its_lease,
            rw_readers_share_and_a_writer_is_alone,
            rw_upgrade_is_refused_and_downgrade_keeps_the_hold,
            primitive_tokens_increase,
            primitives_leave_no_key_without_expiry,
            semaphore_watchdog_keeps_a_permit,
            semaphore_release_wakes_a_waiter,
            rw_a_writer_is_not_starved_by_readers,
            rw_a_writer_that_gave_up_holds_readers_back_briefly,
            rw_release_wakes_readers_and_writers
        );
    };
    (@skip $why:literal, $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[ignore = $why]
            #[test]
            fn $case() {
                let fixture = $fixture;
                $crate::conformance::unsupported_primitives_are_refused_at_the_call(&fixture);
            }
        )*
    };
    ($fixture:expr) => {
        $crate::conformance_tests!(@all (any(), "") $fixture);
        $crate::conformance_tests!(@primitives (any(), "") $fixture);
        $crate::conformance_tests!(@elections (any(), "") $fixture);
    };
    (@primitives ($pred:meta, $why:literal) $fixture:expr) => {
        $crate::conformance_tests!(@cases read ($pred, $why) $fixture;
            primitives_refuse_bad_input,
            semaphore_admits_at_most_its_permits,
            semaphore_permit_count_is_fixed_while_held,
            semaphore_second_permit_on_a_thread_is_refused,
            semaphore_leaked_permit_comes_back_with_its_lease,
            rw_readers_share_and_a_writer_is_alone,
            rw_upgrade_is_refused_and_downgrade_keeps_the_hold,
            primitive_tokens_increase,
            primitives_leave_no_key_without_expiry
        );
        $crate::conformance_tests!(@cases write ($pred, $why) $fixture;
            semaphore_watchdog_keeps_a_permit,
            semaphore_release_wakes_a_waiter,
            rw_a_writer_is_not_starved_by_readers,
            rw_a_writer_that_gave_up_holds_readers_back_briefly,
            rw_release_wakes_readers_and_writers
        );
    };
    // `($pred, $why)`: the tests are `#[ignore = $why]` when the cfg predicate holds
    // (`all()` always does, `any()` never).
    (@all ($pred:meta, $why:literal) $fixture:expr) => {
        $crate::conformance_tests!(@cases read ($pred, $why) $fixture;
            mutual_exclusion_no_lost_updates,
            try_lock_never_blocks,
            try_lock_timeout_honours_its_timeout,
            zero_timeout_is_exactly_one_attempt,
            unbounded_timeout_waits_without_overflow,
            lock_again_after_unlock,
            extend_after_expiry_fails_and_does_not_recreate,
            release_by_non_owner_is_refused,
            double_unlock_is_not_held,
            reentrant_same_thread,
            reentrant_other_thread_blocks,
            reentrant_partial_unlock_keeps_the_lock,
            non_reentrant_mode_refuses_second_hold,
            guard_dropped_during_panic_releases,
            leaked_guard_expires,
            guard_moves_to_another_thread,
            force_unlock_frees_and_the_holder_learns,
            introspection,
            fencing_tokens_strictly_increase,
            bad_input_is_rejected_before_io,
            id_generator_has_no_duplicates,
            a_paused_holder_is_fenced_off,
            acquire_is_idempotent_for_its_owner,
            release_gives_back_every_hold,
            reentry_does_no_io,
            a_token_read_after_the_lock_was_lost_is_an_error,
            the_token_is_stable_within_a_hold,
            an_unread_token_writes_no_fencing_key,
            a_read_token_comes_with_the_next_acquisition,
            a_mispredicted_draw_is_released_with_the_lock,
            token_draw_settings_are_followed,
            a_step_whose_reply_was_lost_leaves_no_hold,
            a_release_that_failed_is_sent_again,
            multi_lock_takes_every_name_or_none,
            multi_lock_refuses_bad_input_before_io,
            multi_lock_gives_each_name_its_token
        );
        $crate::conformance_tests!(@cases write ($pred, $why) $fixture;
            renewals_of_every_kind_share_one_round,
            multi_locks_in_opposite_orders_never_deadlock,
            multi_lock_waits_and_is_woken_by_a_release,
            multi_lock_reports_which_member_was_lost,
            expiry_frees_the_lock,
            extend_prolongs_the_lease,
            interrupt_wakes_a_waiter,
            release_wakes_a_waiter,
            watchdog_keeps_the_lock_while_held,
            watchdog_respects_max_hold,
            a_lost_lock_is_signalled,
            a_released_lock_is_not_reported_lost,
            release_between_failed_try_and_wait_is_not_lost,
            one_release_wakes_one_of_sixteen_waiters,
            local_waiters_are_served_in_turn,
            try_lock_never_queues,
            hand_over_within_a_process_keeps_every_rule
        );
    };
    (@cases $mode:ident ($pred:meta, $why:literal) $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[cfg_attr($pred, ignore = $why)]
            #[test]
            fn $case() {
                let _slot = $crate::TIMING.$mode();
                let fixture = $fixture;
                $crate::conformance::$case(&fixture);
            }
        )*
    };
}
