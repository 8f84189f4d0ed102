//! The bulk holder: one client that keeps many watchdog-renewed locks for the whole run,
//! so that a renewal round that stalls behind one node shows up as holds lost on the
//! others.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_core::{Lock, LockClient, LockGuard};

use crate::LEASE;

/// How long a retake waits for a lost lock (its key may live out its lease first).
const RETAKE_WAIT: Duration = Duration::from_secs(3);

pub(crate) struct Bulk {
    client: LockClient,
    holds: Vec<(String, Option<LockGuard>)>,
    lost: u64,
    /// Holds lost on a node the fault did not touch, by fault.
    untouched: BTreeMap<&'static str, u64>,
    /// Retakes that did not get the lock back (it is tried again before the next fault).
    missed: u64,
}

/// What the bulk holder saw.
pub(crate) struct Outcome {
    holds: usize,
    lost: u64,
    untouched: BTreeMap<&'static str, u64>,
    missed: u64,
}

impl Bulk {
    /// A client over `backend` (watchdog leases of [`LEASE`]) holding `n` locks.
    pub(crate) fn new(backend: Arc<dyn LockBackend>, n: usize) -> Bulk {
        let client = LockClient::builder(backend)
            .watchdog_timeout(LEASE)
            .build()
            .expect("a client");
        let mut bulk = Bulk {
            client,
            holds: (0..n).map(|i| (format!("bulk-{i}"), None)).collect(),
            lost: 0,
            untouched: BTreeMap::new(),
            missed: 0,
        };
        bulk.refill();
        bulk
    }

    /// Takes every lock that is not held (again).
    pub(crate) fn refill(&mut self) {
        for (name, slot) in &mut self.holds {
            if slot.as_ref().is_some_and(LockGuard::is_held) {
                continue;
            }
            // A lost hold's release finds someone else's key or none: nothing to undo.
            drop(slot.take());
            let lock = self.client.get_lock(name).expect("a valid name");
            match lock.try_lock_timeout(RETAKE_WAIT) {
                Ok(Some(guard)) => *slot = Some(guard),
                Ok(None) | Err(_) => self.missed += 1,
            }
        }
    }

    /// Counts the holds lost since the last refill; those whose node `untouched` says the
    /// fault left alone are counted against `fault`.
    pub(crate) fn check(&mut self, fault: &'static str, untouched: impl Fn(&str) -> bool) {
        for (name, slot) in &mut self.holds {
            if slot.as_ref().is_none_or(LockGuard::is_held) {
                continue;
            }
            self.lost += 1;
            if untouched(name) {
                *self.untouched.entry(fault).or_default() += 1;
            }
            drop(slot.take());
        }
    }

    /// Releases what is held and says what was seen.
    pub(crate) fn finish(mut self) -> Outcome {
        for guard in self.holds.iter_mut().filter_map(|(_, g)| g.take()) {
            // A release that fails leaves the key to its lease: the leak check waits.
            let _ = guard.unlock();
        }
        Outcome {
            holds: self.holds.len(),
            lost: self.lost,
            untouched: self.untouched,
            missed: self.missed,
        }
    }
}

impl Outcome {
    /// No hold lost on a node that the fault left alone.
    pub(crate) fn passed(&self) -> bool {
        self.untouched.is_empty()
    }

    /// The summary line's part: `bulk-holds=N lost=L (on untouched nodes U: by fault)`.
    pub(crate) fn part(&self) -> String {
        let by: Vec<String> = self
            .untouched
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let on_untouched: u64 = self.untouched.values().sum();
        format!(
            "bulk-holds={} lost={} (on untouched nodes {}{}; retakes missed {})",
            self.holds,
            self.lost,
            on_untouched,
            if by.is_empty() {
                String::new()
            } else {
                format!(": {}", by.join(", "))
            },
            self.missed
        )
    }
}
