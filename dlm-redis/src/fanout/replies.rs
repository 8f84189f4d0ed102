//! What the nodes of one fanned-out request answered, and the verdicts drawn from it.

use dlm_core::backend::{BackendError, BackendErrorKind};

/// What the nodes answered to one fanned-out request; `None`: no answer in time.
pub(crate) struct Replies<T> {
    pub(crate) replies: Vec<Option<Result<T, BackendError>>>,
    /// The nodes the request went to (or was meant for: a busy or down node counts).
    pub(crate) asked: Vec<bool>,
}

impl<T> Replies<T> {
    pub(super) fn new(n: usize, targets: Option<&[bool]>) -> Self {
        Replies {
            replies: (0..n).map(|_| None).collect(),
            asked: (0..n).map(|i| targets.is_none_or(|t| t[i])).collect(),
        }
    }

    /// The answers that are not errors.
    pub(crate) fn ok(&self) -> impl Iterator<Item = &T> {
        self.replies
            .iter()
            .filter_map(|r| r.as_ref()?.as_ref().ok())
    }

    /// Nodes that failed or have not answered.
    pub(crate) fn failures(&self) -> usize {
        self.replies
            .iter()
            .filter(|r| !matches!(r, Some(Ok(_))))
            .count()
    }

    /// Nodes asked that have not answered (yet).
    pub(crate) fn pending(&self) -> usize {
        self.replies
            .iter()
            .zip(&self.asked)
            .filter(|(r, asked)| **asked && r.is_none())
            .count()
    }

    /// The most telling failure: an unexpected key or refused credentials, else a
    /// `NoQuorum` that counts the failures and quotes the first error.
    pub(crate) fn error(&self, what: &str, quorum: usize) -> BackendError {
        let errors: Vec<&BackendError> = self
            .replies
            .iter()
            .filter_map(|r| r.as_ref()?.as_ref().err())
            .collect();
        if let Some(e) = errors.iter().find(|e| {
            matches!(
                e.kind(),
                BackendErrorKind::UnexpectedKey | BackendErrorKind::Auth
            )
        }) {
            return e.duplicate();
        }
        let timeouts = self.pending();
        let first = errors
            .first()
            .map_or_else(|| "timed out".to_owned(), |e| e.to_string());
        let e = BackendError::new(
            BackendErrorKind::NoQuorum,
            format!(
                "{what}: {} of {} nodes failed ({timeouts} timed out), {quorum} needed; first error: {first}",
                self.failures(),
                self.replies.len(),
            ),
        );
        // No node that was asked got the request: nothing was applied anywhere.
        let unsent = self
            .replies
            .iter()
            .zip(&self.asked)
            .all(|(r, asked)| !asked || matches!(r, Some(Err(e)) if !e.may_have_applied()));
        if unsent { e.never_sent() } else { e }
    }
}
