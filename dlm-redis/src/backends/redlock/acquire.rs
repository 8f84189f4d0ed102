//! Acquisition: the quorum round (`SET NX`, then the acquire script where a key is there),
//! the fenced round that draws the token with it, and the attempt that decides: a lease,
//! "held" with when to retry (the split-vote delay), or the undo of a failed round.

use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockName, OwnerToken,
};

use crate::fanout::{Late, Replies, same_for_all};
use crate::protocol::{NodeAcquire, NodeFence, ReleaseId, Step};

use super::Redlock;

impl Redlock {
    /// An acquisition: `SET NX` on every node; the nodes whose plain reply needs the acquire script (someone's key is
    /// there: whose, for how long?) are asked with it in one more fanned-out round,
    /// unless the free nodes already made a quorum. Returns as soon as the outcome is
    /// decided; a node that answers later is released (`Late::Release`).
    fn acquire_round(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        start: Instant,
    ) -> Replies<NodeAcquire> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let late = Late::Release {
            name: name.clone(),
            owner: *owner,
        };
        let acquired = |r: &Option<Result<Step, BackendError>>| {
            matches!(r, Some(Ok(Step::Done(NodeAcquire::Acquired))))
        };
        let steps = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            Some((name, owner)),
            same_for_all(|node, dialect| node.acquire_call_in(dialect, name, owner, ttl)),
            |node, call, reply| node.parse_acquire(name, call, reply),
            |r: &Replies<Step>| {
                let taken = r.replies.iter().filter(|x| acquired(x)).count();
                // A key that needs the script may be ours (a retry): not lost yet. Once the
                // nodes that answered could make a quorum with the script's help, the
                // script round can go ahead. A node that says "held" (the acquire script
                // answers at once with fencing) is counted with them: it tells a held
                // lock from failing nodes, so the round waits for the nodes still to
                // answer while they could make a quorum of such answers, or a held lock
                // with one node stopped and one slow would read as `NoQuorum`.
                let answered = r
                    .replies
                    .iter()
                    .filter(|x| {
                        matches!(
                            x,
                            Some(Ok(Step::Script | Step::Done(NodeAcquire::Held { .. })))
                        )
                    })
                    .count();
                taken + answered >= q || taken + answered + r.pending() < q
            },
            late.clone(),
        );
        let again: Vec<bool> = steps
            .replies
            .iter()
            .map(|r| matches!(r, Some(Ok(Step::Script))))
            .collect();
        let taken = steps.replies.iter().filter(|x| acquired(x)).count();
        let mut replies = Replies {
            replies: steps
                .replies
                .into_iter()
                .map(|r| {
                    r.and_then(|r| match r {
                        Ok(Step::Done(answer)) => Some(Ok(answer)),
                        Ok(Step::Script) => None,
                        Err(e) => Some(Err(e)),
                    })
                })
                .collect(),
            asked: steps.asked,
        };
        let held_first = replies
            .ok()
            .filter(|a| matches!(a, NodeAcquire::Held { .. }))
            .count();
        let maybe = again.iter().filter(|a| **a).count();
        if taken >= q || maybe == 0 || taken + maybe < q {
            // Nodes left unasked count as failed: their keys, if ours, are released with
            // the rest on failure, and success does not need them.
            return replies;
        }
        // A deadline of its own: the validity still counts from `start`.
        let second = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(Instant::now()),
            Some(&again),
            Some((name, owner)),
            same_for_all(|node, _| node.keys.acquire_script_call(name, owner, ttl)),
            |node, call, reply| match node.parse_acquire(name, call, reply)? {
                Step::Done(answer) => Ok(answer),
                Step::Script => Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{}: the acquire script gave no answer", node.endpoint),
                )),
            },
            // Decided by a quorum taken, or by enough nodes held by others that no
            // quorum is left (contention). Not by "no quorum is left" alone: the nodes of
            // this round answered the first one in time, so they are waited for, or a
            // held lock would read as failing nodes (`NoQuorum`) whenever one answer of
            // this round comes after the grace and a node missed the first round.
            |r: &Replies<NodeAcquire>| {
                let now_taken = r
                    .ok()
                    .filter(|a| matches!(a, NodeAcquire::Acquired))
                    .count();
                let now_held = r
                    .ok()
                    .filter(|a| matches!(a, NodeAcquire::Held { .. }))
                    .count();
                taken + now_taken >= q || held_first + now_held > n - q
            },
            late,
        );
        for (i, reply) in second.replies.into_iter().enumerate() {
            if again[i] {
                replies.replies[i] = reply;
            }
        }
        replies
    }

    /// An acquisition that draws the fencing token with it: the fenced acquire script on
    /// every node, carrying the `proposal` (one round: the script answers "held" itself).
    /// Each node that takes the lock (or finds it ours) draws in the same step: the
    /// proposal when its stream exists and is below it, else a new ID. Returns as soon as
    /// the outcome is decided, with what each node drew; a node that answers later is
    /// released (`Late::Release`), and its draw only raised its stream.
    fn acquire_fenced_round(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        start: Instant,
        proposal: Option<u64>,
    ) -> (Replies<NodeAcquire>, Vec<Option<NodeFence>>) {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            Some((name, owner)),
            same_for_all(|node, _| node.keys.acquire_fenced_call(name, owner, ttl, proposal)),
            |node, _, reply| node.reader().acquire_fenced(name, reply),
            |r: &Replies<(NodeAcquire, Option<NodeFence>)>| {
                let acquired = r
                    .ok()
                    .filter(|(a, _)| matches!(a, NodeAcquire::Acquired))
                    .count();
                let held = r.ok().count() - acquired;
                let taken = r
                    .ok()
                    .filter(|(_, f)| matches!(f, Some(NodeFence::Taken(_))))
                    .count();
                // As the fence round: once a quorum is ours, wait for the others only
                // while they could still make the proposal the token.
                taken >= q
                    || held > n - q
                    || acquired + r.pending() < q
                    || (acquired >= q && (proposal.is_none() || taken + r.pending() < q))
            },
            Late::Release {
                name: name.clone(),
                owner: *owner,
            },
        );
        let fences = replies
            .replies
            .iter()
            .map(|r| match r {
                Some(Ok((_, f))) => *f,
                _ => None,
            })
            .collect();
        let replies = Replies {
            replies: replies
                .replies
                .into_iter()
                .map(|r| r.map(|r| r.map(|(a, _)| a)))
                .collect(),
            asked: replies.asked,
        };
        (replies, fences)
    }

    fn split_vote_delay(&self) -> Duration {
        let jitter = self.inner.options.retry_jitter;
        if jitter.is_zero() {
            return Duration::ZERO;
        }
        Duration::from_nanos(rand::random_range(0..=jitter.as_nanos() as u64))
    }

    /// One acquisition attempt; with `fenced`, the token is drawn with it (see
    /// [`acquire_fenced_round`](Self::acquire_fenced_round)).
    pub(super) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Result<Acquire, BackendError> {
        let q = self.inner.quorum;
        let n = self.nodes_ref().len();
        let start = Instant::now();
        let (replies, fences, proposal) = if fenced {
            let proposal = self.propose();
            let (replies, fences) = self.acquire_fenced_round(name, owner, ttl, start, proposal);
            (replies, fences, proposal)
        } else {
            (
                self.acquire_round(name, owner, ttl, start),
                Vec::new(),
                None,
            )
        };
        let acquired = replies
            .ok()
            .filter(|r| matches!(r, NodeAcquire::Acquired))
            .count();
        // Validity counts from the start of the round, however early it returned.
        let valid_until = ttl
            .checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v);
        if acquired >= q && valid_until.is_some_and(|v| v > Instant::now()) {
            let lease = Lease::new(valid_until.expect("checked"));
            if !fenced {
                // The fencing token, if it is read, is drawn then (`fence`).
                return Ok(Acquire::Acquired(lease));
            }
            return Ok(Acquire::Acquired(
                match self.token_of_acquisition(name, owner, proposal, &fences) {
                    Some(t) => lease.with_fence(FencingToken::new(t)),
                    None => lease,
                },
            ));
        }
        // Failed: undo everywhere. Nodes that did not answer are either skipped now (busy
        // with the late request, whose reply the drainer answers with a release) or
        // asked here.
        if acquired > 0 || replies.failures() > 0 {
            self.release_all(name, owner, ReleaseId::Undo);
        }
        if acquired >= q {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "acquiring took {:?}, more than the lease's validity",
                    start.elapsed()
                ),
            ));
        }
        let mut held: Vec<Duration> = replies
            .ok()
            .filter_map(|r| match r {
                NodeAcquire::Held { remaining } => Some(*remaining),
                NodeAcquire::Acquired => None,
            })
            .collect();
        // Failing nodes are the reason, unless enough nodes are held by others that the
        // rest could not have made a quorum anyway (possible with an even node count).
        if replies.failures() > n - q && held.len() <= n - q {
            return Err(replies.error("acquire", q));
        }
        // Contention. The lock can be ours once enough holders' keys are gone.
        held.sort_unstable();
        let free = n - replies.failures() - held.len();
        let need = q.saturating_sub(free);
        let retry_after = match need {
            0 => self.split_vote_delay(),
            k => held[(k - 1).min(held.len().saturating_sub(1))] + self.split_vote_delay(),
        };
        Ok(Acquire::Held {
            retry_after: Some(retry_after),
        })
    }
}
