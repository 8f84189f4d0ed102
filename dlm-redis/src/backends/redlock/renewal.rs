//! Renewal: extending one hold or many (one batch per node) on a quorum, and what an
//! extension came to (the lease, "not ours", or an error).

use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, Lease, LockName, OwnerToken, Renewal};

use crate::fanout::{Late, Replies, same_for_all};
use crate::protocol::Call;

use super::Redlock;

impl Redlock {
    /// One hold's extension on every node (see [`dlm_core::backend::LockBackend::extend`]).
    pub(super) fn extend_hold(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            Some((name, owner)),
            same_for_all(|node, _| node.keys.extend_call(name, owner, ttl)),
            |node, _, reply| node.reader().flag(reply),
            |r: &Replies<bool>| {
                let extended = r.ok().filter(|ok| **ok).count();
                let refused = r.ok().filter(|ok| !**ok).count();
                extended >= q || refused > n - q
            },
            Late::Drop,
        );
        let extended = replies.ok().filter(|ok| **ok).count();
        let refused = replies.ok().filter(|ok| !**ok).count();
        extension(
            extended,
            refused,
            replies.failures(),
            n,
            q,
            self.extended_lease(start, ttl),
            || replies.error("extend", q),
        )
    }

    /// One batch per node (all the extensions in one write), all nodes at once: a round
    /// costs one round trip, whatever the number of holds; a node that has not answered
    /// when every hold is decided is left to the drainer.
    pub(super) fn extend_holds(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Vec<Result<Option<Lease>, BackendError>> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        if renewals.is_empty() {
            return Vec::new();
        }
        let start = Instant::now();
        let counts = |r: &Replies<Vec<Result<bool, BackendError>>>, k: usize| {
            let mut extended = 0;
            let mut refused = 0;
            for node in r.ok() {
                match node.get(k) {
                    Some(Ok(true)) => extended += 1,
                    Some(Ok(false)) => refused += 1,
                    _ => {}
                }
            }
            (extended, refused)
        };
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            None,
            same_for_all(|node, _| {
                Call::batch(
                    renewals
                        .iter()
                        .map(|r| node.keys.extend_call(r.name, r.owner, r.ttl)),
                )
            }),
            |node, _, reply| {
                node.reader()
                    .batch(reply, renewals.len(), |v| node.reader().flag(v))
            },
            |r| {
                (0..renewals.len()).all(|k| {
                    let (extended, refused) = counts(r, k);
                    extended >= q || refused > n - q
                })
            },
            Late::Drop,
        );
        renewals
            .iter()
            .enumerate()
            .map(|(k, renewal)| {
                let (extended, refused) = counts(&replies, k);
                let failed = n - extended - refused;
                extension(
                    extended,
                    refused,
                    failed,
                    n,
                    q,
                    self.extended_lease(start, renewal.ttl),
                    || replies.error("extend", q),
                )
            })
            .collect()
    }

    /// The lease of an extension that a quorum confirmed, if its validity is not gone.
    fn extended_lease(&self, start: Instant, ttl: Duration) -> Option<Lease> {
        ttl.checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v)
            .filter(|v| *v > Instant::now())
            .map(Lease::new)
    }
}

/// What one hold's extension came to on the nodes that answered: the lease, "not ours",
/// or an error when neither has a quorum.
fn extension(
    extended: usize,
    refused: usize,
    failed: usize,
    n: usize,
    q: usize,
    lease: Option<Lease>,
    error: impl FnOnce() -> BackendError,
) -> Result<Option<Lease>, BackendError> {
    if extended >= q {
        // Too slow: the extension's validity is gone, so it is not ours any more.
        return Ok(lease);
    }
    if refused > n - q || failed == 0 {
        // Refused by too many to reach a quorum, or the answers split with none failed:
        // the lease was no longer a quorum's.
        return Ok(None);
    }
    Err(error())
}
