//! The ids that releases publish.

/// The id a release publishes, which says when its message may wake a waiter (the
/// release-hint listeners act on it: `hints.rs`).
///
/// On Redlock a release reaches the nodes one after another, and each node publishes
/// when its copy is deleted. A waiter woken by the first node's message would find the
/// lock still held on the others, fail, and undo its own partial acquisition, and that
/// undo (a release too) would wake the next waiter, which would fail the same way: a
/// chain of attempts, two requests each, until the holder's release has reached a
/// quorum (measured under load: up to 447 requests for one hand-over among 16
/// waiters). So the message of a holder's release wakes a waiter once it has been heard
/// from a quorum of nodes (or at once when this process made the release, which returns
/// after a quorum). The undo of a failed acquisition is marked (an odd id) and wakes at
/// the first node: its keys are single copies, and a waiter that lost a split vote to
/// them may now win.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseId {
    /// A holder's release (or a forced one): counts once heard from a quorum.
    Release,
    /// The undo of a failed acquisition's partial keys: counts at once.
    Undo,
}

impl ReleaseId {
    /// A fresh random id of this kind.
    pub(crate) fn random(self) -> u64 {
        let id: u64 = rand::random();
        match self {
            ReleaseId::Release => id & !1,
            ReleaseId::Undo => id | 1,
        }
    }

    /// The kind of a heard id.
    pub(crate) fn of(id: u64) -> ReleaseId {
        if id & 1 == 0 {
            ReleaseId::Release
        } else {
            ReleaseId::Undo
        }
    }
}
