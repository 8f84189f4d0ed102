//! Redis errors as typed backend errors.

use dlm_core::{BackendError, BackendErrorKind};
use redis::{ErrorKind, ServerErrorKind};

use crate::transport::{is_tls_error, words};

/// Maps a redis error to a typed backend error. The message names the server, never
/// credentials.
pub(crate) fn map_error(e: &redis::RedisError, server: &str) -> BackendError {
    if is_tls_error(e) {
        // Made by wire.rs from rustls's error: certificate and protocol facts only.
        return BackendError::new(
            BackendErrorKind::Tls,
            format!("{server}: {}", e.detail().unwrap_or_default()),
        );
    }
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        BackendErrorKind::Unavailable
    } else {
        match e.kind() {
            ErrorKind::AuthenticationFailed => BackendErrorKind::Auth,
            ErrorKind::Server(ServerErrorKind::BusyLoading) => BackendErrorKind::Busy,
            ErrorKind::Server(ServerErrorKind::ReadOnly) => BackendErrorKind::ReadOnly,
            ErrorKind::Server(ServerErrorKind::NoPerm) => BackendErrorKind::Permission,
            ErrorKind::Server(ServerErrorKind::MasterDown)
            | ErrorKind::Server(ServerErrorKind::TryAgain)
            | ErrorKind::Server(ServerErrorKind::ClusterDown) => BackendErrorKind::Unavailable,
            _ => classify_code(e.code().unwrap_or_default(), e.detail().unwrap_or_default()),
        }
    };
    BackendError::new(kind, format!("{server}: {}", words(e)))
}

fn classify_code(code: &str, detail: &str) -> BackendErrorKind {
    match code {
        "NOAUTH" | "WRONGPASS" => BackendErrorKind::Auth,
        "NOPERM" => BackendErrorKind::Permission,
        "OOM" => BackendErrorKind::OutOfMemory,
        // `min-replicas-to-write`: the master has too few replicas keeping up (a failover
        // took them, or they are cut off). Transient: retried, and with Sentinel the
        // master is looked up again, so the request reaches the new master.
        "NOREPLICAS" => BackendErrorKind::Unavailable,
        "BUSY" | "LOADING" => BackendErrorKind::Busy,
        "READONLY" => BackendErrorKind::ReadOnly,
        "WRONGTYPE" => BackendErrorKind::UnexpectedKey,
        "ERR" if detail.contains("max number of clients") => BackendErrorKind::Unavailable,
        "ERR" if detail.contains("OOM") => BackendErrorKind::OutOfMemory,
        "ERR"
            if detail.contains("NOPERM")
                || detail.contains("no permissions")
                // Redis 7.0 inside a script: "The user executing the script can't run
                // this command", "... can't access at least one of the keys", "... publish".
                || detail.contains("user executing the script can't") =>
        {
            BackendErrorKind::Permission
        }
        _ => BackendErrorKind::Protocol,
    }
}
