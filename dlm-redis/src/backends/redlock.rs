//! Redlock: one lock over N independent Redis masters.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Renewal, Watch,
};

use crate::fanout::{Fanout, Late, Replies};
use crate::hints::Hints;
use crate::node::Node;
use crate::options::Options;
use crate::protocol::{Call, Fencing, NodeAcquire, Step};

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
}

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
        let hints =
            Hints::when_enabled(&options, nodes.iter().map(|n| n.endpoint.clone()).collect());
        Redlock {
            inner: Arc::new(Inner {
                hints,
                quorum: quorum(nodes.len()),
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

    /// Round 1 of an acquisition: `SET NX` (with a draw from the fencing stream) on every
    /// node; the nodes whose plain reply needs the acquire script (someone's key is
    /// there: whose, for how long?) are asked with it in one more fanned-out round,
    /// unless the free nodes already made a quorum. Returns as soon as the outcome is
    /// decided; a node that answers later is released (`Late::Release`).
    fn acquire_round(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Fencing,
        start: Instant,
    ) -> Replies<NodeAcquire> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let late = Late::Release {
            name: name.clone(),
            owner: *owner,
        };
        let acquired = |r: &Option<Result<Step, BackendError>>| {
            matches!(r, Some(Ok(Step::Done(NodeAcquire::Acquired { .. }))))
        };
        let steps = self.inner.fanout.call_all(
            self.nodes_ref(),
            self.deadline(start),
            None,
            Some((name, owner)),
            |_, node| node.acquire_call(name, owner, ttl, mode),
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
            |_, node| node.keys.acquire_script_call(name, owner, ttl, mode),
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
                    .filter(|a| matches!(a, NodeAcquire::Acquired { .. }))
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

    /// Releases `owner`'s key on every node; returns as soon as a quorum released or
    /// refused (with a short grace for the others), late replies dropped.
    fn release_all(&self, name: &LockName, owner: &OwnerToken) -> Replies<bool> {
        let (n, q) = (self.nodes_ref().len(), self.inner.quorum);
        let start = Instant::now();
        // One release id for all nodes: a listener that hears it from several wakes one
        // waiter.
        let release_id: u64 = rand::random();
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

impl LockBackend for Redlock {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let q = self.inner.quorum;
        let n = self.nodes_ref().len();
        let start = Instant::now();
        let fencing = self.inner.options.fencing;
        let mode = if fencing { Fencing::Draw } else { Fencing::Off };
        let replies = self.acquire_round(name, owner, ttl, mode, start);
        let taken: Vec<bool> = replies
            .replies
            .iter()
            .map(|r| matches!(r, Some(Ok(NodeAcquire::Acquired { .. }))))
            .collect();
        let acquired = taken.iter().filter(|t| **t).count();
        // Validity counts from the start of the round, however early it returned.
        let valid_until = ttl
            .checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v);
        if acquired >= q && valid_until.is_some_and(|v| v > Instant::now()) {
            let valid_until = valid_until.expect("checked");
            if !fencing {
                return Ok(Acquire::Acquired(Lease::new(valid_until)));
            }
            // Round 2: T = max(draws of the nodes we hold) + 1, committed to those nodes
            // while they still hold our token. Quorum intersection makes T larger than
            // every earlier committed token (see the README's "Fencing").
            let token = replies
                .ok()
                .filter_map(|r| match r {
                    NodeAcquire::Acquired { fence } => Some(*fence),
                    NodeAcquire::Held { .. } => None,
                })
                .max()
                .unwrap_or(0)
                + 1;
            let commits = self.inner.fanout.call_all(
                self.nodes_ref(),
                self.deadline(Instant::now()),
                Some(&taken),
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
            if committed >= q && valid_until > Instant::now() {
                return Ok(Acquire::Acquired(
                    Lease::new(valid_until).with_fence(FencingToken::new(token)),
                ));
            }
            self.release_all(name, owner);
            let errors = (0..n)
                .filter(|&i| taken[i] && !matches!(commits.replies[i], Some(Ok(_))))
                .count();
            return if errors > 0 {
                Err(commits.error("fencing commit", q))
            } else {
                // Our keys vanished under us between the rounds: contention.
                Ok(Acquire::Held {
                    retry_after: Some(self.split_vote_delay()),
                })
            };
        }
        // Failed: undo everywhere. Nodes that did not answer are either skipped now (busy
        // with the late request, whose reply the drainer answers with a release) or
        // asked here.
        if acquired > 0 || replies.failures() > 0 {
            self.release_all(name, owner);
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
                NodeAcquire::Acquired { .. } => None,
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
        let replies = self.release_all(name, owner);
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
        let release_id: u64 = rand::random();
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
