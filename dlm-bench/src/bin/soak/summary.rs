//! The summary of one backend's soak: what passed, and the line it prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use dlm_testkit::history::Violation;

use crate::bulk;

pub(crate) struct Summary {
    pub(crate) backend: &'static str,
    pub(crate) ran: Duration,
    pub(crate) holds: u64,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) declared: usize,
    pub(crate) stale: usize,
    pub(crate) stale_declared: usize,
    pub(crate) refused: u64,
    pub(crate) writes: u64,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) fatal: Vec<String>,
    pub(crate) stuck: Vec<&'static str>,
    pub(crate) leaked_keys: usize,
    pub(crate) threads: isize,
    pub(crate) connections: usize,
    pub(crate) bulk: Option<bulk::Outcome>,
}

impl Summary {
    pub(crate) fn passed(&self) -> bool {
        self.violations.is_empty()
            && self.stale == 0
            && self.fatal.is_empty()
            && self.stuck.is_empty()
            && self.leaked_keys == 0
            && self.threads <= 0
            && self.connections == 0
            && self.bulk.as_ref().is_none_or(bulk::Outcome::passed)
    }

    pub(crate) fn line(&self) -> String {
        let faults: u64 = self.faults.values().sum();
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let mut s = format!(
            "soak {}: {} {:.1} min, holds={} faults={} ({}) violations={} (declared {}) \
             stale-writes-accepted={} (declared {}; refused {} of {} writes) leaked-keys={} \
             threads={:+} connections={}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.backend,
            self.ran.as_secs_f64() / 60.0,
            self.holds,
            faults,
            kinds.join(", "),
            self.violations.len(),
            self.declared,
            self.stale,
            self.stale_declared,
            self.refused,
            self.writes,
            self.leaked_keys,
            self.threads,
            self.connections,
        );
        if let Some(b) = &self.bulk {
            let _ = write!(s, " {}", b.part());
        }
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = write!(s, " errors=[{}]", errors.join(", "));
        for v in self.violations.iter().take(5) {
            let _ = write!(s, "\n  violation: {v}");
        }
        for f in self.fatal.iter().take(5) {
            let _ = write!(s, "\n  failure: {f}");
        }
        for k in &self.stuck {
            let _ = write!(s, "\n  no progress within 30 s after: {k}");
        }
        s
    }
}
