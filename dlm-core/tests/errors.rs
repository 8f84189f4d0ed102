//! One convention for error chains: `Display` says what the error is, `source` gives the
//! cause only when `Display` does not already say it. A report that walks the chain
//! prints each message once.

use dlm_core::{BackendError, BackendErrorKind, Error, InvalidArgument, LockClient};
use dlm_memory::MemoryBackend;

fn chain(e: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push(c.to_string());
        cause = c.source();
    }
    out
}

/// No message of the chain contains the next one.
fn assert_no_repeats(e: &dyn std::error::Error) -> Vec<String> {
    let links = chain(e);
    for pair in links.windows(2) {
        assert!(
            !pair[0].contains(&pair[1]),
            "{:?} repeats its cause {:?} (chain {links:?})",
            pair[0],
            pair[1]
        );
    }
    links
}

#[test]
fn a_backend_error_with_a_cause_prints_each_message_once() {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    let e: Error = BackendError::new(BackendErrorKind::Unavailable, "redis://db:6379/0")
        .with_source(io)
        .into();
    assert_eq!(
        assert_no_repeats(&e),
        ["unavailable: redis://db:6379/0", "connection refused"]
    );
    // The inner error is the same message, so it is not a link of its own.
    assert_eq!(chain(e.backend().unwrap()), chain(&e));
}

#[test]
fn wrappers_without_a_cause_end_the_chain() {
    let backend: Error = BackendError::new(BackendErrorKind::Timeout, "no reply in 100ms").into();
    assert_eq!(assert_no_repeats(&backend), ["timeout: no reply in 100ms"]);
    let invalid: Error = InvalidArgument::new("lease", "must be at least 1 ms").into();
    assert_eq!(
        assert_no_repeats(&invalid),
        ["invalid argument `lease`: must be at least 1 ms"]
    );
    for e in [Error::LockLost, Error::NotHeld, Error::Interrupted] {
        assert_eq!(assert_no_repeats(&e).len(), 1);
    }
}

#[test]
fn errors_from_the_api_follow_it() {
    let client = LockClient::new(MemoryBackend::new());
    let e = client.get_lock("").unwrap_err();
    assert!(e.is_invalid_argument());
    assert_eq!(assert_no_repeats(&e).len(), 1);
    let e = client
        .get_lock("job")
        .unwrap()
        .with_lease(std::time::Duration::ZERO)
        .unwrap_err();
    assert_eq!(assert_no_repeats(&e).len(), 1);
}
