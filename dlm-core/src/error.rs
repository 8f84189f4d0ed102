//! The one error type of the front, and the error type backends report.

use std::error::Error as StdError;
use std::fmt;

/// The result type of every fallible lock operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock operation.
///
/// Contention is not an error: a lock that is held by someone else makes the `try_*`
/// operations return `Ok(None)`.
///
/// One convention for every dlm error: `Display` says what this error is, and
/// [`source`](StdError::source) gives the cause only when `Display` does not already say
/// it. [`Error::Backend`] and [`Error::InvalidArgument`] are transparent wrappers (they
/// display the inner error and pass on its source), so a report that walks the chain
/// (`anyhow`, `eyre`, a log line with causes) prints each message once.
///
/// ```
/// use dlm_core::{BackendError, BackendErrorKind, Error};
///
/// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e: Error = BackendError::new(BackendErrorKind::Unavailable, "redis://cache:6379/0")
///     .with_source(refused)
///     .into();
/// assert!(e.is_transient());
/// assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unavailable));
/// let mut chain = vec![e.to_string()];
/// let mut cause = std::error::Error::source(&e);
/// while let Some(c) = cause {
///     chain.push(c.to_string());
///     cause = c.source();
/// }
/// assert_eq!(chain, ["unavailable: redis://cache:6379/0", "refused"]);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The wait was interrupted through an [`Interrupt`](crate::Interrupt).
    Interrupted,
    /// The calling thread does not hold the lock it tried to unlock (Java's
    /// `IllegalMonitorStateException`).
    NotHeld,
    /// The lock was held, but its lease is gone: it expired, was force-released, or the
    /// backend lost it. Whatever the holder was protecting may have been entered by someone
    /// else since.
    LockLost,
    /// An argument was rejected before any I/O.
    InvalidArgument(InvalidArgument),
    /// The backend failed.
    Backend(BackendError),
    /// The calling thread asked for a hold that could only wait for itself, refused at
    /// once (no I/O): see [`Deadlock`].
    WouldDeadlock(Deadlock),
}

/// Why a hold was refused as one that would wait for the calling thread's own hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deadlock {
    /// A write hold asked for by a thread that holds a read hold of the same read-write
    /// lock. An upgrade cannot be granted safely: two readers upgrading at once would each
    /// wait for the other to leave. Release the read hold first (and check again what you
    /// read, since a writer may get in between), or take the write hold from the start and
    /// [`downgrade`](crate::WriteGuard::downgrade) it.
    Upgrade,
    /// A second permit of a semaphore asked for by a thread that holds one of it. A
    /// permit is not re-entrant (a thread that takes all of them would wait for itself):
    /// pass the guard down, or acquire the permits from different threads.
    SecondPermit,
}

impl fmt::Display for Deadlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Deadlock::Upgrade => {
                "the calling thread holds a read hold of this read-write lock: \
                 an upgrade to a write hold is refused (release the read hold first)"
            }
            Deadlock::SecondPermit => {
                "the calling thread already holds a permit of this semaphore \
                 (a permit is not re-entrant)"
            }
        })
    }
}

impl Error {
    /// The backend error, if this is one.
    pub fn backend(&self) -> Option<&BackendError> {
        match self {
            Error::Backend(e) => Some(e),
            _ => None,
        }
    }

    /// The kind of the backend error, if this is one: `e.backend_kind() ==
    /// Some(BackendErrorKind::Auth)` instead of matching on [`Error::Backend`].
    pub fn backend_kind(&self) -> Option<BackendErrorKind> {
        self.backend().map(BackendError::kind)
    }

    /// `true` for a backend failure that a later attempt may not see
    /// ([`BackendErrorKind::is_transient`]): worth retrying. `false` for every other
    /// error, including [`Error::LockLost`] (the lease is gone; retrying the same
    /// operation does not bring it back).
    pub fn is_transient(&self) -> bool {
        self.backend().is_some_and(BackendError::is_transient)
    }

    /// `true` for [`Error::InvalidArgument`].
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Interrupted => f.write_str("lock wait interrupted"),
            Error::NotHeld => f.write_str("the calling thread does not hold the lock"),
            Error::LockLost => f.write_str("the lock's lease was lost"),
            Error::InvalidArgument(e) => e.fmt(f),
            Error::Backend(e) => e.fmt(f),
            Error::WouldDeadlock(d) => write!(f, "would deadlock: {d}"),
        }
    }
}

impl StdError for Error {
    /// The wrapping variants are transparent: their `Display` is the inner error's, so
    /// `source` is the inner error's source, never the inner error itself (a report that
    /// walks the chain prints each message once).
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::InvalidArgument(e) => e.source(),
            Error::Backend(e) => e.source(),
            _ => None,
        }
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}

impl From<InvalidArgument> for Error {
    fn from(e: InvalidArgument) -> Self {
        Error::InvalidArgument(e)
    }
}

/// An argument that was rejected before any I/O: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArgument {
    argument: &'static str,
    reason: String,
}

impl InvalidArgument {
    /// A rejection of `argument` (a parameter name such as `"lease"`) for `reason`.
    pub fn new(argument: &'static str, reason: impl Into<String>) -> Self {
        InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }

    /// The name of the rejected argument, e.g. `"lease"` or `"name"`.
    pub fn argument(&self) -> &'static str {
        self.argument
    }

    /// Why it was rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid argument `{}`: {}", self.argument, self.reason)
    }
}

impl StdError for InvalidArgument {}

/// What kind of backend failure happened. Decides whether the front retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The server could not be reached (refused, reset, closed). Transient.
    Unavailable,
    /// The server did not answer within the I/O deadline. Transient.
    Timeout,
    /// Too few nodes of a quorum answered (Redlock). Transient.
    NoQuorum,
    /// The server is busy (a long script) or still loading its data. Transient.
    Busy,
    /// Authentication failed (wrong or missing password). Never retried.
    Auth,
    /// The user lacks a permission (ACL). Never retried.
    Permission,
    /// The node is a read-only replica.
    ReadOnly,
    /// The server is out of memory.
    OutOfMemory,
    /// A key at the lock's name is of another type, or has no expiry: something other
    /// than this library wrote it. Never waited on.
    UnexpectedKey,
    /// The server's answer did not make sense (protocol or script error).
    Protocol,
    /// The TLS connection could not be made: the server's certificate was refused (wrong
    /// name, unknown authority, expired), the server refused ours, or one side does not
    /// speak TLS. Never retried: it does not fix itself.
    Tls,
    /// The backend cannot do what was asked: it issues no fencing tokens (fencing is
    /// switched off, or the store has none). Never retried.
    Unsupported,
    /// The write was not acknowledged by enough replicas in time (the Redis backend's
    /// `wait_for_replicas`): an acquisition was undone, a renewal keeps the previous
    /// lease. Transient: the replicas may catch up.
    NotReplicated,
    /// The name is in use with other settings: a semaphore's holders hold it with
    /// another permit count (it is fixed while any permit is held). Never retried.
    Conflict,
    /// Anything else.
    Other,
}

impl BackendErrorKind {
    /// `true` for failures a later attempt may not see: the front retries these within
    /// the caller's wait budget.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            BackendErrorKind::Unavailable
                | BackendErrorKind::Timeout
                | BackendErrorKind::NoQuorum
                | BackendErrorKind::Busy
                | BackendErrorKind::NotReplicated
        )
    }

    /// The kind in snake case (`no_quorum`): the `kind` label of dlm's metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::NoQuorum => "no_quorum",
            BackendErrorKind::Busy => "busy",
            BackendErrorKind::Auth => "auth",
            BackendErrorKind::Permission => "permission",
            BackendErrorKind::ReadOnly => "read_only",
            BackendErrorKind::OutOfMemory => "out_of_memory",
            BackendErrorKind::UnexpectedKey => "unexpected_key",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Tls => "tls",
            BackendErrorKind::NotReplicated => "not_replicated",
            BackendErrorKind::Unsupported => "unsupported",
            BackendErrorKind::Conflict => "conflict",
            BackendErrorKind::Other => "other",
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::NoQuorum => "no quorum",
            BackendErrorKind::Busy => "busy",
            BackendErrorKind::Auth => "authentication failed",
            BackendErrorKind::Permission => "permission denied",
            BackendErrorKind::ReadOnly => "read-only replica",
            BackendErrorKind::OutOfMemory => "out of memory",
            BackendErrorKind::UnexpectedKey => "unexpected key",
            BackendErrorKind::Protocol => "protocol error",
            BackendErrorKind::Tls => "TLS failure",
            BackendErrorKind::NotReplicated => "not replicated",
            BackendErrorKind::Unsupported => "not supported",
            BackendErrorKind::Conflict => "conflict",
            BackendErrorKind::Other => "backend error",
        }
    }
}

impl fmt::Display for BackendErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend failure: a [`kind`](BackendError::kind), a message that never contains
/// secrets, and the underlying error, if attached, as [`source`](StdError::source) (then
/// the message must not repeat it: see [`Error`] for the convention).
///
/// A failed request may still have been applied (its reply was lost), unless the backend
/// says it was never sent ([`never_sent`](BackendError::never_sent)): the front undoes a
/// failed acquisition or downgrade only when it [`may_have_applied`](BackendError::may_have_applied).
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    never_sent: bool,
}

impl BackendError {
    /// A failure of `kind` described by `message`. The message must not contain
    /// passwords or owner tokens.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            message: message.into(),
            source: None,
            never_sent: false,
        }
    }

    /// The same error, saying that the request never reached the store (no connection
    /// could be made, the node was known to be down): nothing was applied, so there is
    /// nothing to undo.
    pub fn never_sent(mut self) -> Self {
        self.never_sent = true;
        self
    }

    /// The same failure for another request (a backend that reports one failure for
    /// several renewals of a batch): its kind, message and never-sent mark; not its
    /// source, which cannot be copied.
    pub fn duplicate(&self) -> BackendError {
        BackendError {
            kind: self.kind,
            message: self.message.clone(),
            source: None,
            never_sent: self.never_sent,
        }
    }

    /// Whether the failed request may have been applied: a timeout, a lost connection, a
    /// missing quorum or replica acknowledgement, a reply dlm could not read, another
    /// failure (`Timeout`, `Unavailable`, `NoQuorum`, `NotReplicated`, `Protocol`,
    /// `Other`), unless the backend said it was [`never_sent`](BackendError::never_sent).
    /// A refusal (credentials, permissions, TLS, a foreign key, a conflict, a read-only
    /// or out-of-memory or busy server, an unsupported call) applied nothing.
    pub fn may_have_applied(&self) -> bool {
        !self.never_sent
            && matches!(
                self.kind,
                BackendErrorKind::Timeout
                    | BackendErrorKind::Unavailable
                    | BackendErrorKind::NoQuorum
                    | BackendErrorKind::NotReplicated
                    | BackendErrorKind::Protocol
                    | BackendErrorKind::Other
            )
    }

    /// Attaches the underlying error, which `Display` does not repeat: reports print it as
    /// the cause.
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// See [`BackendErrorKind::is_transient`].
    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }

    /// `true` for [`BackendErrorKind::Timeout`].
    pub fn is_timeout(&self) -> bool {
        self.kind == BackendErrorKind::Timeout
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.kind, self.message)
        }
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
