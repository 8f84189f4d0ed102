#![doc = concat!(r#"
# Writing a backend

A backend is a lock store behind the [`LockBackend`](dlm_core::LockBackend) trait. The
front ([`LockClient`](dlm_core::LockClient)) does everything else once, for every backend:
waiting and deadlines, interrupts, re-entrancy, guards, the watchdog's renewals, the lost
signal. A backend makes one bounded attempt per call: it never sleeps, never retries,
never waits for a lock.

## What a backend must do

- [`try_acquire(name, owner, ttl)`](dlm_core::LockBackend::try_acquire): take `name` for
  `owner` if it is free, with an expiry `ttl` from now, and return
  [`Acquire::Acquired`](dlm_core::Acquire::Acquired) with a
  [`Lease`](dlm_core::Lease) whose `valid_until` is no later than the real expiry
  (count it from before the request was sent; a network backend subtracts its clock-drift
  allowance). If `owner` already holds it (a retry whose reply was lost), refresh the
  lease and say acquired. If someone else holds it, return
  [`Acquire::Held { retry_after }`](dlm_core::Acquire::Held) with the holder's remaining
  lease when you know it: a waiter without release hints sleeps until then. Contention
  is never an error.
- [`extend`](dlm_core::LockBackend::extend) and [`release`](dlm_core::LockBackend::release)
  act only while `owner` still holds the name (`Ok(None)` / `Ok(false)` otherwise), and
  never re-create an entry that is gone: a holder whose lease ran out must learn that it
  lost the lock, not get it back behind the back of whoever took it since.
- [`force_release`](dlm_core::LockBackend::force_release) (administration) and
  [`inspect`](dlm_core::LockBackend::inspect) (the holder's remaining lease).
- Every entry ends with its lease: no acquire path may leave a name held for ever, and a
  name nobody holds should cost nothing.
- Fencing tokens, if you issue them: every acquisition of a name gets a larger token than
  every earlier acquisition of it, even after the store loses its state (a counter that
  restarts at 1 breaks this; dlm-redis draws stream IDs that restart from the server's
  clock). Say `false` in [`Fixture::fencing`](crate::Fixture::fencing) if you do not.
- Errors are [`BackendError`](dlm_core::BackendError)s with a
  [`kind`](dlm_core::BackendErrorKind): the front retries the transient ones
  (`Unavailable`, `Timeout`, `NoQuorum`, `Busy`) within the caller's deadline and returns
  the others at once. Messages never hold a password or an owner token.
- Optional: [`extend_many`](dlm_core::LockBackend::extend_many) (batch the watchdog's
  renewals: one round trip per server, however many holds), [`watch`](dlm_core::LockBackend::watch)
  and [`wake_pending`](dlm_core::LockBackend::wake_pending) (release hints: a waiter wakes
  when the lock is released instead of at the holder's lease end;
  [`WaitList`](dlm_core::WaitList) does the bookkeeping), and
  [`now`](dlm_core::LockBackend::now) (only for a virtual clock in a test double).

## A complete backend

Locks in a map behind a mutex (one process, like dlm-memory). It passes the whole
conformance suite: `dlm-testkit/tests/guide_backend.rs` runs it on this very code.

```rust
"#, include_str!("../tests/guide/map_backend.rs"), r#"
# fn main() {}
```

## Running the conformance suite on it

In your crate's `tests/conformance.rs` (with `dlm-testkit` as a dev-dependency), a
[`Fixture`](crate::Fixture) builds backends over the store under test, and
[`conformance_tests!`](crate::conformance_tests) stamps one `#[test]` per case:

```text
use std::sync::Arc;
use dlm_core::LockBackend;
use my_backend::MapBackend;

struct Map(MapBackend);

impl dlm_testkit::Fixture for Map {
    // Every call must reach the same store: the cases build one client per simulated
    // process, each with its own backend from here.
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.0.clone())
    }
    // No release hints: the cases that are about them only check that `watch` says so.
    fn watch(&self) -> bool {
        false
    }
}

dlm_testkit::conformance_tests!(Map(MapBackend::default()));
```

A fixture that needs something a machine may lack (a server binary, a network) uses
`conformance_tests!(ignore = "why", EXPR)`: the tests then say why they did not run,
and `cargo test -- --ignored` runs them.

What the cases check (each is a `pub fn` in [`conformance`](crate::conformance), with
its own documentation):
- Exclusion: `mutual_exclusion_no_lost_updates` (threads of several clients increment a
  shared counter under the lock), `id_generator_has_no_duplicates`,
  `reentrant_other_thread_blocks`.
- Attempts and deadlines: `try_lock_never_blocks`, `zero_timeout_is_exactly_one_attempt`,
  `try_lock_timeout_honours_its_timeout`, `unbounded_timeout_waits_without_overflow`,
  `acquire_is_idempotent_for_its_owner`, `bad_input_is_rejected_before_io` (counted with
  [`CountingBackend`](crate::CountingBackend)).
- Leases: `expiry_frees_the_lock`, `extend_prolongs_the_lease`,
  `extend_after_expiry_fails_and_does_not_recreate`, `leaked_guard_expires`,
  `watchdog_keeps_the_lock_while_held`, `watchdog_respects_max_hold`,
  `a_lost_lock_is_signalled`, `a_released_lock_is_not_reported_lost`.
- Ownership and release: `release_by_non_owner_is_refused`, `double_unlock_is_not_held`,
  `lock_again_after_unlock`, `release_gives_back_every_hold`,
  `force_unlock_frees_and_the_holder_learns`, `guard_dropped_during_panic_releases`,
  `guard_moves_to_another_thread`, `introspection`.
- Re-entrancy: `reentrant_same_thread`, `reentrant_partial_unlock_keeps_the_lock`,
  `non_reentrant_mode_refuses_second_hold`, `reentry_does_no_io`.
- Fencing: `fencing_tokens_strictly_increase`, `a_paused_holder_is_fenced_off`.
- Waiting: `interrupt_wakes_a_waiter`, `release_wakes_a_waiter`; with release hints,
  `release_between_failed_try_and_wait_is_not_lost`,
  `one_release_wakes_one_of_sixteen_waiters` (waiting threads send no requests),
  `local_waiters_are_served_in_turn`, `try_lock_never_queues`.

The timing-sensitive cases run one at a time, the others together.

## Beyond the suite

- [`history::History`](crate::history::History): record holds (who, when, which token)
  from your own load tests and check that none overlap and that tokens increase.
- [`faults::FaultProxy`](crate::faults::FaultProxy): for a network backend, a TCP proxy
  that adds latency, stalls, black holes, drops replies or resets connections, to test
  what your backend does when the network misbehaves.
- [`redis_server`](crate::redis_server): real servers on free ports, paused, killed and
  restarted on demand, if your store is Redis-compatible.
"#)]
