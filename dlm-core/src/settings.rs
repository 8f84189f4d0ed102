//! What every handle and hold state of a client shares: its settings, its backend, its
//! renewal thread and releaser, its metrics, its owner tokens and its token predictions.
//! (Its registry of hold states is `registry`, above the hold states it keeps.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{LockBackend, OwnerToken};
use crate::error::InvalidArgument;
use crate::observe::Metrics;
use crate::predictions::Predictions;
use crate::release::Releaser;
use crate::retry::RetryPolicy;
use crate::token_draw::TokenDraw;
use crate::watchdog::Watchdog;

/// The settings of one client and what it runs, shared by its handles and hold states.
pub(crate) struct ClientShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) id: [u8; 16],
    /// The fixed lease of handles that set none; `None`: watchdog-renewed leases.
    pub(crate) lease: Option<Duration>,
    pub(crate) max_lease: Duration,
    /// Renews watchdog-managed holds (its thread starts with the first of them).
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) reentrant: bool,
    pub(crate) retry: RetryPolicy,
    /// The client's metrics (the locks' own, with their names as a label, when
    /// `metrics_lock_names`).
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) metrics_lock_names: bool,
    pub(crate) token_draw: TokenDraw,
    /// Who holds, for inspection: kept with each group hold.
    pub(crate) label: Option<Arc<str>>,
    /// Sends failed releases again in the background.
    pub(crate) releaser: Arc<Releaser>,
    /// Per lock name (by a hash), whether its last hold read its fencing token.
    pub(crate) predictions: Predictions,
    seq: AtomicU64,
}

/// The settings of a client, for [`ClientShared::new`].
pub(crate) struct Settings {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) id: [u8; 16],
    pub(crate) lease: Option<Duration>,
    pub(crate) max_lease: Duration,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) reentrant: bool,
    pub(crate) retry: RetryPolicy,
    /// Metrics on (registered now, with the recorder in place).
    pub(crate) metrics: bool,
    /// Each lock's metrics carry its name.
    pub(crate) metrics_lock_names: bool,
    pub(crate) token_draw: TokenDraw,
    pub(crate) label: Option<Arc<str>>,
    pub(crate) releaser: Arc<Releaser>,
}

impl ClientShared {
    pub(crate) fn new(s: Settings) -> Self {
        let metrics = if s.metrics {
            crate::observe::describe();
            Metrics::register(s.backend.kind(), None)
        } else {
            Metrics::off()
        };
        ClientShared {
            backend: s.backend,
            id: s.id,
            lease: s.lease,
            max_lease: s.max_lease,
            watchdog: s.watchdog,
            reentrant: s.reentrant,
            retry: s.retry,
            metrics: Arc::new(metrics),
            metrics_lock_names: s.metrics && s.metrics_lock_names,
            token_draw: s.token_draw,
            label: s.label,
            releaser: s.releaser,
            predictions: Predictions::new(),
            seq: AtomicU64::new(0),
        }
    }

    /// The owner token of the calling thread's next acquisition: unique to it (re-entry is
    /// counted here and never reaches the backend), so that a request that arrives late at
    /// a server, or a clean-up of a failed attempt, can only ever touch the key of the
    /// acquisition that sent it, never a later one of the same thread.
    pub(crate) fn token_for_current_thread(&self) -> OwnerToken {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        OwnerToken::new(self.id, thread_no(), seq)
    }

    pub(crate) fn check_lease(
        &self,
        lease: Duration,
    ) -> std::result::Result<Duration, InvalidArgument> {
        check_lease(lease, self.max_lease)
    }
}

/// `lease` if it is at least 1 ms, at most `max_lease`, and fits the monotonic clock.
pub(crate) fn check_lease(
    lease: Duration,
    max_lease: Duration,
) -> std::result::Result<Duration, InvalidArgument> {
    if lease < Duration::from_millis(1) {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} is below the minimum of 1 ms"),
        ));
    }
    if lease > max_lease {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} exceeds the maximum of {:?}", max_lease),
        ));
    }
    if Instant::now().checked_add(lease).is_none() {
        return Err(InvalidArgument::new(
            "lease",
            format!("{lease:?} overflows the monotonic clock"),
        ));
    }
    Ok(lease)
}

/// A small number unique to the calling thread for the life of the process.
pub(crate) fn thread_no() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NO: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NO.with(|n| *n)
}
