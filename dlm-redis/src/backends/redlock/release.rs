//! Release: a holder's release and the undo of a failed acquisition on every node (one
//! release id for all of them), the forced release, and the wake-up of this process's
//! waiters.

use std::time::Instant;

use dlm_core::backend::{BackendError, LockName, OwnerToken};

use crate::fanout::{Late, Replies, same_for_all};
use crate::protocol::ReleaseId;

use super::Redlock;

impl Redlock {
    /// Releases `owner`'s key on every node; returns as soon as a quorum released or
    /// refused (with a short grace for the others), late replies dropped.
    /// `kind`: a holder's release, or the undo of a failed acquisition (see [`ReleaseId`]).
    pub(super) fn release_all(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        kind: ReleaseId,
    ) -> Replies<bool> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        // One release id for all nodes: a listener that hears it from several wakes one
        // waiter.
        let release_id = kind.random();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            Some((name, owner)),
            same_for_all(|node, _| node.keys.release_call(name, owner, release_id)),
            |node, _, reply| node.reader().released(reply),
            |r: &Replies<bool>| {
                let released = r.ok().filter(|ok| **ok).count();
                let refused = r.ok().filter(|ok| !**ok).count();
                released >= q || refused > n - q
            },
            Late::Drop,
        );
        if replies.ok().any(|released| *released) {
            self.released_here(name, release_id);
        }
        replies
    }

    /// Wakes a waiter of this process for the release `id` at once (see `Hints::released`).
    fn released_here(&self, name: &LockName, id: u64) {
        if let (Some(hints), Some(node)) = (&self.inner.hints, self.nodes_ref().first()) {
            hints.released(|| node.keys.channel(name), id);
        }
    }

    /// A holder's release on every node (see [`dlm_core::backend::LockBackend::release`]).
    pub(super) fn release_hold(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let replies = self.release_all(name, owner, ReleaseId::Release);
        let released = replies.ok().filter(|ok| **ok).count();
        let refused = replies.ok().filter(|ok| !**ok).count();
        if released >= q {
            Ok(true)
        } else if refused > n - q {
            Ok(false)
        } else if replies.failures() == 0 {
            // Answers split without a quorum either way: the lease was no longer a
            // quorum's, so it was not ours any more.
            Ok(false)
        } else {
            Err(replies.error("release", q))
        }
    }

    /// A release whoever holds the lock (see [`dlm_core::backend::LockBackend::force_release`]).
    pub(super) fn force_release_all(&self, name: &LockName) -> Result<bool, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        let release_id = ReleaseId::Release.random();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            None,
            same_for_all(|node, _| node.keys.force_release_call(name, release_id)),
            |node, _, reply| node.reader().force_release(name, reply),
            // Every node is asked; a slow one is not waited for once a quorum deleted.
            |r: &Replies<bool>| r.ok().filter(|d| **d).count() >= q,
            Late::Drop,
        );
        let deleted = replies.ok().filter(|d| **d).count();
        if deleted > 0 {
            self.released_here(name, release_id);
        }
        if replies.failures() > n - q {
            return Err(replies.error("force release", q));
        }
        Ok(deleted >= q)
    }
}
