//! # dlm-core: the front of the dlm distributed lock manager
//!
//! A blocking, thread-friendly distributed lock, written once over any store that
//! implements [`LockBackend`](backend::LockBackend):
//!
//! - [`LockClient`] hands out named [`DistributedLock`]s and owns the owner identity
//!   (128 random bits from the OS per client, plus the thread).
//! - [`Lock`] is the Java `AbstractLock` of the blog post this library started from
//!   (`lock`, `lock_interruptibly`, `try_lock`, `try_lock_timeout`,
//!   `try_lock_interruptibly`, `unlock`, `release`); acquisitions return a [`LockGuard`].
//! - One wait loop serves every backend: attempt, subscribe to release hints
//!   ([`LockBackend::watch`](backend::LockBackend::watch)), then sleep until a hint, the holder's lease end, a jittered
//!   backoff, the deadline or an [`Interrupt`].
//! - Re-entrant per (lock, thread) with hold counts, like Redisson's `RLock`.
//! - Beside the lock: [`Semaphore`], [`ReadWriteLock`], [`MultiLock`] (every name of a set
//!   or none, without deadlock) and [`Election`] (a leader others can see and follow).
//! - Leases renewed by one watchdog thread per client (Redisson's `lockWatchdogTimeout`),
//!   with a lost-lock signal on the guard ([`LockGuard::lost_signal`], a [`LostSignal`]).
//! - Leases are monotonic ([`std::time::Instant`]); wall-clock time is never used.
//!
//! ## Layout
//! The crate root is the user's API; [`backend`] is the contract a store implements
//! (`LockBackend`, `Acquire`, `Lease`, `OwnerToken`, `Watch`, `WaitList`, ...). The root
//! also re-exports the contract's names a user meets: [`LockName`] (to check a name
//! before any I/O), [`FencingToken`], and the error types.
//!
//! Modules, each importing only from the ones below it: `lib` re-exports; `client` the
//! [`LockClient`]; `lock` the [`Lock`] trait and [`DistributedLock`]; `acquire` the wait
//! loop; `guard` the [`LockGuard`]; `lost` the [`LostSignal`]; `multi` the [`MultiLock`]
//! (all-or-nothing holds of several names); `election` the [`Election`] (a one-permit
//! semaphore whose holder publishes a value); `shared` what a client's
//! handles share (settings, registry, each lock's hold state); `watchdog` lease renewal;
//! `fenced`, `retry`, `interrupt`, `signal` (the two ends of a lost signal) and `error`
//! underneath; `backend` the contract.
//!
//! ## Plugging in a backend
//! 1. Implement [`backend::LockBackend`]: one bounded attempt per call, never sleeping.
//! 2. Optionally implement [`LockBackend::watch`](backend::LockBackend::watch) (a
//!    [`WaitList`](backend::WaitList) does the bookkeeping).
//! 3. Run the conformance suite of `dlm-testkit` against it with its `conformance_tests!`
//!    macro.
//! 4. Hand it to [`LockClient::new`].
#![deny(missing_docs)]

mod acquire;
pub mod backend;
mod client;
mod election;
mod error;
mod fenced;
mod guard;
mod handle;
mod hold;
mod interrupt;
mod keep_alive;
mod lock;
mod lost;
pub mod metric_names;
mod multi;
mod observe;
mod predictions;
mod registry;
mod release;
mod retry;
mod rwlock;
mod semaphore;
mod settings;
mod signal;
#[cfg(feature = "tls")]
pub mod tls;
mod token_draw;
pub use token_draw::TokenDraw;
mod watchdog;

pub use backend::{FencingToken, Holder, Holders, LockName, MAX_LABEL_LEN, MAX_NAME_LEN};
pub use client::{DEFAULT_MAX_LEASE, DEFAULT_WATCHDOG_TIMEOUT, LockClient, LockClientBuilder};
pub use election::{Election, Leader, Leadership, ObservedChanges, Observer};
pub use error::{BackendError, BackendErrorKind, Deadlock, Error, InvalidArgument, Result};
pub use fenced::{FencedResource, StaleToken};
pub use guard::LockGuard;
pub use interrupt::{Interrupt, InterruptOnDrop, Interrupter, interrupt_pair};
pub use lock::{DistributedLock, HoldGuard, Lock};
pub use lost::{HoldState, LostSignal};
pub use multi::{MultiLock, MultiLockGuard, MultiLostSignal};
pub use retry::RetryPolicy;
pub use rwlock::{ReadWriteLock, WriteGuard};
pub use semaphore::Semaphore;

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
