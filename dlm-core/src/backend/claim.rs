//! What kind of hold an acquisition asks for: the mutex's, a semaphore's permit, or a
//! read-write lock's read or write hold.

use std::fmt;
use std::time::Duration;

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
