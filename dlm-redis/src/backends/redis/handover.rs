//! The mutex's release on [`RedisBackend`]: handed over to a waiting thread of this
//! process in the same request when one offered (`handover.lua`), else released, with
//! this process's waiters held back after a run of hand-overs (see DESIGN, "Hand-over in
//! the release").

use std::time::Instant;

use dlm_core::backend::{BackendError, Claim, FencingToken, LockName, OwnerToken, Successor};

use super::RedisBackend;
use crate::protocol::{NodeAcquire, ReleaseId};
use crate::topology::Topology;

impl RedisBackend {
    /// How many threads of this process wait for the lock `name` through this backend,
    /// asleep and offering to take it over: a release made through it now hands the lock
    /// to the longest waiting of them in the same request (on one server or a cluster,
    /// without `wait_for_replicas`), instead of letting it go free. For tests and
    /// diagnostics; `0` for a name that is not valid.
    pub fn handover_offers(&self, name: &str) -> usize {
        let (Some(hints), Ok(name)) = (&self.inner.hints, LockName::new(name)) else {
            return 0;
        };
        hints.offers(|| self.inner.keys.channel(&name))
    }

    /// [`LockBackend::release`] of the mutex: a hand-over to a waiter of this process, or
    /// a release (for others after a run of hand-overs).
    pub(super) fn release_mutex(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let for_others = match self.successor(name) {
            Ok(Some(next)) => return self.hand_over(name, owner, next),
            Ok(None) => false,
            Err(()) => true,
        };
        let id = ReleaseId::Release.random();
        if for_others && let Some(hints) = &self.inner.hints {
            // Before the request: its message may come back before the reply.
            hints.released_for_others(|| self.inner.keys.channel(name), id);
        }
        let announced = std::cell::Cell::new(false);
        let released = self.release_on(
            || self.inner.keys.slot(name),
            name,
            Claim::Exclusive,
            owner,
            |node| {
                let (released, published) = node.release(name, owner, id)?;
                announced.set(published);
                Ok(released)
            },
        )?;
        // Released for others and announced: this process's waiters hear the message
        // when the others do. Not announced (nobody marked the key), nobody else waits:
        // a local waiter is woken now.
        if released && !(for_others && announced.get()) {
            self.released_here(name, id);
        }
        Ok(released)
    }

    /// A waiter of this process for the lock `name` to hand it over to, on one server or
    /// a cluster. None with Sentinel, whose releases are journaled for a failover (a
    /// hand-over is not), nor with `wait_for_replicas` (a hand-over does not wait).
    ///
    /// `Err(())` after a run of hand-overs: this release lets the lock go free for the
    /// waiters of other processes, and this process's hold back until its message is back.
    fn successor(&self, name: &LockName) -> Result<Option<Successor>, ()> {
        if self.inner.options.replica_wait.is_some()
            || matches!(self.inner.target, Topology::Sentinel(_))
        {
            return Ok(None);
        }
        match &self.inner.hints {
            Some(hints) => hints.successor(|| self.inner.keys.channel(name)),
            None => Ok(None),
        }
    }

    /// The hand-over script on the lock's node: if the lock is `owner`'s, it becomes
    /// `next`'s (a new lease, and its fencing token drawn after `owner`'s when it will be
    /// read), and `next`'s thread wakes up holding it, without a request of its own. The
    /// lock never goes free in between; the waiters of other processes are not woken (it
    /// is not free), and every [`MAX_HANDOVERS_IN_A_ROW`](dlm_core::backend::MAX_HANDOVERS_IN_A_ROW)-th
    /// release lets it go free for them.
    fn hand_over(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        next: Successor,
    ) -> Result<bool, BackendError> {
        let (to, ttl) = (*next.owner(), next.ttl());
        let fenced = next.fenced() && self.inner.options.fencing;
        let outcome = self.on_node(name, |node| {
            let start = Instant::now();
            let (answer, token) = node.handover(name, owner, &to, ttl, fenced)?;
            Ok((answer, token, start))
        });
        match outcome {
            Ok((NodeAcquire::Acquired, token, start)) => {
                match self.lease(start, ttl) {
                    Some(lease) => next.grant(match token {
                        Some(t) => lease.with_fence(FencingToken::new(t)),
                        None => lease,
                    }),
                    // Too late to be of use: the successor undoes it, as a failed
                    // acquisition's.
                    None => drop(next),
                }
                Ok(true)
            }
            Ok((NodeAcquire::Held { .. }, ..)) => {
                next.decline();
                Ok(false)
            }
            // May have been applied: the successor undoes its token.
            Err(e) => Err(e),
        }
    }
}
