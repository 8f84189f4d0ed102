//! Exit statuses and the failure that carries one.
//!
//! sysexits(3)'s codes where one has the meaning (64 usage, 69 unavailable, 71 an
//! operating-system error, 77 no permission, 78 configuration); two keep dlm's own
//! meaning: 1 for a lock not obtained (as flock(1)) and 70 for a lost lock (not
//! EX_SOFTWARE's internal error). 126 and 127 are the shells'.

/// The lock was not obtained (`-n`, `-w`), unless `-E` says otherwise (as flock).
pub(crate) const CONFLICT: u8 = 1;
/// Bad arguments, a bad URL or lock name, no command, no backend, clap's own errors
/// included (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The backend failed: unreachable, no quorum, TLS refused (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (dlm's own meaning, not EX_SOFTWARE's).
pub(crate) const LOST: u8 = 70;
/// dlm itself could not do something of its own: start a thread, handle signals, wait
/// for the command, write its output (EX_OSERR).
pub(crate) const OS_ERROR: u8 = 71;
/// The backend refused the credentials, or a permission (EX_NOPERM).
pub(crate) const NO_PERMISSION: u8 = 77;
/// The settings disagree with the backend's state: a semaphore held with another
/// permit count (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The command exists but cannot be executed (as shells).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells).
pub(crate) const NOT_FOUND: u8 = 127;

/// Ends the process with `outcome`'s status, after printing a failure's message: no
/// destructor runs, so nothing is torn down or joined (the threads, connections and
/// signal handlers end with the process; stdout is flushed).
pub(crate) fn now(outcome: Result<u8, Failure>) -> ! {
    let code = match outcome {
        Ok(code) => code,
        Err(Failure { code, message }) => {
            if !message.is_empty() {
                eprintln!("dlm: {message}");
            }
            code
        }
    };
    std::process::exit(i32::from(code))
}

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

    /// The status for a library error: bad input is a usage error that names the flag
    /// that set it (see [`invalid`]), refused credentials or permissions are
    /// [`NO_PERMISSION`], anything else the backend's failure. The message is the
    /// library's, which never holds a password.
    pub(crate) fn from_lock_error(what: &str, e: &dlm_core::Error) -> Failure {
        Failure::from_lock_error_with(what, e, "--redis")
    }

    /// [`Failure::from_lock_error`], with `urls` naming where the URLs came from
    /// (`--redis` or `$DLM_REDIS_URL`).
    pub(crate) fn from_lock_error_with(
        what: &str,
        e: &dlm_core::Error,
        urls: &'static str,
    ) -> Failure {
        match e {
            dlm_core::Error::InvalidArgument(a) => Failure::usage(invalid(a, urls)),
            e if matches!(
                e.backend_kind(),
                Some(dlm_core::BackendErrorKind::Auth | dlm_core::BackendErrorKind::Permission)
            ) =>
            {
                Failure::new(NO_PERMISSION, format!("{what}: {e}"))
            }
            e => Failure::new(UNAVAILABLE, format!("{what}: {e}")),
        }
    }
}

/// The command-line flag that set each argument the libraries can reject (the
/// `InvalidArgument::argument` names of dlm-core, dlm-redis and dlm-postgres), so that a
/// message names what the user typed, not the library's setting. `None` for the settings
/// `dlm` leaves at the library's defaults (`pool_size`, `timeout`, `fence_ttl`,
/// `drift_factor`, `backoff`, `hold count`), which are never rejected.
fn flag(argument: &str, reason: &str, urls: &'static str) -> Option<&'static str> {
    Some(match argument {
        "lease" => "--lease",
        "watchdog_timeout" => "--watchdog",
        "name" => "lock name",
        "url" | "urls" | "seeds" | "sentinels" => urls,
        "master_name" => "--sentinel",
        // dlm-postgres's schema is what --prefix sets there.
        "prefix" | "schema" => "--prefix",
        "wait_for_replicas" if reason.starts_with("the timeout") => "--wait-timeout",
        "wait_for_replicas" => "--wait-replicas",
        "tls" | "the TLS provider" => "TLS options",
        "ca_file" => "--tls-ca-file",
        "client_cert" if reason.contains("private key") => "--tls-key",
        "client_cert" => "--tls-cert",
        _ => return None,
    })
}

/// The library's names in its reasons, and what `dlm` calls them.
const REWORDED: [(&str, &str); 3] = [
    ("TlsOptions::ca_file", "--tls-ca-file"),
    (
        "say so with TlsOptions::dangerously_skip_verification",
        "dlm does not skip them: give the server's CA with --tls-ca-file",
    ),
    ("io_timeout", "the reply deadline"),
];

/// `bad FLAG: REASON` for an argument a library rejected.
pub(crate) fn invalid(a: &dlm_core::InvalidArgument, urls: &'static str) -> String {
    let mut reason = a.reason().to_owned();
    for (library, cli) in REWORDED {
        reason = reason.replace(library, cli);
    }
    match flag(a.argument(), a.reason(), urls) {
        Some(flag) => format!("bad {flag}: {reason}"),
        None => format!("invalid setting `{}`: {reason}", a.argument()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(argument: &'static str, reason: &str) -> String {
        invalid(&dlm_core::InvalidArgument::new(argument, reason), "--redis")
    }

    /// Every argument name the libraries use for a setting `dlm` passes on maps to the
    /// flag that set it.
    #[test]
    fn library_arguments_are_named_by_their_flags() {
        for (argument, reason, says) in [
            (
                "lease",
                "0ns is below the minimum of 1 ms",
                "bad --lease: 0ns",
            ),
            (
                "watchdog_timeout",
                "must be at least 3 ms",
                "bad --watchdog: must",
            ),
            ("name", "must not be empty", "bad lock name: must"),
            ("url", "no scheme", "bad --redis: no scheme"),
            (
                "urls",
                "nodes 0 and 1 are the same server",
                "bad --redis: nodes",
            ),
            ("seeds", "not in cluster mode", "bad --redis: not"),
            ("sentinels", "the sentinels disagree", "bad --redis: the"),
            ("master_name", "unknown", "bad --sentinel: unknown"),
            ("prefix", "must be 1 to 64 bytes", "bad --prefix: must"),
            ("schema", "must be 1 to 40 bytes", "bad --prefix: must"),
            (
                "wait_for_replicas",
                "at least 1 replica",
                "bad --wait-replicas: at",
            ),
            (
                "wait_for_replicas",
                "the timeout must be positive and shorter than io_timeout (1s)",
                "bad --wait-timeout: the timeout must be positive and shorter than the reply deadline (1s)",
            ),
            (
                "tls",
                "no system root certificate found; give the CA with TlsOptions::ca_file",
                "bad TLS options: no system root certificate found; give the CA with --tls-ca-file",
            ),
            (
                "ca_file",
                "reading x: not found",
                "bad --tls-ca-file: reading",
            ),
            (
                "client_cert",
                "reading x: not found",
                "bad --tls-cert: reading",
            ),
            (
                "client_cert",
                "no private key read from k",
                "bad --tls-key: no",
            ),
        ] {
            let got = message(argument, reason);
            assert!(got.starts_with(says), "{argument}: {got:?}");
            assert!(!got.contains('`'), "{got:?}");
        }
        assert_eq!(
            invalid(
                &dlm_core::InvalidArgument::new("url", "no scheme"),
                "$DLM_REDIS_URL"
            ),
            "bad $DLM_REDIS_URL: no scheme"
        );
        // A setting dlm never passes on keeps the library's name.
        assert_eq!(
            message("pool_size", "must be at least 1"),
            "invalid setting `pool_size`: must be at least 1"
        );
    }
}
