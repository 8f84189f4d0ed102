//! Exit statuses and the failure that carries one.

/// The lock was not obtained (`-n`, `-w`), unless `-E` says otherwise (as flock).
pub(crate) const CONFLICT: u8 = 1;
/// Bad arguments, a bad URL or lock name, no command, no backend (as clap's own).
pub(crate) const USAGE: u8 = 2;
/// The backend failed: unreachable, refused the credentials, no quorum (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran.
pub(crate) const LOST: u8 = 70;
/// The command exists but cannot be executed (as shells).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells).
pub(crate) const NOT_FOUND: u8 = 127;

/// Why `dlm` stops short: its exit status and what to print (prefixed with `dlm: `).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }

    /// The status for a library error: bad input is a usage error, anything else the
    /// backend's failure. The message is the library's, which never holds a password.
    pub(crate) fn from_lock_error(what: &str, e: &dlm_core::Error) -> Failure {
        let code = if e.is_invalid_argument() {
            USAGE
        } else {
            UNAVAILABLE
        };
        Failure::new(code, format!("{what}: {e}"))
    }
}

/// What a shell reports for a child's exit: its code, or 128+N for signal N.
pub(crate) fn of_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(u8::MAX),
        (None, None) => u8::MAX,
    }
}
