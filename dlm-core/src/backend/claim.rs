//! What kind of hold an acquisition asks for: the mutex's, a semaphore's permit, or a
//! read-write lock's read or write hold.

use std::fmt;
use std::time::Duration;

use super::{LockName, OwnerToken};

/// The longest a writer's waiting mark lasts (see [`writer_mark`]).
pub const WRITER_MARK: Duration = Duration::from_secs(3);

/// How long a [`Claim::Write`] attempt refused because of other holders marks the
/// read-write lock as awaited by a writer (new readers are refused meanwhile): the
/// attempt's `ttl`, at most [`WRITER_MARK`]. A waiting writer comes back before its mark
/// ends (a backend answers it with a `retry_after` of at most a third of the mark), so the
/// mark lasts while it waits; a writer that gave up (a `try_write`) or died holds readers
/// back for at most this long.
pub fn writer_mark(ttl: Duration) -> Duration {
    ttl.min(WRITER_MARK)
}

/// The kind of hold an acquisition asks for, and so the rule a backend checks it against.
///
/// A name is three independent resources: the mutex `name`, the semaphore `name` and the
/// read-write lock `name` never block one another (a backend keeps them under separate
/// keys). Read and write holds of one name share one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Claim {
    /// The mutex: one holder at a time ([`LockBackend::try_acquire`](super::LockBackend::try_acquire)
    /// and the other calls without `_group`).
    Exclusive,
    /// One permit of a semaphore with `permits` permits: at most `permits` holders at
    /// once. The count is fixed by the first holder while any permit is held; an
    /// acquisition that asks for another count gets
    /// [`BackendErrorKind::Conflict`](super::BackendErrorKind::Conflict).
    Permit {
        /// The semaphore's number of permits (at least 1).
        permits: u32,
    },
    /// A read hold: any number of readers at once, never beside a writer, and no new
    /// reader while a writer waits (writer-preferring).
    Read,
    /// A write hold: one writer, and no reader, at a time.
    Write,
}

impl Claim {
    /// `true` for the claims of a read-write lock.
    pub fn is_rw(self) -> bool {
        matches!(self, Claim::Read | Claim::Write)
    }

    /// The primitive, for messages: `"lock"`, `"semaphore"` or `"read-write lock"`.
    pub fn primitive(self) -> &'static str {
        match self {
            Claim::Exclusive => "lock",
            Claim::Permit { .. } => "semaphore",
            Claim::Read | Claim::Write => "read-write lock",
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claim::Exclusive => f.write_str("exclusive"),
            Claim::Permit { permits } => write!(f, "one of {permits} permits"),
            Claim::Read => f.write_str("read"),
            Claim::Write => f.write_str("write"),
        }
    }
}

/// The answer of [`LockBackend::supports`](super::LockBackend::supports) for a backend
/// that keeps every kind of hold this version of dlm-core defines: the mutex, permits,
/// read and write holds. A kind added in a later version answers `false` until the
/// backend learns it.
///
/// ```
/// use dlm_core::backend::{Claim, every_hold_kind};
///
/// assert!(every_hold_kind(Claim::Permit { permits: 3 }));
/// assert!(every_hold_kind(Claim::Read));
/// ```
pub fn every_hold_kind(claim: Claim) -> bool {
    matches!(
        claim,
        Claim::Exclusive | Claim::Permit { .. } | Claim::Read | Claim::Write
    )
}

/// One attempt at a group hold, for
/// [`LockBackend::try_acquire_group`](super::LockBackend::try_acquire_group).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct GroupRequest<'a> {
    /// The resource's name.
    pub name: &'a LockName,
    /// The kind of hold: never [`Claim::Exclusive`].
    pub claim: Claim,
    /// The owner token of this attempt.
    pub owner: &'a OwnerToken,
    /// The lease to set.
    pub ttl: Duration,
    /// Draw the fencing token with the hold (see
    /// [`try_acquire_fenced`](super::LockBackend::try_acquire_fenced)).
    pub fenced: bool,
    /// Who holds it, kept with the hold for
    /// [`inspect_group`](super::LockBackend::inspect_group): the client's label (host and
    /// process by default), at most [`MAX_LABEL_LEN`](super::MAX_LABEL_LEN) bytes, no control
    /// characters.
    pub label: Option<&'a str>,
}

impl<'a> GroupRequest<'a> {
    /// An attempt of `owner` at a hold of kind `claim` of `name` for `ttl`, without a token
    /// drawn with it and without a label.
    pub fn new(name: &'a LockName, claim: Claim, owner: &'a OwnerToken, ttl: Duration) -> Self {
        GroupRequest {
            name,
            claim,
            owner,
            ttl,
            fenced: false,
            label: None,
        }
    }

    /// The same attempt, drawing the token with the hold when `fenced`.
    pub fn fenced(mut self, fenced: bool) -> Self {
        self.fenced = fenced;
        self
    }

    /// The same attempt, with `label` kept with the hold.
    pub fn label(mut self, label: Option<&'a str>) -> Self {
        self.label = label;
        self
    }
}
