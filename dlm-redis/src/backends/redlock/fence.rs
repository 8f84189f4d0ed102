//! Fencing tokens over N nodes: the proposal (one above the largest token seen), the fence
//! round, the settling of a token (the proposal taken by a quorum, else a commit round) and
//! the far-ahead rule (a node's stream more than 1 s ahead of a quorum's is left out).

use std::sync::atomic::Ordering;
use std::time::Instant;

use dlm_core::backend::{BackendError, FencingToken, LockName, OwnerToken};

use crate::fanout::{Late, Replies, same_for_all};
use crate::protocol::NodeFence;

use super::Redlock;

/// How far (1 s, as a token: milliseconds << 20) a node's fencing stream may be ahead of
/// the quorum's before it is left out of the token and logged (see [`quorum_limit`]).
const AHEAD_BOUND: u64 = 1_000 << 20;

impl Redlock {
    /// The token of an acquisition whose round drew on the nodes that took the lock
    /// (`fences[i]`: what node `i` drew), as [`fence_round`](Self::fence_round) settles
    /// it: the proposal when a quorum took it, else a commit round. `None` when no token
    /// could be settled (fewer than a quorum drew, or the commit fell short): the hold
    /// is the same, and its token is drawn when read.
    pub(super) fn token_of_acquisition(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        proposal: Option<u64>,
        fences: &[Option<NodeFence>],
    ) -> Option<u64> {
        let streams: Vec<Option<u64>> = fences
            .iter()
            .map(|f| f.and_then(NodeFence::stream))
            .collect();
        if streams.iter().flatten().count() < self.inner.quorum {
            return None;
        }
        let taken = fences
            .iter()
            .filter(|f| matches!(f, Some(NodeFence::Taken(_))))
            .count();
        match self.settle(name, owner, proposal, &streams, taken) {
            Settled::Token(t) => Some(t),
            Settled::Commits { error, .. } => {
                log::debug!(
                    "lock {name:?}: the token drawn with the acquisition was not committed, it is drawn when read: {error}"
                );
                None
            }
        }
    }

    /// The next proposal for a fencing stream: one above the largest token this backend
    /// has seen (unique to the call), or `None` before the first. One counter for every
    /// slot: a slot's stream is raised only by draws (the nodes' clocks) and by
    /// proposals, so a stream this process did not touch lately is usually below it;
    /// one that another process raised since (a draw from the clock, which runs far
    /// faster than this counter) refuses it, and the commit round that follows brings
    /// the counter up to that stream.
    pub(super) fn propose(&self) -> Option<u64> {
        self.inner
            .proposals
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t != 0).then(|| t.saturating_add(1))
            })
            .ok()
            .map(|t| t.saturating_add(1))
    }

    /// Logs, once per node, a fencing stream left out of a token for being far ahead.
    fn warn_ahead(&self, i: usize, by: u64) {
        if !self.inner.ahead_warned[i].swap(true, Ordering::Relaxed) {
            log::warn!(
                "{}: its fencing stream is {} ms ahead of a quorum's (a clock ahead, or a stream raised by one): left out of fencing tokens while it is more than {} ms ahead; check the node's clock (warned once)",
                self.inner.nodes[i].endpoint,
                by >> 20,
                AHEAD_BOUND >> 20,
            );
        }
    }

    /// The fencing token of `owner`'s hold: see [`LockBackend::fence`] and the README's
    /// "Fencing". One round (the fence script with a proposal) when a quorum takes the
    /// proposal; otherwise a commit round too.
    pub(super) fn fence_round(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let proposal = self.propose();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(Instant::now()),
            None,
            Some((name, owner)),
            same_for_all(|node, _| node.keys.fence_call(name, owner, proposal)),
            |node, _, reply| node.reader().fence(name, reply),
            |r: &Replies<NodeFence>| {
                let taken = r.ok().filter(|f| matches!(f, NodeFence::Taken(_))).count();
                let ours = r.ok().filter(|f| f.stream().is_some()).count();
                let not_ours = r.ok().filter(|f| **f == NodeFence::NotOurs).count();
                taken >= q
                    || not_ours > n - q
                    || ours + r.pending() < q
                    || (ours >= q && (proposal.is_none() || taken + r.pending() < q))
            },
            Late::Drop,
        );
        let not_ours = replies.ok().filter(|f| **f == NodeFence::NotOurs).count();
        if not_ours > n - q {
            return Ok(None);
        }
        let streams: Vec<Option<u64>> = replies
            .replies
            .iter()
            .map(|r| match r {
                Some(Ok(f)) => f.stream(),
                _ => None,
            })
            .collect();
        let ours = streams.iter().flatten().count();
        if ours < q {
            return Err(replies.error("fence", q));
        }
        let taken = replies
            .ok()
            .filter(|f| matches!(f, NodeFence::Taken(_)))
            .count();
        match self.settle(name, owner, proposal, &streams, taken) {
            Settled::Token(t) => Ok(Some(FencingToken::new(t))),
            Settled::Commits { refused, .. } if not_ours + refused > n - q => Ok(None),
            Settled::Commits { error, .. } => Err(error),
        }
    }

    /// The token, once a round has drawn on the nodes that hold `owner`'s key
    /// (`streams[i]`: node `i`'s stream after it, at least a quorum of them; `taken`: how
    /// many took the `proposal`). Taken by a quorum, the proposal is the token: it is above
    /// the stream of every node that took it, so above every earlier holder's token
    /// (quorum intersection), and every node that answered has its stream at or past it.
    /// Otherwise the token is one above the streams of a quorum (all that drew, but those
    /// far ahead of the quorum's), committed to every node that drew, in a second round.
    fn settle(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        proposal: Option<u64>,
        streams: &[Option<u64>],
        taken: usize,
    ) -> Settled {
        let q = self.inner.quorum;
        let (limit, ahead) = quorum_limit(streams, q);
        for (i, by) in ahead {
            self.warn_ahead(i, by);
        }
        if let (Some(p), true) = (proposal, taken >= q) {
            self.inner.proposals.fetch_max(p, Ordering::Relaxed);
            return Settled::Token(p);
        }
        let token = streams
            .iter()
            .flatten()
            .filter(|t| **t <= limit)
            .max()
            .expect("a quorum answered")
            + 1;
        let targets: Vec<bool> = streams.iter().map(Option::is_some).collect();
        let commits = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(Instant::now()),
            Some(&targets),
            Some((name, owner)),
            same_for_all(|node, _| node.keys.commit_call(name, owner, token)),
            |node, _, reply| node.reader().flag(reply),
            |r: &Replies<bool>| {
                let committed = r.ok().filter(|c| **c).count();
                committed >= q || committed + r.pending() < q
            },
            Late::Drop,
        );
        let committed = commits.ok().filter(|c| **c).count();
        if committed >= q {
            self.inner.proposals.fetch_max(token, Ordering::Relaxed);
            return Settled::Token(token);
        }
        Settled::Commits {
            refused: commits.ok().filter(|c| !**c).count(),
            error: commits.error("fencing commit", q),
        }
    }
}

/// How a token's settling ended (see [`Redlock::settle`]).
enum Settled {
    /// The token, committed to a quorum.
    Token(u64),
    /// The commit round fell short: `refused` nodes no longer held the key.
    Commits { refused: usize, error: BackendError },
}

/// The largest fencing stream that counts toward a token (`streams[i]`: node `i`'s
/// stream after the fence round, `None` if it did not answer as ours), and the nodes
/// left out for being more than [`AHEAD_BOUND`] ahead of it, with by how much. The
/// reference is the `q`-th lowest stream, so the streams that count are always at least
/// a quorum: a token above them is above every earlier holder's token by quorum
/// intersection alone, whatever the nodes left out hold.
fn quorum_limit(streams: &[Option<u64>], q: usize) -> (u64, Vec<(usize, u64)>) {
    let mut sorted: Vec<u64> = streams.iter().flatten().copied().collect();
    sorted.sort_unstable();
    let reference = sorted[q - 1];
    let limit = reference.saturating_add(AHEAD_BOUND);
    let ahead = streams
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.filter(|s| *s > limit).map(|s| (i, s - reference)))
        .collect();
    (limit, ahead)
}
