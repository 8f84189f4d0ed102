//! The metrics of a client (names and labels: [`crate::metric_names`]), as handles
//! registered once with the recorder in place when the client (or, with lock-name labels,
//! the lock's state) is made. Emitting is then a call on a handle: nothing at all
//! without a recorder, an atomic add with a cheap one. Durations are read from the clock
//! only when metrics are on.

use std::time::Instant;

use ::metrics::{Counter, Histogram, Label, Unit};

use crate::error::{BackendError, BackendErrorKind};
use crate::metric_names as names;

/// Every [`BackendErrorKind`], in the order of [`kind_index`].
const KINDS: [BackendErrorKind; 15] = [
    BackendErrorKind::Unavailable,
    BackendErrorKind::Timeout,
    BackendErrorKind::NoQuorum,
    BackendErrorKind::Busy,
    BackendErrorKind::Auth,
    BackendErrorKind::Permission,
    BackendErrorKind::ReadOnly,
    BackendErrorKind::OutOfMemory,
    BackendErrorKind::UnexpectedKey,
    BackendErrorKind::Protocol,
    BackendErrorKind::Tls,
    BackendErrorKind::NotReplicated,
    BackendErrorKind::Unsupported,
    BackendErrorKind::Conflict,
    BackendErrorKind::Other,
];

fn kind_index(kind: BackendErrorKind) -> usize {
    match kind {
        BackendErrorKind::Unavailable => 0,
        BackendErrorKind::Timeout => 1,
        BackendErrorKind::NoQuorum => 2,
        BackendErrorKind::Busy => 3,
        BackendErrorKind::Auth => 4,
        BackendErrorKind::Permission => 5,
        BackendErrorKind::ReadOnly => 6,
        BackendErrorKind::OutOfMemory => 7,
        BackendErrorKind::UnexpectedKey => 8,
        BackendErrorKind::Protocol => 9,
        BackendErrorKind::Tls => 10,
        BackendErrorKind::NotReplicated => 11,
        BackendErrorKind::Unsupported => 12,
        BackendErrorKind::Conflict => 13,
        BackendErrorKind::Other => 14,
    }
}

/// How an acquisition call ended (not counted: re-entry by the holding thread).
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    TimedOut,
    Interrupted,
    Failed,
}

/// The handles of one client (or of one lock, with lock-name labels).
pub(crate) struct Metrics {
    /// Whether durations are measured (metrics on).
    timed: bool,
    acquired: Counter,
    timed_out: Counter,
    interrupted: Counter,
    failed: Counter,
    wait: Histogram,
    hold: Histogram,
    wakeups: Counter,
    renewed: Counter,
    renewal_failed: Counter,
    lost: Counter,
    errors: [Counter; KINDS.len()],
}

impl Metrics {
    /// No metrics: every handle does nothing and no clock is read for them.
    pub(crate) fn off() -> Metrics {
        Metrics {
            timed: false,
            acquired: Counter::noop(),
            timed_out: Counter::noop(),
            interrupted: Counter::noop(),
            failed: Counter::noop(),
            wait: Histogram::noop(),
            hold: Histogram::noop(),
            wakeups: Counter::noop(),
            renewed: Counter::noop(),
            renewal_failed: Counter::noop(),
            lost: Counter::noop(),
            errors: std::array::from_fn(|_| Counter::noop()),
        }
    }

    /// The handles for a client over a backend of `kind`, with the lock's name as a label
    /// when `lock` is given, from the recorder in place now.
    pub(crate) fn register(kind: &'static str, lock: Option<&str>) -> Metrics {
        let mut base = vec![Label::from_static_parts(names::BACKEND, kind)];
        if let Some(lock) = lock {
            base.push(Label::new(names::LOCK, lock.to_owned()));
        }
        let with = |extra: Option<(&'static str, &'static str)>| {
            let mut labels = base.clone();
            if let Some((k, v)) = extra {
                labels.push(Label::from_static_parts(k, v));
            }
            labels
        };
        let outcome = |name: &'static str, value| {
            ::metrics::counter!(name, with(Some((names::OUTCOME, value))))
        };
        Metrics {
            timed: true,
            acquired: outcome(names::ACQUISITIONS, "acquired"),
            timed_out: outcome(names::ACQUISITIONS, "timed_out"),
            interrupted: outcome(names::ACQUISITIONS, "interrupted"),
            failed: outcome(names::ACQUISITIONS, "failed"),
            wait: ::metrics::histogram!(names::ACQUIRE_WAIT, with(None)),
            hold: ::metrics::histogram!(names::HOLD, with(None)),
            wakeups: ::metrics::counter!(names::HANDOVER_WAKEUPS, with(None)),
            renewed: outcome(names::RENEWALS, "ok"),
            renewal_failed: outcome(names::RENEWALS, "failed"),
            lost: ::metrics::counter!(names::LOCKS_LOST, with(None)),
            errors: KINDS.map(|k| {
                ::metrics::counter!(names::BACKEND_ERRORS, with(Some((names::KIND, k.label()))))
            }),
        }
    }

    /// Now, if durations are measured.
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.timed.then(Instant::now)
    }

    /// An acquisition that got the lock at `at`, after a call that began at `started`.
    pub(crate) fn acquired(&self, started: Option<Instant>, at: Option<Instant>) {
        self.acquired.increment(1);
        if let (Some(started), Some(at)) = (started, at) {
            self.wait
                .record(at.saturating_duration_since(started).as_secs_f64());
        }
    }

    /// An acquisition call that ended without the lock.
    pub(crate) fn not_acquired(&self, outcome: Outcome) {
        match outcome {
            Outcome::TimedOut => &self.timed_out,
            Outcome::Interrupted => &self.interrupted,
            Outcome::Failed => &self.failed,
        }
        .increment(1);
    }

    /// The end of a hold acquired at `since` (when measured).
    pub(crate) fn released(&self, since: Option<Instant>) {
        if let Some(since) = since {
            self.hold.record(since.elapsed().as_secs_f64());
        }
    }

    pub(crate) fn woken(&self) {
        self.wakeups.increment(1);
    }

    pub(crate) fn renewal(&self, ok: bool) {
        if ok {
            &self.renewed
        } else {
            &self.renewal_failed
        }
        .increment(1);
    }

    pub(crate) fn lost(&self) {
        self.lost.increment(1);
    }

    pub(crate) fn error(&self, e: &BackendError) {
        self.errors[kind_index(e.kind())].increment(1);
    }

    /// Counts the error of `result`, if any, and hands it back.
    pub(crate) fn check<T>(&self, result: Result<T, BackendError>) -> Result<T, BackendError> {
        if let Err(e) = &result {
            self.error(e);
        }
        result
    }
}

/// Describes dlm-core's metrics to the recorder in place (names, units, meanings).
pub(crate) fn describe() {
    use ::metrics::{describe_counter, describe_histogram};
    describe_counter!(
        names::ACQUISITIONS,
        Unit::Count,
        "Lock acquisition calls by outcome: acquired, timed_out, interrupted, failed (re-entry not counted)."
    );
    describe_histogram!(
        names::ACQUIRE_WAIT,
        Unit::Seconds,
        "Time from an acquisition call to the lock acquired, in seconds."
    );
    describe_histogram!(
        names::HOLD,
        Unit::Seconds,
        "Time from an acquisition to its holder's release, in seconds."
    );
    describe_counter!(
        names::HANDOVER_WAKEUPS,
        Unit::Count,
        "Release hints that woke a waiter of this process."
    );
    describe_counter!(
        names::RENEWALS,
        Unit::Count,
        "Lease renewals (watchdog and extend) by outcome: ok, failed."
    );
    describe_counter!(
        names::LOCKS_LOST,
        Unit::Count,
        "Holds lost before their holder released them."
    );
    describe_counter!(
        names::BACKEND_ERRORS,
        Unit::Count,
        "Errors the backend returned to the client, by kind."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_slot() {
        for (i, k) in KINDS.iter().enumerate() {
            assert_eq!(kind_index(*k), i, "{k:?}");
        }
        let labels: std::collections::HashSet<_> = KINDS.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), KINDS.len());
    }
}
