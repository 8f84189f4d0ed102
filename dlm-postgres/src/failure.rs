//! What a failed connection attempt or request means, as a [`BackendError`]; and the
//! listening connection's deadline on its runtime.

use std::future::Future;
use std::io;
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind};
use tokio_postgres::error::SqlState;

/// A request that did not come back with an answer.
pub(crate) enum Failure {
    /// Its deadline passed.
    TimedOut,
    /// The server or the connection said why.
    Postgres(tokio_postgres::Error),
    /// The socket, before the protocol began or while waiting for the server.
    Socket(io::Error),
    /// The TLS settings could not be used for this server (its name).
    Tls(String),
    /// The session is not what `target_session_attrs` asks for (or its answer made no
    /// sense): what that means, and why.
    Session(BackendErrorKind, &'static str),
}

/// `future`, bounded by `timeout`, on a `tokio` runtime (the listening connection's: see
/// `hints.rs`; requests run in `Io::run`).
pub(crate) async fn within<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, future).await {
        Ok(answer) => answer.map_err(Failure::Postgres),
        Err(_) => Err(Failure::TimedOut),
    }
}

impl Failure {
    pub(crate) fn leaves_broken(&self) -> bool {
        match self {
            Failure::TimedOut | Failure::Socket(_) | Failure::Tls(_) | Failure::Session(..) => true,
            Failure::Postgres(e) => e.as_db_error().is_none() || e.is_closed(),
        }
    }

    /// What a failed connection attempt means. Nothing was applied.
    pub(crate) fn connecting(self, servers: &str, deadline: Duration) -> BackendError {
        let at = format!("connecting to PostgreSQL at {servers}");
        let (kind, what) = match self {
            Failure::TimedOut => (
                BackendErrorKind::Timeout,
                format!("{at} took more than {deadline:?}"),
            ),
            Failure::Socket(e) => (
                BackendErrorKind::Unavailable,
                format!("{at}: error connecting to server: {e}"),
            ),
            Failure::Tls(e) => (
                BackendErrorKind::Tls,
                format!("{at}: error performing TLS handshake: {e}"),
            ),
            Failure::Session(kind, what) => return Self::described(servers, kind, what.to_owned()),
            Failure::Postgres(e) => {
                let chain = chain(&e);
                let kind = match e.as_db_error() {
                    Some(db) => db_kind(db.code()),
                    None => Self::kind_of(&chain),
                };
                return Self::described(servers, kind, chain);
            }
        };
        BackendError::new(kind, what).never_sent()
    }

    /// The kind of a failed connection attempt that the server sent no error code for,
    /// from the client library's text (`chain`).
    fn kind_of(chain: &str) -> BackendErrorKind {
        if chain.contains("error performing TLS handshake")
            || chain.contains("server does not support TLS")
        {
            BackendErrorKind::Tls
        } else if chain.contains("authentication error") || chain.contains("password missing") {
            BackendErrorKind::Auth
        } else if chain.contains("unexpected message from server") {
            BackendErrorKind::Protocol
        } else {
            BackendErrorKind::Unavailable
        }
    }

    /// A failed connection attempt's error of `kind`, saying why (`chain`).
    fn described(servers: &str, kind: BackendErrorKind, chain: String) -> BackendError {
        let what = match kind {
            BackendErrorKind::ReadOnly => format!(
                "no server at {servers} accepts writes (a standby, or target_session_attrs asks for one): {chain}"
            ),
            BackendErrorKind::Protocol => format!(
                "the server at {servers} does not speak PostgreSQL's protocol (is it the right port?): {chain}"
            ),
            _ => format!("connecting to PostgreSQL at {servers}: {chain}"),
        };
        BackendError::new(kind, what).never_sent()
    }

    /// What a failed request means. A statement the server refused with an error was
    /// rolled back (every request is one transaction): never applied. One that timed out
    /// or lost its connection may have been.
    pub(crate) fn requesting(self, timeout: Duration) -> BackendError {
        match self {
            Failure::TimedOut => BackendError::new(
                BackendErrorKind::Timeout,
                format!("PostgreSQL did not answer within {timeout:?}"),
            ),
            Failure::Postgres(e) => {
                let chain = chain(&e);
                match e.as_db_error() {
                    // A fatal error ends the session: the server may have committed the
                    // statement before it (an administrator's pg_terminate_backend).
                    Some(db) if db.severity() == "FATAL" || db.severity() == "PANIC" => {
                        BackendError::new(db_kind(db.code()), format!("PostgreSQL: {chain}"))
                    }
                    Some(db) => {
                        BackendError::new(db_kind(db.code()), format!("PostgreSQL: {chain}"))
                            .never_sent()
                    }
                    None => BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("PostgreSQL connection: {chain}"),
                    ),
                }
            }
            Failure::Socket(e) => BackendError::new(
                BackendErrorKind::Unavailable,
                format!("PostgreSQL connection: {e}"),
            ),
            Failure::Tls(e) => BackendError::new(BackendErrorKind::Tls, format!("PostgreSQL: {e}")),
            Failure::Session(_, what) => {
                BackendError::new(BackendErrorKind::Unavailable, format!("PostgreSQL: {what}"))
            }
        }
    }
}

/// The error and its causes, in one line.
fn chain(e: &tokio_postgres::Error) -> String {
    let mut s = match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if e.as_db_error().is_none() {
            s.push_str(": ");
            s.push_str(&cause.to_string());
        }
        source = cause.source();
    }
    s
}

/// The kind of a server's error code.
pub(crate) fn db_kind(code: &SqlState) -> BackendErrorKind {
    let c = code.code();
    if *code == SqlState::INVALID_PASSWORD || c.starts_with("28") {
        BackendErrorKind::Auth
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        BackendErrorKind::Permission
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        BackendErrorKind::ReadOnly
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        BackendErrorKind::Busy
    } else if *code == SqlState::PROTOCOL_VIOLATION {
        // A pooler refusing a start-up parameter, a server refusing what it was sent:
        // not an outage, and no retry changes it.
        BackendErrorKind::Protocol
    } else if *code == SqlState::QUERY_CANCELED {
        BackendErrorKind::Timeout
    } else if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") {
        // Connection exceptions, operator intervention (shutdown, terminated backend,
        // starting up), insufficient resources.
        BackendErrorKind::Unavailable
    } else {
        BackendErrorKind::Other
    }
}
