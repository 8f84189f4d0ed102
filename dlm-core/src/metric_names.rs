//! The names and labels of the metrics dlm reports through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! The facade does nothing until the application installs a recorder (a Prometheus
//! exporter, for example). A [`LockClient`](crate::LockClient) registers its metrics when
//! it is built, so install the recorder before building clients: a client built earlier
//! reports nothing. [`LockClientBuilder::metrics`](crate::LockClientBuilder::metrics) turns
//! them off; [`LockClientBuilder::metrics_lock_names`](crate::LockClientBuilder::metrics_lock_names)
//! adds the lock's name as a label.
//!
//! Every metric carries the label [`BACKEND`]: the backend's
//! [`kind`](crate::backend::LockBackend::kind) (`memory`, `redis`, `sentinel`, `cluster`,
//! `redlock`, `etcd`). Durations are in seconds. Re-entry by the holding thread is local and is not
//! an acquisition here.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | [`ACQUISITIONS`] | counter | [`OUTCOME`]: `acquired`, `timed_out`, `interrupted`, `failed` | acquisition calls by how they ended (`timed_out`: not acquired within the wait; a `try_lock` that found the lock held included) |
//! | [`ACQUIRE_WAIT`] | histogram, seconds | | from the call to the lock acquired |
//! | [`HOLD`] | histogram, seconds | | from the acquisition to the holder's release (of the outermost re-entrant hold) |
//! | [`HANDOVER_WAKEUPS`] | counter | | release hints, and releases that handed the lock over, that woke a waiter of this process |
//! | [`RENEWALS`] | counter | [`OUTCOME`]: `ok`, `failed` | watchdog renewals and [`LockGuard::extend`](crate::LockGuard::extend) calls (`failed`: an error, or the lock was gone) |
//! | [`LOCKS_LOST`] | counter | | holds lost: a renewal or extension found the lock gone, renewals failed until the lease ran out, or the lease had run out (or the lock was gone) when the holder released it |
//! | [`BACKEND_ERRORS`] | counter | [`KIND`]: `unavailable`, `timeout`, `no_quorum`, `busy`, `auth`, `permission`, `read_only`, `out_of_memory`, `unexpected_key`, `protocol`, `tls`, `not_replicated`, `other` | errors the backend returned to the client (each retried attempt counts) |
//! | [`STRAGGLERS_RELEASED`] | counter | [`OUTCOME`]: `ok`, `failed` | (dlm-redis, Redlock) acquisitions whose reply came after the operation had returned, released in the background |
//!
//! With [`metrics_lock_names`](crate::LockClientBuilder::metrics_lock_names), the metrics
//! of the client (all but [`STRAGGLERS_RELEASED`], which the backend reports) also carry
//! [`LOCK`], the lock's name. Lock names are unbounded: turn it on only for a small, fixed
//! set of names.
//!
//! ```
//! use dlm_core::{Lock, LockClient, metric_names};
//! use dlm_memory::MemoryBackend;
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//!
//! // The recorder first (here one for this thread, which keeps what it is given; an
//! // exporter installs one for the process), then the client, which registers its
//! // metrics when it is built.
//! let recorder = DebuggingRecorder::new();
//! let snapshot = recorder.snapshotter();
//! let client = metrics::with_local_recorder(&recorder, || LockClient::new(MemoryBackend::new()));
//! client.get_lock("report")?.lock()?.unlock()?;
//! let counted = snapshot.snapshot().into_vec().into_iter().any(|(key, _, _, value)| {
//!     key.key().name() == metric_names::ACQUISITIONS
//!         && key.key().labels().any(|l| l.key() == metric_names::OUTCOME && l.value() == "acquired")
//!         && key.key().labels().any(|l| l.key() == metric_names::BACKEND && l.value() == "memory")
//!         && value == DebugValue::Counter(1)
//! });
//! assert!(counted);
//! # Ok::<(), dlm_core::Error>(())
//! ```

/// Counter: acquisition calls, by [`OUTCOME`].
pub const ACQUISITIONS: &str = "dlm_acquisitions_total";
/// Histogram, seconds: from an acquisition call to the lock acquired.
pub const ACQUIRE_WAIT: &str = "dlm_acquire_wait_seconds";
/// Histogram, seconds: from an acquisition to its holder's release.
pub const HOLD: &str = "dlm_hold_seconds";
/// Counter: release hints, and releases that handed the lock over, that woke a waiter of
/// this process.
pub const HANDOVER_WAKEUPS: &str = "dlm_handover_wakeups_total";
/// Counter: lease renewals (watchdog and `extend`), by [`OUTCOME`].
pub const RENEWALS: &str = "dlm_renewals_total";
/// Counter: holds lost before their holder released them.
pub const LOCKS_LOST: &str = "dlm_locks_lost_total";
/// Counter: errors the backend returned, by [`KIND`].
pub const BACKEND_ERRORS: &str = "dlm_backend_errors_total";
/// Counter (reported by dlm-redis): late acquisitions of a fan-out released in the
/// background, by [`OUTCOME`].
pub const STRAGGLERS_RELEASED: &str = "dlm_stragglers_released_total";

/// Label: the backend's [`kind`](crate::backend::LockBackend::kind).
pub const BACKEND: &str = "backend";
/// Label: how an operation ended.
pub const OUTCOME: &str = "outcome";
/// Label: the [`BackendErrorKind`](crate::BackendErrorKind) of an error, in snake case.
pub const KIND: &str = "kind";
/// Label (opt-in): the lock's name.
pub const LOCK: &str = "lock";
