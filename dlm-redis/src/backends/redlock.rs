//! Redlock: one lock over N independent Redis masters.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Renewal, Watch,
};

use crate::fanout::{Fanout, Late, Replies};
use crate::hints::Hints;
use crate::node::Node;
use crate::options::Options;
use crate::protocol::{Call, NodeAcquire, NodeFence, ReleaseId, Step};

/// The quorum of `n` nodes: a strict majority, `n / 2 + 1`.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// A lock over N independent Redis masters (the Redlock algorithm).
///
/// Every request goes to all nodes at once, with the same owner token on each, and an
/// operation returns as soon as its outcome is decided (a quorum acquired, released or
/// extended, or a quorum impossible): a stopped or slow minority costs no latency, and a
/// late reply is dealt with in the background (a late acquisition is released). An
/// acquisition succeeds when a quorum (`N/2 + 1`) took the key and the validity
/// `lease - elapsed - (lease x drift + 2 ms)`, counted from the start of the round, is
/// still positive; otherwise the key is released on all nodes, and the waiter retries
/// after a random delay. A node that does not answer within the per-node deadline
/// (connect timeout + I/O timeout, 200 ms by default) counts as failed.
///
/// Its assumptions (bounded clock drift between the nodes, no node that restarts without
/// its data inside a lease) are in the README's "Semantics and caveats".
///
/// ```no_run
/// use dlm_core::{Lock, LockClient};
/// use dlm_redis::Redlock;
///
/// let backend = Redlock::new(&[
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])?;
/// let client = LockClient::new(backend);
/// let guard = client.get_lock("nightly-report")?.lock()?;
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    fanout: Fanout,
    options: Options,
    quorum: usize,
    hints: Option<Hints>,
    /// The largest fencing token this backend has seen a stream raised to, any slot's (0:
    /// none yet): the next fence proposes one above it (see [`Redlock::propose`]).
    proposals: AtomicU64,
    /// Per node, whether a fencing stream far ahead of the others was already logged.
    ahead_warned: Box<[AtomicBool]>,
}

/// How far (1 s, as a token: milliseconds << 20) a node's fencing stream may be ahead of
/// the quorum's before it is left out of the token and logged (see [`token_of_round`]).
const AHEAD_BOUND: u64 = 1_000 << 20;

impl Drop for Inner {
    fn drop(&mut self) {
        // Each worker finishes its current connect first (bounded by the connect
        // timeout); the drainer drops its stragglers (their keys end with their leases).
        self.fanout.stop();
        for node in &self.nodes {
            node.stop_connect_worker();
        }
    }
}

impl Redlock {
    /// A Redlock over `nodes` with `options` (built and checked by its builder).
    pub(crate) fn assemble(nodes: Vec<Node>, options: Options) -> Redlock {
        let endpoints = nodes.iter().map(|n| n.endpoint.clone()).collect();
        let hints = Hints::when_enabled(&options, endpoints, quorum(nodes.len()));
        Redlock {
            inner: Arc::new(Inner {
                hints,
                quorum: quorum(nodes.len()),
                proposals: AtomicU64::new(0),
                ahead_warned: nodes.iter().map(|_| AtomicBool::new(false)).collect(),
                nodes: nodes.into_iter().map(Arc::new).collect(),
                fanout: Fanout::new("redlock"),
                options,
            }),
        }
    }

    /// The Redis keys and the channel of the lock called `name`.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a name that [`LockName::new`] rejects.
    pub fn keys(&self, name: &str) -> dlm_core::Result<crate::protocol::LockKeys> {
        Ok(self.nodes_ref()[0].keys.all(&LockName::new(name)?))
    }

    /// How many nodes there are.
    pub fn nodes(&self) -> usize {
        self.nodes_ref().len()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// How many nodes' release-hint listeners are subscribed now (they start with the
    /// first wait).
    pub fn release_hint_listeners(&self) -> usize {
        self.inner.hints.as_ref().map_or(0, |h| h.listeners_up())
    }

    /// How many threads this Redlock runs now, besides the connection pools' and the
    /// release-hint listeners' (its connect workers start on first need, one per node,
    /// and a drainer starts with the first reply that comes late).
    pub fn threads(&self) -> usize {
        self.inner.fanout.threads(&self.inner.nodes)
    }

    fn nodes_ref(&self) -> &[Arc<Node>] {
        &self.inner.nodes
    }

    fn deadline(&self, start: Instant) -> Instant {
        start + self.inner.options.connect_timeout + self.inner.options.io_timeout
    }

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
            |_, node| node.acquire_call(name, owner, ttl),
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
            |_, node| node.keys.acquire_script_call(name, owner, ttl),
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
            |_, node| node.keys.acquire_fenced_call(name, owner, ttl, proposal),
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

    /// The token of an acquisition whose round drew on the nodes that took the lock
    /// (`fences[i]`: what node `i` drew), as [`fence_round`](Self::fence_round) settles
    /// it: the proposal when a quorum took it, else a commit round. `None` when no token
    /// could be settled (fewer than a quorum drew, or the commit fell short): the hold
    /// is the same, and its token is drawn when read.
    fn token_of_acquisition(
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

    /// Releases `owner`'s key on every node; returns as soon as a quorum released or
    /// refused (with a short grace for the others), late replies dropped.
    /// `kind`: a holder's release, or the undo of a failed acquisition (see [`ReleaseId`]).
    fn release_all(&self, name: &LockName, owner: &OwnerToken, kind: ReleaseId) -> Replies<bool> {
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
            |_, node| node.keys.release_call(name, owner, release_id),
            |node, _, reply| node.reader().flag(reply),
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

    fn split_vote_delay(&self) -> Duration {
        let jitter = self.inner.options.retry_jitter;
        if jitter.is_zero() {
            return Duration::ZERO;
        }
        Duration::from_nanos(rand::random_range(0..=jitter.as_nanos() as u64))
    }

    /// The next proposal for a fencing stream: one above the largest token this backend
    /// has seen (unique to the call), or `None` before the first. One counter for every
    /// slot: a slot's stream is raised only by draws (the nodes' clocks) and by
    /// proposals, so a stream this process did not touch lately is usually below it;
    /// one that another process raised since (a draw from the clock, which runs far
    /// faster than this counter) refuses it, and the commit round that follows brings
    /// the counter up to that stream.
    fn propose(&self) -> Option<u64> {
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
    fn fence_round(
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
            |_, node| node.keys.fence_call(name, owner, proposal),
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
            |_, node| node.keys.commit_call(name, owner, token),
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

    /// The lease of an extension that a quorum confirmed, if its validity is not gone.
    fn extended_lease(&self, start: Instant, ttl: Duration) -> Option<Lease> {
        ttl.checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v)
            .filter(|v| *v > Instant::now())
            .map(Lease::new)
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

impl Redlock {
    /// One acquisition attempt; with `fenced`, the token is drawn with it (see
    /// [`acquire_fenced_round`](Self::acquire_fenced_round)).
    fn acquire(
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

impl LockBackend for Redlock {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.acquire(name, owner, ttl, false)
    }

    /// The fenced acquire script on every node, carrying a proposal (one above the last
    /// token this backend saw): acquisition and token in one round when a quorum takes the
    /// lock and the proposal; a commit round follows when the proposal is not taken by a
    /// quorum (as in `fence`). The tokens are ordered as `fence`'s: a node draws only in
    /// the step that set (or found) our key.
    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let fenced = self.inner.options.fencing;
        self.acquire(name, owner, ttl, fenced)
    }

    /// The fence script on every node, with a proposal one above the largest token this
    /// backend has seen for the lock's slot: when a quorum takes it (their streams were
    /// below it), it is the token, in one round. Otherwise (another process fenced
    /// meanwhile, a node lost its stream, the first fence of the slot) the token is one
    /// above the streams of a quorum, committed in a second round.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.options.fencing {
            return Err(super::redis::fencing_off());
        }
        self.fence_round(name, owner)
    }

    fn extend(
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
            |_, node| node.keys.extend_call(name, owner, ttl),
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
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
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
            |_, node| {
                Call::batch(
                    renewals
                        .iter()
                        .map(|r| node.keys.extend_call(r.name, r.owner, r.ttl)),
                )
            },
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

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
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

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        let release_id = ReleaseId::Release.random();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            None,
            |_, node| node.keys.force_release_call(name, release_id),
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

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        let replies = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            None,
            |_, node| node.keys.inspect_call(name),
            |node, _, reply| node.reader().inspect(name, reply),
            // The q-th longest lease needs every answer (a busy node is not asked).
            |_: &Replies<Option<Duration>>| false,
            Late::Drop,
        );
        if replies.failures() > n - q {
            return Err(replies.error("inspect", q));
        }
        // Held while at least a quorum of nodes still has a key: until the q-th longest
        // remaining lease runs out.
        let mut remaining: Vec<Duration> = replies.ok().filter_map(|r| *r).collect();
        remaining.sort_unstable_by(|a, b| b.cmp(a));
        Ok(remaining.get(q - 1).copied())
    }

    /// A release message from any node wakes the waiter.
    fn watch(&self, name: &LockName) -> Option<Watch> {
        let hints = self.inner.hints.as_ref()?;
        hints.watch(self.nodes_ref().first()?.keys.channel(name))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        match (&self.inner.hints, self.nodes_ref().first()) {
            (Some(hints), Some(node)) => hints.wake_pending(|| node.keys.channel(name)),
            _ => false,
        }
    }

    fn kind(&self) -> &'static str {
        "redlock"
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<String> = self
            .nodes_ref()
            .iter()
            .map(|n| n.endpoint.to_string())
            .collect();
        f.debug_struct("Redlock")
            .field("nodes", &servers)
            .field("quorum", &self.inner.quorum)
            .field("prefix", &self.inner.options.prefix)
            .finish_non_exhaustive()
    }
}
