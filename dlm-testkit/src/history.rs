//! A history checker: threads record the holds they believed they had, and
//! [`History::check`] looks for the two violations a lock must never show while its
//! assumptions hold:
//!
//! - **mutual exclusion**: two holds of one name whose windows overlap;
//! - **fencing order**: a hold that began after another had ended, with a token that is
//!   not larger (when both have tokens).
//!
//! A hold's window runs from when its acquisition returned to when its holder stopped
//! relying on it: the call to release, or the end of the lease as the holder knew it
//! ([`LockGuard::valid_until`], renewals included), whichever came first. Both ends are
//! taken on the holder's side, so a correct lock can never produce an overlap: the next
//! acquisition returns only after the release that followed the window's end. Times are
//! [`Instant`]s, so every recorder must live in this process (simulated processes are
//! separate clients).
//!
//! ```
//! use dlm_core::{Lock, LockClient};
//! use dlm_memory::MemoryBackend;
//! use dlm_testkit::history::History;
//!
//! let client = LockClient::new(MemoryBackend::new());
//! let history = History::new();
//! for _ in 0..3 {
//!     let guard = client.get_lock("job")?.lock()?;
//!     let hold = history.begin("main", &guard);
//!     // ... the critical section ...
//!     history.end(hold, &guard);
//!     guard.unlock()?;
//! }
//! let report = history.check();
//! assert_eq!(report.holds, 3);
//! report.assert_clean();
//! # Ok::<(), dlm_core::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use dlm_core::LockGuard;
use dlm_core::backend::Claim;
use parking_lot::Mutex;

/// One hold: who, which lock, when, and its fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold {
    /// The lock's name.
    pub name: String,
    /// Who held it (a label of the recorder's choice, e.g. "client 2, thread 1").
    pub owner: String,
    /// When the acquisition returned.
    pub from: Instant,
    /// When the holder stopped relying on it (release called, or its lease ended).
    pub until: Instant,
    /// The fencing token, if the backend issues them.
    pub token: Option<u64>,
    /// The kind of hold: the mutex's, a semaphore permit, a read or a write hold.
    pub claim: Claim,
    /// When the holder asked for it (at most `from`): its token is ordered after every
    /// hold that ended before then. For the mutex it is `from` (no one else holds between
    /// the grant and `from`); for a permit or a read hold, which others hold beside it,
    /// the token may be drawn with the grant, before `from`, so a recorder passes the
    /// instant before the acquisition call ([`History::begin_asked`]).
    pub asked: Instant,
}

impl Hold {
    /// A hold of `name` by `owner` over `[from, until)`.
    pub fn new(
        name: impl Into<String>,
        owner: impl Into<String>,
        from: Instant,
        until: Instant,
        token: Option<u64>,
    ) -> Self {
        Hold {
            name: name.into(),
            owner: owner.into(),
            from,
            until: until.max(from),
            token,
            claim: Claim::Exclusive,
            asked: from,
        }
    }

    /// This hold as one asked for at `asked` (see [`Hold::asked`]).
    pub fn with_asked(mut self, asked: Instant) -> Self {
        self.asked = asked.min(self.from);
        self
    }

    /// This hold as one of kind `claim` (a [`new`](Hold::new) one is the mutex's).
    pub fn with_claim(mut self, claim: Claim) -> Self {
        self.claim = claim;
        self
    }
}

/// A hold that has begun: pass it to [`History::end`].
#[derive(Debug)]
#[must_use = "a hold is recorded only when it is ended"]
pub struct OpenHold {
    name: String,
    owner: String,
    from: Instant,
    token: Option<u64>,
    claim: Claim,
    asked: Option<Instant>,
}

/// What [`History::check`] found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two holds of one name overlapped.
    Overlap {
        /// The hold that began first.
        first: Hold,
        /// The hold that began while `first` was still held.
        second: Hold,
    },
    /// More holders of a semaphore at once than it has permits.
    OverAdmission {
        /// The semaphore's permit count.
        permits: u32,
        /// The holds at that instant (the last one began it).
        holds: Vec<Hold>,
    },
    /// `later` began after `earlier` had ended, but its token is not larger.
    TokenOrder {
        /// The hold that ended first.
        earlier: Hold,
        /// The hold that began afterwards.
        later: Hold,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "{:?}: {} (token {:?}) and {} (token {:?}) held it at once for {:?}",
                first.name,
                first.owner,
                first.token,
                second.owner,
                second.token,
                first.until.min(second.until) - second.from
            ),
            Violation::OverAdmission { permits, holds } => write!(
                f,
                "{:?}: {} holders of {permits} permits at once: {}",
                holds[0].name,
                holds.len(),
                holds
                    .iter()
                    .map(|h| h.owner.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Violation::TokenOrder { earlier, later } => write!(
                f,
                "{:?}: {} took token {:?} after {} had held token {:?}",
                later.name, later.owner, later.token, earlier.owner, earlier.token
            ),
        }
    }
}

/// The outcome of [`History::check`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// How many holds were checked.
    pub holds: usize,
    /// How many lock names they covered.
    pub names: usize,
    /// Everything found wrong, by name and time.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Whether mutual exclusion was violated (for a read-write lock: a writer beside
    /// anyone).
    pub fn has_overlap(&self) -> bool {
        self.violations
            .iter()
            .any(|v| matches!(v, Violation::Overlap { .. }))
    }

    /// Whether a semaphore had more holders than permits.
    pub fn has_over_admission(&self) -> bool {
        self.violations
            .iter()
            .any(|v| matches!(v, Violation::OverAdmission { .. }))
    }

    /// Whether fencing order was violated.
    pub fn has_token_disorder(&self) -> bool {
        self.violations
            .iter()
            .any(|v| matches!(v, Violation::TokenOrder { .. }))
    }

    /// Panics, listing the first violations, unless there are none.
    #[track_caller]
    pub fn assert_clean(&self) {
        if self.violations.is_empty() {
            return;
        }
        let shown: Vec<String> = self
            .violations
            .iter()
            .take(5)
            .map(|v| v.to_string())
            .collect();
        panic!(
            "{} violation(s) in {} holds:\n  {}",
            self.violations.len(),
            self.holds,
            shown.join("\n  ")
        );
    }
}

/// A record of holds, shared by the threads that make them (`&History` is enough: it
/// locks internally).
#[derive(Debug, Default)]
pub struct History {
    holds: Mutex<Vec<Hold>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        History::default()
    }

    /// Starts a hold: call right after the acquisition returned `guard`. Reads the hold's
    /// fencing token (drawing it, on a backend that draws tokens when they are read); a
    /// hold without one (fencing off, or found lost) is not checked for token order.
    pub fn begin(&self, owner: impl Into<String>, guard: &LockGuard) -> OpenHold {
        OpenHold {
            name: guard.name().to_owned(),
            owner: owner.into(),
            from: Instant::now(),
            token: guard.fencing_token().ok().map(|t| t.get()),
            claim: guard.claim(),
            asked: None,
        }
    }

    /// [`begin`](History::begin) for a hold asked for at `asked`: the instant before the
    /// acquisition call. Needed for permits and read holds (see [`Hold::asked`]).
    pub fn begin_asked(
        &self,
        owner: impl Into<String>,
        guard: &LockGuard,
        asked: Instant,
    ) -> OpenHold {
        OpenHold {
            asked: Some(asked),
            ..self.begin(owner, guard)
        }
    }

    /// Ends a hold: call right before releasing `guard` (or when giving it up). The
    /// window ends now or at the end of the guard's lease, whichever came first.
    pub fn end(&self, hold: OpenHold, guard: &LockGuard) {
        let until = Instant::now().min(guard.valid_until());
        let asked = hold.asked.unwrap_or(hold.from);
        self.push(
            Hold::new(hold.name, hold.owner, hold.from, until, hold.token)
                .with_claim(hold.claim)
                .with_asked(asked),
        );
    }

    /// Adds a hold recorded some other way.
    pub fn push(&self, hold: Hold) {
        self.holds.lock().push(hold);
    }

    /// How many holds are recorded.
    pub fn len(&self) -> usize {
        self.holds.lock().len()
    }

    /// Whether no hold is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks every name's holds for overlaps and for tokens out of order.
    pub fn check(&self) -> Report {
        let holds = self.holds.lock().clone();
        let total = holds.len();
        // A name's mutex, semaphore and read-write lock are separate resources.
        let mut by_name: BTreeMap<(String, u8), Vec<Hold>> = BTreeMap::new();
        for h in holds {
            let resource = match h.claim {
                Claim::Permit { .. } => 1,
                Claim::Read | Claim::Write => 2,
                _ => 0,
            };
            by_name
                .entry((h.name.clone(), resource))
                .or_default()
                .push(h);
        }
        let mut violations = Vec::new();
        for holds in by_name.values_mut() {
            check_name(holds, &mut violations);
        }
        Report {
            holds: total,
            names: by_name.len(),
            violations,
        }
    }
}

/// One name's holds: an overlap sweep in order of start, then the token order against
/// every hold that ended before each start (a second pass in order of end).
///
/// The mutex: no two holds overlap. A semaphore: at no instant more holds than permits. A
/// read-write lock: no write hold overlaps another hold. Tokens: larger than every token
/// of a hold that ended before this one began, except that a read hold is only ordered
/// after the write holds before it (readers may share).
fn check_name(holds: &mut [Hold], violations: &mut Vec<Violation>) {
    holds.sort_by_key(|h| (h.from, h.until));
    if let Some(Claim::Permit { permits }) = holds.first().map(|h| h.claim) {
        over_admissions(holds, permits, violations);
    } else {
        // Each hold against the one reaching furthest so far (of those it excludes: a
        // read hold is only excluded by writes).
        let mut reach: Option<&Hold> = None;
        let mut write_reach: Option<&Hold> = None;
        for h in holds.iter() {
            let against = if h.claim == Claim::Read {
                write_reach
            } else {
                reach
            };
            if let Some(r) = against
                && h.from < r.until
            {
                violations.push(Violation::Overlap {
                    first: r.clone(),
                    second: h.clone(),
                });
            }
            if reach.is_none_or(|r| h.until > r.until) {
                reach = Some(h);
            }
            if h.claim != Claim::Read && write_reach.is_none_or(|r| h.until > r.until) {
                write_reach = Some(h);
            }
        }
    }
    // Fencing order: the largest token among holds ended by each start must be smaller.
    let mut ends: Vec<&Hold> = holds.iter().filter(|h| h.token.is_some()).collect();
    ends.sort_by_key(|h| h.until);
    let mut ended = ends.into_iter().peekable();
    let mut largest: Option<&Hold> = None;
    let mut largest_write: Option<&Hold> = None;
    let mut by_asked: Vec<&Hold> = holds.iter().collect();
    by_asked.sort_by_key(|h| h.asked);
    for h in by_asked {
        while let Some(e) = ended.next_if(|e| e.until <= h.asked) {
            if largest.is_none_or(|l| e.token > l.token) {
                largest = Some(e);
            }
            if e.claim != Claim::Read && largest_write.is_none_or(|l| e.token > l.token) {
                largest_write = Some(e);
            }
        }
        let before = if h.claim == Claim::Read {
            largest_write
        } else {
            largest
        };
        if let (Some(l), Some(token)) = (before, h.token)
            && l.token >= Some(token)
        {
            violations.push(Violation::TokenOrder {
                earlier: l.clone(),
                later: h.clone(),
            });
        }
    }
}

/// A semaphore's holds (sorted by start): each start against the holds still open then.
fn over_admissions(holds: &[Hold], permits: u32, violations: &mut Vec<Violation>) {
    let mut open: Vec<&Hold> = Vec::new();
    for h in holds {
        open.retain(|o| o.until > h.from);
        open.push(h);
        if open.len() > permits as usize {
            violations.push(Violation::OverAdmission {
                permits,
                holds: open.iter().map(|&o| o.clone()).collect(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn hold(base: Instant, owner: &str, from: u64, until: u64, token: u64) -> Hold {
        Hold::new("x", owner, at(base, from), at(base, until), Some(token))
    }

    #[test]
    fn a_sequence_of_holds_with_rising_tokens_is_clean() {
        let base = Instant::now();
        let h = History::new();
        // Out of order on purpose; touching ends are not an overlap.
        h.push(hold(base, "b", 10, 20, 2));
        h.push(hold(base, "a", 0, 10, 1));
        h.push(hold(base, "c", 25, 30, 7));
        h.push(Hold::new("y", "a", at(base, 5), at(base, 15), Some(1)));
        let report = h.check();
        assert_eq!((report.holds, report.names), (4, 2));
        report.assert_clean();
    }

    #[test]
    fn an_overlap_is_found_even_behind_a_short_hold() {
        let base = Instant::now();
        let h = History::new();
        h.push(hold(base, "long", 0, 100, 1));
        h.push(hold(base, "short", 10, 20, 2));
        h.push(hold(base, "late", 50, 60, 3));
        let report = h.check();
        let overlaps: Vec<(String, String)> = report
            .violations
            .iter()
            .filter_map(|v| match v {
                Violation::Overlap { first, second } => {
                    Some((first.owner.clone(), second.owner.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            overlaps,
            [
                ("long".to_owned(), "short".to_owned()),
                ("long".to_owned(), "late".to_owned())
            ]
        );
        assert!(!report.has_token_disorder(), "{:?}", report.violations);
    }

    #[test]
    fn a_token_not_larger_than_an_ended_holds_is_found() {
        let base = Instant::now();
        let h = History::new();
        h.push(hold(base, "a", 0, 10, 5));
        h.push(hold(base, "b", 20, 30, 3)); // after a ended, smaller token
        h.push(hold(base, "c", 40, 50, 5)); // equal to a's: also wrong
        h.push(hold(base, "d", 60, 70, 6));
        let report = h.check();
        let later: Vec<&str> = report
            .violations
            .iter()
            .filter_map(|v| match v {
                Violation::TokenOrder { earlier, later } => {
                    assert_eq!(earlier.owner, "a");
                    Some(later.owner.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(later, ["b", "c"]);
        assert!(!report.has_overlap());
        let text = report.violations[0].to_string();
        assert!(text.contains("b took token Some(3) after a"), "{text}");
    }

    #[test]
    fn overlapping_holds_are_not_ordered_by_token_and_untokened_ones_are_skipped() {
        let base = Instant::now();
        let h = History::new();
        // b overlaps a (an overlap, not a token error), c has no token.
        h.push(hold(base, "a", 0, 10, 2));
        h.push(hold(base, "b", 5, 15, 1));
        h.push(Hold::new("x", "c", at(base, 20), at(base, 30), None));
        let report = h.check();
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(report.has_overlap());
    }

    #[test]
    #[should_panic(expected = "1 violation(s) in 2 holds")]
    fn assert_clean_panics_with_the_violation() {
        let base = Instant::now();
        let h = History::new();
        h.push(hold(base, "a", 0, 10, 1));
        h.push(hold(base, "b", 5, 15, 2));
        h.check().assert_clean();
    }

    fn as_claim(h: Hold, claim: Claim) -> Hold {
        h.with_claim(claim)
    }

    #[test]
    fn a_semaphore_over_its_permits_is_found_and_within_them_is_clean() {
        let base = Instant::now();
        let two = Claim::Permit { permits: 2 };
        let h = History::new();
        h.push(as_claim(hold(base, "a", 0, 10, 1), two));
        h.push(as_claim(hold(base, "b", 5, 15, 2), two));
        h.push(as_claim(hold(base, "c", 10, 20, 3), two)); // a ended at 10
        h.check().assert_clean();
        h.push(as_claim(hold(base, "d", 12, 14, 4), two)); // b, c and d at 12
        let report = h.check();
        assert!(report.has_over_admission());
        assert_eq!(report.violations.len(), 1);
        // A permit whose token came with its grant, recorded late: ordered by when it
        // was asked for.
        let late = History::new();
        late.push(as_claim(hold(base, "y", 2, 4, 5), two));
        late.push(as_claim(hold(base, "x", 5, 9, 3), two));
        assert!(late.check().has_token_disorder());
        let late = History::new();
        late.push(as_claim(hold(base, "y", 2, 4, 5), two));
        late.push(as_claim(hold(base, "x", 5, 9, 3), two).with_asked(at(base, 1)));
        late.check().assert_clean();
        // The mutex of the same name is another resource.
        h.push(hold(base, "m", 0, 20, 9));
        assert_eq!(h.check().names, 2);
    }

    #[test]
    fn readers_share_but_a_writer_beside_anyone_is_an_overlap() {
        let base = Instant::now();
        let h = History::new();
        h.push(as_claim(hold(base, "r1", 0, 10, 1), Claim::Read));
        h.push(as_claim(hold(base, "r2", 5, 15, 2), Claim::Read));
        h.push(as_claim(hold(base, "w", 15, 20, 3), Claim::Write));
        // A read after the write: larger than the write's token; readers may share one.
        h.push(as_claim(hold(base, "r3", 21, 30, 4), Claim::Read));
        h.push(as_claim(hold(base, "r4", 22, 30, 4), Claim::Read));
        h.check().assert_clean();
        h.push(as_claim(hold(base, "w2", 25, 26, 5), Claim::Write));
        assert!(h.check().has_overlap());
        let h = History::new();
        h.push(as_claim(hold(base, "w", 0, 10, 7), Claim::Write));
        h.push(as_claim(hold(base, "r", 11, 12, 6), Claim::Read));
        assert!(h.check().has_token_disorder());
    }
}
