#![doc = concat!(r#"
# Writing a backend

A backend is a lock store behind the [`LockBackend`](dlm_core::backend::LockBackend) trait. The
front ([`LockClient`](dlm_core::LockClient)) does everything else once, for every backend:
waiting and deadlines, interrupts, re-entrancy, guards, the watchdog's renewals, the lost
signal. A backend makes one bounded attempt per call: it never sleeps, never retries,
never waits for a lock.

## What a backend must do

- [`try_acquire(name, owner, ttl)`](dlm_core::backend::LockBackend::try_acquire): take `name` for
  `owner` if it is free, with an expiry `ttl` from now, and return
  [`Acquire::Acquired`](dlm_core::backend::Acquire::Acquired) with a
  [`Lease`](dlm_core::backend::Lease) whose `valid_until` is no later than the real expiry
  (count it from before the request was sent; a network backend subtracts its clock-drift
  allowance). If `owner` already holds it (a retry whose reply was lost), refresh the
  lease and say acquired. If someone else holds it, return
  [`Acquire::Held { retry_after }`](dlm_core::backend::Acquire::Held) with the holder's remaining
  lease when you know it: a waiter never sleeps past it (with release hints it sleeps
  until then unless a hint wakes it; without them it polls with backoff). Contention is
  never an error.
- [`extend`](dlm_core::backend::LockBackend::extend) and [`release`](dlm_core::backend::LockBackend::release)
  act only while `owner` still holds the name (`Ok(None)` / `Ok(false)` otherwise), and
  never re-create an entry that is gone: a holder whose lease ran out must learn that it
  lost the lock, not get it back behind the back of whoever took it since.
- [`force_release`](dlm_core::backend::LockBackend::force_release) (administration) and
  [`inspect`](dlm_core::backend::LockBackend::inspect) (the holder's remaining lease).
- Every entry ends with its lease: no acquire path may leave a name held for ever, and a
  name nobody holds should cost nothing.
- Fencing tokens, if you issue them: every acquisition of a name gets a larger token than
  every earlier acquisition of it, even after the store loses its state (a counter that
  restarts at 1 breaks this; dlm-redis draws stream IDs that restart from the server's
  clock). Say `false` in [`Fixture::fencing`](crate::Fixture::fencing) if you issue none
  ([`fence`](dlm_core::backend::LockBackend::fence) then says `Unsupported`, its default).
  Hand the token out with the lease ([`Lease::with_fence`](dlm_core::backend::Lease::with_fence))
  when it costs nothing (as here), and implement `fence` either way: the holder's token
  (read back, or drawn now), or `None` once `owner` no longer holds the name (a holder
  that lost its lock never gets a token). When drawing costs a write, draw it in `fence`
  (on read) and in
  [`try_acquire_fenced`](dlm_core::backend::LockBackend::try_acquire_fenced) (with the
  acquisition, which the front asks for when the last hold read its token): the suite
  expects a token right after such an acquisition.
- Errors are [`BackendError`](dlm_core::BackendError)s with a
  [`kind`](dlm_core::BackendErrorKind). The front retries the kinds for which
  [`is_transient`](dlm_core::BackendErrorKind::is_transient) is true (`Unavailable`,
  `Timeout`, `NoQuorum`, `Busy`) within the caller's deadline, and returns the others
  at once: pick a transient kind only for a failure a later attempt may not see.
  Messages never hold a password or an owner token.
- A call that fails may have been applied (a lost reply): return the error. The front
  undoes what it may have written (it releases the attempt's owner token, again in the
  background while that fails); never send such a request again as if it had not been
  applied.
- Optional: [`extend_many`](dlm_core::backend::LockBackend::extend_many) (batch the watchdog's
  renewals of every kind: one round trip per server, however many holds; report each
  renewal as soon as its reply is in), [`watch`](dlm_core::backend::LockBackend::watch)
  and [`wake_pending`](dlm_core::backend::LockBackend::wake_pending) (release hints: a waiter wakes
  when the lock is released instead of at the holder's lease end;
  [`WaitList`](dlm_core::backend::WaitList) does the bookkeeping), and
  [`now`](dlm_core::backend::LockBackend::now) (only for a virtual clock in a test double).

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

```rust
# mod my_backend {
# include!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/guide/map_backend.rs"));
# }
use std::sync::Arc;
use dlm_core::backend::LockBackend;
use my_backend::MapBackend;

struct Map(MapBackend);

impl dlm_testkit::Fixture for Map {
    // Every call must reach the same store: the cases build one client per simulated
    // process, each with its own backend from here.
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.0.clone())
    }
    // No release hints (`watch` is not implemented). The default is `true`.
    fn watch(&self) -> bool {
        false
    }
    // `fencing` is left at its default, `true`: this backend issues fencing tokens.
}

dlm_testkit::conformance_tests!(
    mutex_only = "the guide's map backend keeps only the mutex",
    Map(MapBackend::default())
);
# fn main() {}
```

The macro's argument is evaluated once per test, so each test gets a fresh fixture. A
fixture that needs something a machine may lack (a server binary, a network) uses
`conformance_tests!(ignore = "why", EXPR)`: the tests are then marked ignored with that
reason, and `cargo test -- --ignored` runs them. `cargo test --test conformance` runs
the suite; the timing-sensitive cases run one at a time, the others together.

## What the cases check

Each case is a `pub fn` in [`conformance`](crate::conformance) with its own
documentation; the test names are the function names. Most cases go through a
[`LockClient`](dlm_core::LockClient), so they test the backend as the front uses it.

Mutual exclusion:
- `mutual_exclusion_no_lost_updates`: threads of 4 clients increment a counter with a
  separate read and write; no update is lost, no critical sections overlap, and the
  [`History`](crate::history::History) checker finds no overlap and no token out of order.
- `id_generator_has_no_duplicates`: threads of separate clients draw IDs from an
  unsynchronised counter under the lock; no ID is drawn twice.
- `reentrant_other_thread_blocks`: another thread of the holding client does not share
  the hold; it blocks.

Attempts and deadlines:
- `try_lock_never_blocks`: `try_lock` on a held lock returns `Ok(None)` at once.
- `zero_timeout_is_exactly_one_attempt`: a zero timeout makes exactly one request.
- `try_lock_timeout_honours_its_timeout`: `try_lock_timeout` waits about its timeout,
  then returns `Ok(None)`.
- `unbounded_timeout_waits_without_overflow`: `Duration::MAX` waits until the lock is
  free, without overflow.
- `acquire_is_idempotent_for_its_owner`: `try_acquire` by the holder succeeds again,
  refreshes the lease, and keeps a token not older than the first; another owner is
  still refused.
- `bad_input_is_rejected_before_io`: bad names, leases and extensions are
  `InvalidArgument`, and no request reaches the backend (counted with
  [`CountingBackend`](crate::CountingBackend)); names that look like Lua or keys are
  plain names.

Leases:
- `expiry_frees_the_lock`: a lock nobody releases or extends is free after its lease.
- `extend_prolongs_the_lease`: `extend` keeps the lock beyond its first lease.
- `extend_after_expiry_fails_and_does_not_recreate`: extending after the lease ran out
  is `LockLost`, and the lock stays free.
- `leaked_guard_expires`: a guard that is never dropped frees the lock at its lease's end.
- `watchdog_keeps_the_lock_while_held`: without an explicit lease, the watchdog's
  renewals keep the lock for four times the watchdog timeout (the lease each renewal
  sets); after `unlock` it is free at once.
- `watchdog_respects_max_hold`: renewals stop after the client's maximum hold time, and
  the lease then runs out.
- `a_lost_lock_is_signalled`: a lock that disappears under a renewed holder reads as
  `Lost` in its lost signal; `is_held` turns false and `ensure_held` fails.
- `a_released_lock_is_not_reported_lost`: a release by the holder reads as `Released`;
  a fixed lease that runs out first reads as `Lost`.

Ownership and release:
- `release_by_non_owner_is_refused`: another client's `unlock` is `NotHeld`, and the
  backend refuses a release with a foreign token.
- `double_unlock_is_not_held`: a second `unlock` is `NotHeld`.
- `lock_again_after_unlock`: anyone can take a lock again after it was unlocked.
- `release_gives_back_every_hold`: `Lock::release` gives back all holds of the calling
  thread; with none it makes no request.
- `force_unlock_frees_and_the_holder_learns`: `force_unlock` frees the lock, and the
  holder's `unlock` then reports the loss.
- `guard_dropped_during_panic_releases`: a guard dropped while its thread panics
  releases the lock.
- `guard_moves_to_another_thread`: a guard can be unlocked on another thread.
- `introspection`: `is_locked` and `remaining_lease` (from `inspect`), `hold_count` and
  `is_held_by_current_thread` report the hold, before, during and after it.

Re-entrancy (the front counts re-entry; these check it over your backend):
- `reentrant_same_thread`: the holding thread acquires again without blocking; both
  holds have the same token.
- `reentrant_partial_unlock_keeps_the_lock`: giving back one of two holds keeps the lock.
- `non_reentrant_mode_refuses_second_hold`: with re-entrancy off, a second acquisition
  by the holding thread is contention.
- `reentry_does_no_io`: re-entry sends no request to the backend.

Fencing (with `Fixture::fencing` false, the first two check that no token is issued, and
the others skip what needs one):
- `fencing_tokens_strictly_increase`: tokens increase over successive acquisitions,
  across clients and threads.
- `a_paused_holder_is_fenced_off`: a holder paused past its lease has its write refused
  by a [`FencedResource`](dlm_core::FencedResource) once the next holder has written.
- `a_token_read_after_the_lock_was_lost_is_an_error`: a holder whose lease ran out (and
  the lock was taken since) reads `LockLost`, never a token.
- `the_token_is_stable_within_a_hold`: one token per hold, however and wherever it is
  read (the later reads make no request); the next hold gets a larger one.
- `an_unread_token_writes_no_fencing_key`: acquisitions whose tokens are never read
  write no fencing key; the first read writes one (skipped when `Fixture::fencing_keys`
  is `None`).
- `a_read_token_comes_with_the_next_acquisition`, `a_mispredicted_draw_is_released_with_the_lock`,
  `token_draw_settings_are_followed`: after a hold that read its token the next
  acquisition carries one (no other request), tokens still increase across holders, an
  unread token drawn with the acquisition leaves no key behind (`Fixture::fencing_keys`,
  `Fixture::keys_without_expiry`), and the client's `TokenDraw` settings are followed.

Waiting:
- `interrupt_wakes_a_waiter`: an interrupt ends a blocked wait within 100 ms.
- `try_lock_never_queues`: `try_lock` makes its one attempt at once, even while a
  woken waiter of the same process has not made its attempt yet.
- `hand_over_within_a_process_keeps_every_rule`: threads of one backend on one name,
  some with waits of a few milliseconds: one holder at a time (the history checker),
  tokens in the order of the holds, and the lock free when they are all done (a
  backend that hands a released lock to a waiter of its own process, as dlm-memory and
  dlm-redis do, must leave nothing behind when that waiter's wait ends meanwhile).

Waiting with release hints (with `Fixture::watch` false, each only checks that `watch`
returns `None`, and `local_waiters_are_served_in_turn` that `wake_pending` is false):
- `release_wakes_a_waiter`: a waiter with a 10 s backoff takes the lock within 50 ms of
  the release.
- `release_between_failed_try_and_wait_is_not_lost`: after a release between a
  waiter's failed attempt and its wait, the waiter takes the lock at once.
- `one_release_wakes_one_of_sixteen_waiters`: one release wakes one of 16 waiters, and
  waiting threads send no requests.
- `local_waiters_are_served_in_turn`: a thread that releases and asks again at once
  queues behind the waiter its release woke.

## Beyond the suite

- [`history::History`](crate::history::History): record holds (who, when, which token)
  from your own load tests and check that none overlap and that tokens increase.
- [`faults::FaultProxy`](crate::faults::FaultProxy): for a network backend, a TCP proxy
  between the client and its server that adds latency, stalls, discards bytes or resets
  connections, to test what your backend does when the network misbehaves (dropping
  whole replies needs the Redis protocol).
- [`redis_server`](crate::redis_server): real servers on free ports, paused, killed and
  restarted on demand, if your store is Redis-compatible.
"#)]
