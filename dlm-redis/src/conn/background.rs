//! The requests to one server whose callers stopped waiting (a fan-out's stragglers and
//! their late actions): counted, so that later requests do not queue behind them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlm_core::backend::{LockName, OwnerToken};
use parking_lot::Mutex;

/// The requests of one server that their callers stopped waiting for.
#[derive(Default)]
pub(crate) struct Background {
    /// How many there are (read without the lock on every request).
    count: AtomicUsize,
    entries: Mutex<Vec<Straggling>>,
    next_id: AtomicUsize,
}

struct Straggling {
    id: usize,
    /// The lock and owner token of an acquisition (its late reply is released).
    key: Option<(LockName, OwnerToken)>,
    since: Instant,
}

impl Background {
    pub(crate) fn enter(&self, key: Option<(LockName, OwnerToken)>) -> usize {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.entries.lock().push(Straggling {
            id,
            key,
            since: Instant::now(),
        });
        self.count.fetch_add(1, Ordering::AcqRel);
        id
    }

    pub(crate) fn leave(&self, id: usize) {
        self.entries.lock().retain(|s| s.id != id);
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn busy(
        &self,
        key: Option<(&LockName, &OwnerToken)>,
        slow: Duration,
    ) -> Option<&'static str> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let entries = self.entries.lock();
        if entries.iter().any(|s| s.since.elapsed() > slow) {
            return Some("an earlier request is still unanswered (a slow or stopped server)");
        }
        // Only the same acquisition (lock and owner token) must wait: the late reply's
        // clean-up is a compare-and-delete of that owner's key, which cannot touch another
        // owner's request, but could undo this owner's retry.
        if key.is_some_and(|(n, o)| {
            entries
                .iter()
                .any(|s| s.key.as_ref().is_some_and(|(sn, so)| sn == n && so == o))
        }) {
            return Some("an earlier request of this acquisition is still unanswered");
        }
        None
    }
}
