//! Sentinel's release journal: the releases made lately, and sending them again to a new
//! master after a failover (see [`Journal`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use dlm_core::backend::{Claim, LockName, OwnerToken};
use parking_lot::Mutex;

use crate::node::Node;
use crate::protocol::{Call, ReleaseId};

/// How long a release is kept in the journal: longer than a failover takes to be
/// noticed (the sentinels name the new master about 1 s after the promotion at their
/// default timings, and the watcher asks every 0.5 s), bounded so that the journal stays
/// small whatever the release rate.
const JOURNAL_KEEP: Duration = Duration::from_secs(10);
/// The most releases the journal keeps (the oldest go first).
const JOURNAL_MAX: usize = 100_000;

/// Sentinel: the releases made lately, with the generation of the master's address they
/// were made in. A failover by `SENTINEL FAILOVER` leaves the old master answering as a
/// master until Sentinel demotes it; a release that reached it there after the promotion
/// succeeded, but the promoted replica keeps the copy of the lock it had replicated, with
/// the holder's token, until its lease ends (the name stays blocked: 18-19 s of a 30 s
/// lease, measured). Sent again to the new master, such a release deletes that copy: it
/// is a compare-and-delete of the holder's own token, unique to its acquisition, so it
/// can touch nothing else (a later holder's key has another token).
#[derive(Default)]
pub(super) struct Journal(Mutex<VecDeque<Released>>);

struct Released {
    name: LockName,
    /// The mutex's (`Exclusive`) or a semaphore's or read-write lock's hold.
    claim: Claim,
    owner: OwnerToken,
    generation: u64,
    at: Instant,
}

impl Journal {
    /// Keeps the release of `owner`'s `claim` hold of `name`, made on the master of
    /// address `generation`.
    pub(super) fn record(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        generation: u64,
    ) {
        let mut entries = self.0.lock();
        let now = Instant::now();
        while entries
            .front()
            .is_some_and(|r| now.duration_since(r.at) > JOURNAL_KEEP)
            || entries.len() >= JOURNAL_MAX
        {
            entries.pop_front();
        }
        entries.push_back(Released {
            name: name.clone(),
            claim,
            owner: *owner,
            generation,
            at: now,
        });
    }

    /// The releases made in generations before `now`, within the last [`JOURNAL_KEEP`];
    /// taken out.
    fn take_before(&self, now: u64) -> Vec<Released> {
        let mut entries = self.0.lock();
        let (old, kept): (Vec<Released>, Vec<Released>) =
            entries.drain(..).partition(|r| r.generation < now);
        entries.extend(kept);
        old.into_iter()
            .filter(|r| r.at.elapsed() <= JOURNAL_KEEP)
            .collect()
    }

    /// After a change of master: the releases of the journal made on an earlier master
    /// are sent again to `node`, the master now, in one pipelined write (a semaphore's or
    /// read-write lock's, rarer, one by one).
    pub(super) fn release_again(&self, node: &Node) {
        let (again, groups): (Vec<Released>, Vec<Released>) = self
            .take_before(node.endpoint.generation())
            .into_iter()
            .partition(|r| r.claim == Claim::Exclusive);
        let id = ReleaseId::Release.random();
        for r in groups {
            if let Err(e) = node.release_claim(&r.name, r.claim, &r.owner, id) {
                log::warn!(
                    "{}: sending a release made on the former master again failed (its copy ends with its lease): {e}",
                    node.endpoint
                );
            }
        }
        if again.is_empty() {
            return;
        }
        let call = Call::batch(
            again
                .iter()
                .map(|r| node.keys.release_call(&r.name, &r.owner, id)),
        );
        let deleted = node.execute(&call).and_then(|reply| {
            node.reader()
                .batch(reply, again.len(), |v| node.reader().released(v))
        });
        match deleted {
            Ok(results) => {
                let n = results.iter().filter(|r| matches!(r, Ok(true))).count();
                log::info!(
                    "{}: sent {} releases made on the former master again: {n} copies of released locks deleted",
                    node.endpoint,
                    again.len()
                );
            }
            Err(e) => log::warn!(
                "{}: sending the former master's releases again failed (their copies end with their leases): {e}",
                node.endpoint
            ),
        }
    }
}
