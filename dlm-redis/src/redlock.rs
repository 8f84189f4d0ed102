//! Redlock: one lock over N independent Redis masters.

use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dlm_core::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Watch,
};
use parking_lot::Mutex;

use crate::conn::map_error;
use crate::hints::Hints;
use crate::node::{Call, Fencing, Node, NodeAcquire, Step};
use crate::options::{Options, backend, invalid, option_setters};

/// The quorum of `n` nodes: a strict majority, `n / 2 + 1`.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// A lock over N independent Redis masters (the Redlock algorithm).
///
/// Every request goes to all nodes in parallel (long-lived worker threads per node), with
/// the same owner token on each. An acquisition succeeds when a quorum (`N/2 + 1`) took
/// the key and the validity `lease - elapsed - (lease x drift + 2 ms)` is still positive;
/// otherwise the key is released on all nodes, timed-out ones included, and the waiter
/// retries after a random delay. A node that does not answer within the per-node deadline
/// (connect timeout + I/O timeout, 200 ms by default) counts as failed, so a minority of
/// dead, paused or busy nodes costs at most that deadline.
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

type Job = Box<dyn FnOnce() + Send>;

struct Inner {
    nodes: Vec<Arc<Node>>,
    /// One job queue per node, served by that node's workers.
    queues: Vec<Sender<Job>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    options: Options,
    quorum: usize,
    hints: Option<Hints>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queues stops the workers; each finishes its current request first
        // (bounded by the I/O timeout).
        self.queues.clear();
        let me = std::thread::current().id();
        for w in self.workers.get_mut().drain(..) {
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
    }
}

/// What the nodes answered to one fanned-out request; `None`: no answer in time.
struct Replies<T> {
    replies: Vec<Option<Result<T, BackendError>>>,
}

impl<T> Replies<T> {
    fn ok(&self) -> impl Iterator<Item = &T> {
        self.replies
            .iter()
            .filter_map(|r| r.as_ref()?.as_ref().ok())
    }

    fn failures(&self) -> usize {
        self.replies
            .iter()
            .filter(|r| !matches!(r, Some(Ok(_))))
            .count()
    }

    /// The most telling failure: an unexpected key, then the first error, else a timeout.
    fn error(&self, what: &str, quorum: usize) -> BackendError {
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
            return BackendError::new(e.kind(), e.message().to_owned());
        }
        let timeouts = self.replies.iter().filter(|r| r.is_none()).count();
        let first = errors
            .first()
            .map_or_else(|| "timed out".to_owned(), |e| e.to_string());
        BackendError::new(
            BackendErrorKind::NoQuorum,
            format!(
                "{what}: {} of {} nodes failed ({timeouts} timed out), {quorum} needed; first error: {first}",
                self.failures(),
                self.replies.len(),
            ),
        )
    }
}

impl Redlock {
    /// A builder for a Redlock over the masters at `urls` (see
    /// [`RedisBackend::builder`](crate::RedisBackend::builder) for the URL form).
    pub fn builder<S: AsRef<str>>(urls: &[S]) -> RedlockBuilder {
        RedlockBuilder {
            urls: urls.iter().map(|u| u.as_ref().to_owned()).collect(),
            options: Options::redlock(),
            verify_distinct: true,
        }
    }

    /// A Redlock over `urls` with the default settings.
    ///
    /// # Errors
    /// See [`RedlockBuilder::build`].
    pub fn new<S: AsRef<str>>(urls: &[S]) -> dlm_core::Result<Self> {
        Redlock::builder(urls).build()
    }

    /// The Redis keys and the channel of the lock called `name`.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a name that [`LockName::new`] rejects.
    pub fn keys(&self, name: &str) -> dlm_core::Result<crate::LockKeys> {
        Ok(self.inner.nodes[0].keys.all(&LockName::new(name)?))
    }

    /// How many nodes there are.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
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

    /// Runs `op` on the nodes marked in `targets` (all when `None`) in parallel on their
    /// worker threads; waits for the answers until `deadline` (the others' replies stay
    /// `None`).
    fn fan_out_to<T: Send + 'static>(
        &self,
        deadline: Instant,
        targets: Option<&[bool]>,
        op: impl Fn(&Node) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Replies<T> {
        let n = self.inner.nodes.len();
        let op = Arc::new(op);
        let (tx, rx) = crossbeam_channel::bounded(n);
        let mut sent = 0;
        for (i, (node, queue)) in self.inner.nodes.iter().zip(&self.inner.queues).enumerate() {
            if targets.is_some_and(|t| !t[i]) {
                continue;
            }
            sent += 1;
            let (node, op, tx) = (node.clone(), op.clone(), tx.clone());
            let job: Job = Box::new(move || {
                let reply = if Instant::now() >= deadline {
                    // Queued behind a slow request for too long: do not start late.
                    Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        "not started in time",
                    ))
                } else {
                    op(&node)
                };
                let _ = tx.send((i, reply));
            });
            let _ = queue.send(job);
        }
        drop(tx);
        collect(&rx, n, sent, deadline)
    }

    /// Runs one prepared call per node (those in `targets`) and parses the replies.
    /// When every targeted node has an idle pooled connection, the calling thread writes
    /// all requests and then reads all replies under one deadline (no thread hand-offs);
    /// otherwise (a node needs a new connection, e.g. after a failure) the per-node
    /// workers do it, connecting in parallel.
    fn call_all<T: Send + 'static>(
        &self,
        deadline: Instant,
        targets: Option<&[bool]>,
        make: impl Fn(&Node) -> Call + Send + Sync + 'static,
        parse: impl Fn(&Node, &Call, redis::Value) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Replies<T> {
        let nodes = &self.inner.nodes;
        // A node that is down (refusing connections) answers at once and is not asked.
        // Usually none is: nothing is allocated for them then.
        let mut down: Vec<(usize, BackendError)> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            if targets.is_none_or(|t| t[i])
                && let Some(e) = node.down()
            {
                down.push((i, e));
            }
        }
        let wanted = |i: usize| targets.is_none_or(|t| t[i]) && !down.iter().any(|(d, _)| *d == i);
        let calls: Vec<Option<Call>> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| wanted(i).then(|| make(n)))
            .collect();
        let mut replies = match pipelined(nodes, deadline, &calls) {
            Some(replies) => Replies {
                replies: replies
                    .into_iter()
                    .zip(nodes)
                    .zip(&calls)
                    .map(|((r, node), call)| {
                        let call = call.as_ref()?;
                        r.map(|r| r.and_then(|v| parse(node, call, v)))
                    })
                    .collect(),
            },
            None => {
                let wanted: Vec<bool> = (0..nodes.len()).map(wanted).collect();
                self.fan_out_to(deadline, Some(&wanted), move |node| {
                    let call = make(node);
                    node.execute(&call).and_then(|v| parse(node, &call, v))
                })
            }
        };
        for (i, e) in down {
            replies.replies[i] = Some(Err(e));
        }
        replies
    }

    fn deadline(&self, start: Instant) -> Instant {
        start + self.inner.options.connect_timeout + self.inner.options.io_timeout
    }

    /// Completes round 1 of an acquisition: the nodes whose plain reply needs the acquire
    /// script (someone's key is there: whose, for how long?) are asked with it, in one
    /// more fanned-out round. Skipped when the free nodes alone make a quorum.
    fn resolve(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Fencing,
        start: Instant,
        steps: Replies<Step>,
    ) -> Replies<NodeAcquire> {
        let again: Vec<bool> = steps
            .replies
            .iter()
            .map(|r| matches!(r, Some(Ok(Step::Script))))
            .collect();
        let acquired = steps
            .ok()
            .filter(|s| matches!(s, Step::Done(NodeAcquire::Acquired { .. })))
            .count();
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
        };
        if acquired >= self.inner.quorum || !again.contains(&true) {
            // Nodes left unasked count as failed: their keys, if ours, are released with
            // the rest on failure, and success does not need them.
            return replies;
        }
        let (name, owner) = (name.clone(), *owner);
        let name2 = name.clone();
        let second = self.call_all(
            self.deadline(start),
            Some(&again),
            move |node| node.acquire_script_call(&name, &owner, ttl, mode),
            move |node, call, reply| match node.parse_acquire(&name2, call, reply)? {
                Step::Done(answer) => Ok(answer),
                Step::Script => Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{}: the acquire script gave no answer", node.endpoint),
                )),
            },
        );
        for (i, reply) in second.replies.into_iter().enumerate() {
            if again[i] {
                replies.replies[i] = reply;
            }
        }
        replies
    }

    /// Releases `owner`'s key on every node, waiting at most one per-node deadline.
    fn release_all(&self, name: &LockName, owner: &OwnerToken) -> Replies<bool> {
        let start = Instant::now();
        // One release id for all nodes: a listener that hears it from several wakes one
        // waiter.
        let release_id: u64 = rand::random();
        let replies = {
            let (name, owner) = (name.clone(), *owner);
            self.call_all(
                self.deadline(start),
                None,
                move |node| node.release_call(&name, &owner, release_id),
                |node, _, reply| node.parse_flag(reply),
            )
        };
        if replies.ok().any(|released| *released) {
            self.released_here(name, release_id);
        }
        replies
    }

    /// Wakes a waiter of this process for the release `id` at once (see `Hints::released`).
    fn released_here(&self, name: &LockName, id: u64) {
        if let (Some(hints), Some(node)) = (&self.inner.hints, self.inner.nodes.first()) {
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
}

/// Writes `calls[i]` to node `i` (where given), then reads every reply, all before
/// `deadline`; `None` (nothing sent) when a targeted node has no idle connection.
fn pipelined(
    nodes: &[Arc<Node>],
    deadline: Instant,
    calls: &[Option<Call>],
) -> Option<Vec<Option<Result<redis::Value, BackendError>>>> {
    let mut conns = Vec::with_capacity(nodes.len());
    for (node, call) in nodes.iter().zip(calls) {
        conns.push(match call {
            Some(_) => Some(node.idle_connection()?),
            None => None,
        });
    }
    let mut replies: Vec<Option<Result<redis::Value, BackendError>>> =
        (0..nodes.len()).map(|_| None).collect();
    let mut sent = vec![false; nodes.len()];
    for i in 0..nodes.len() {
        let (Some(call), Some(conn)) = (&calls[i], conns[i].as_mut()) else {
            continue;
        };
        match call.send(&mut conn.con) {
            Ok(()) => sent[i] = true,
            Err(e) => {
                conn.broken = true;
                replies[i] = Some(Err(map_error(&e, &nodes[i].endpoint.to_string())));
            }
        }
    }
    for i in 0..nodes.len() {
        let (true, Some(call), Some(conn)) = (sent[i], &calls[i], conns[i].as_mut()) else {
            continue;
        };
        let node = &nodes[i];
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // The reply may still come: the connection cannot be reused.
            conn.broken = true;
            replies[i] = Some(Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("{}: no reply before the deadline", node.endpoint),
            )));
            continue;
        }
        // Cut the read short only when the deadline is nearer than the usual timeout
        // (rare: after a slow node), to spare a system call per read otherwise.
        let shortened = left < node.io_timeout();
        if shortened {
            let _ = conn.con.set_read_timeout(Some(left));
        }
        let reply = call.receive(&mut conn.con).map_err(|e| {
            if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() {
                conn.broken = true;
            }
            map_error(&e, &node.endpoint.to_string())
        });
        if shortened && !conn.broken {
            let _ = conn.con.set_read_timeout(Some(node.io_timeout()));
        }
        replies[i] = Some(reply);
    }
    Some(replies)
}

fn collect<T>(
    rx: &Receiver<(usize, Result<T, BackendError>)>,
    n: usize,
    expected: usize,
    deadline: Instant,
) -> Replies<T> {
    let mut replies: Vec<Option<Result<T, BackendError>>> = (0..n).map(|_| None).collect();
    for _ in 0..expected {
        match rx.recv_deadline(deadline) {
            Ok((i, reply)) => replies[i] = Some(reply),
            Err(_) => break,
        }
    }
    Replies { replies }
}

impl LockBackend for Redlock {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let q = self.inner.quorum;
        let start = Instant::now();
        let fencing = self.inner.options.fencing;
        let mode = if fencing {
            Fencing::Redlock
        } else {
            Fencing::Off
        };
        let steps = {
            let (name, owner) = (name.clone(), *owner);
            let name2 = name.clone();
            self.call_all(
                self.deadline(start),
                None,
                move |node| node.acquire_call(&name, &owner, ttl, mode),
                move |node, call, reply| node.parse_acquire(&name2, call, reply),
            )
        };
        let replies = self.resolve(name, owner, ttl, mode, start, steps);
        let taken: Vec<bool> = replies
            .replies
            .iter()
            .map(|r| matches!(r, Some(Ok(NodeAcquire::Acquired { .. }))))
            .collect();
        let acquired = taken.iter().filter(|t| **t).count();
        let valid_until = ttl
            .checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v);
        if acquired >= q && valid_until.is_some_and(|v| v > Instant::now()) {
            let valid_until = valid_until.expect("checked");
            if !fencing {
                return Ok(Acquire::Acquired(Lease::new(valid_until)));
            }
            // Round 2: T = max(counters of the nodes we hold) + 1, committed to those
            // nodes while they still hold our token. Quorum intersection makes T larger
            // than every earlier committed token (see the README's "Fencing").
            let token = replies
                .ok()
                .filter_map(|r| match r {
                    NodeAcquire::Acquired { fence } => Some(*fence),
                    NodeAcquire::Held { .. } => None,
                })
                .max()
                .unwrap_or(0)
                + 1;
            let commits = {
                let (name, owner) = (name.clone(), *owner);
                self.call_all(
                    self.deadline(Instant::now()),
                    Some(&taken),
                    move |node| node.commit_call(&name, &owner, token),
                    |node, _, reply| node.parse_flag(reply),
                )
            };
            let committed = commits.ok().filter(|c| **c).count();
            if committed >= q && valid_until > Instant::now() {
                return Ok(Acquire::Acquired(
                    Lease::new(valid_until).with_fence(FencingToken::new(token)),
                ));
            }
            self.release_all(name, owner);
            let errors = (0..taken.len())
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
        // Failed: undo everywhere, including the nodes that did not answer (the request may
        // have landed after all).
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
        if replies.failures() > self.inner.nodes.len() - q {
            return Err(replies.error("acquire", q));
        }
        // Contention. The lock can be ours once enough holders' keys are gone.
        let mut held: Vec<Duration> = replies
            .ok()
            .filter_map(|r| match r {
                NodeAcquire::Held { remaining } => Some(*remaining),
                NodeAcquire::Acquired { .. } => None,
            })
            .collect();
        held.sort_unstable();
        let free = self.inner.nodes.len() - replies.failures() - held.len();
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
        let q = self.inner.quorum;
        let start = Instant::now();
        let replies = {
            let (name, owner) = (name.clone(), *owner);
            self.call_all(
                self.deadline(start),
                None,
                move |node| node.extend_call(&name, &owner, ttl),
                |node, _, reply| node.parse_flag(reply),
            )
        };
        let extended = replies.ok().filter(|ok| **ok).count();
        let refused = replies.ok().filter(|ok| !**ok).count();
        let valid_until = ttl
            .checked_sub(self.inner.options.drift(ttl))
            .map(|v| start + v)
            .filter(|v| *v > Instant::now());
        match valid_until {
            Some(v) if extended >= q => Ok(Some(Lease::new(v))),
            _ if refused > self.inner.nodes.len() - q => Ok(None),
            _ if extended >= q => Ok(None), // too slow: the extension's validity is gone
            _ => Err(replies.error("extend", q)),
        }
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let q = self.inner.quorum;
        let replies = self.release_all(name, owner);
        let released = replies.ok().filter(|ok| **ok).count();
        let refused = replies.ok().filter(|ok| !**ok).count();
        if released >= q {
            Ok(true)
        } else if refused > self.inner.nodes.len() - q {
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
        let q = self.inner.quorum;
        let start = Instant::now();
        let release_id: u64 = rand::random();
        let replies = {
            let name = name.clone();
            let name2 = name.clone();
            self.call_all(
                self.deadline(start),
                None,
                move |node| node.force_release_call(&name, release_id),
                move |node, _, reply| node.parse_force_release(&name2, reply),
            )
        };
        let deleted = replies.ok().filter(|d| **d).count();
        if deleted > 0 {
            self.released_here(name, release_id);
        }
        if replies.failures() > self.inner.nodes.len() - q {
            return Err(replies.error("force release", q));
        }
        Ok(deleted >= q)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let q = self.inner.quorum;
        let start = Instant::now();
        let replies = {
            let name = name.clone();
            let name2 = name.clone();
            self.call_all(
                self.deadline(start),
                None,
                move |node| node.inspect_call(&name),
                move |node, _, reply| node.parse_inspect(&name2, reply),
            )
        };
        if replies.failures() > self.inner.nodes.len() - q {
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
        hints.watch(self.inner.nodes.first()?.keys.channel(name))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        match (&self.inner.hints, self.inner.nodes.first()) {
            (Some(hints), Some(node)) => hints.wake_pending(|| node.keys.channel(name)),
            _ => false,
        }
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<String> = self
            .inner
            .nodes
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

/// Configures a [`Redlock`]. Created by [`Redlock::builder`].
#[must_use]
pub struct RedlockBuilder {
    urls: Vec<String>,
    options: Options,
    verify_distinct: bool,
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold passwords: only their number is shown.
        f.debug_struct("RedlockBuilder")
            .field("nodes", &self.urls.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedlockBuilder {
    option_setters!();

    /// Whether `build` asks every reachable node for its `run_id` to reject one server
    /// listed twice under different addresses (one server must never count twice toward
    /// a quorum). Nodes that are down are not checked. Defaults to `true`.
    pub fn verify_distinct(mut self, on: bool) -> Self {
        self.verify_distinct = on;
        self
    }

    /// Builds the Redlock and starts its worker threads (`pool_size` per node).
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for no nodes, a malformed URL or setting, or
    /// one server listed twice (the same resolved address, or the same `run_id`).
    pub fn build(self) -> dlm_core::Result<Redlock> {
        if self.urls.is_empty() {
            return Err(invalid(dlm_core::InvalidArgument::new(
                "urls",
                "Redlock needs at least one node",
            )));
        }
        let nodes = self.options.nodes(&self.urls).map_err(invalid)?;
        check_distinct_addresses(&nodes).map_err(invalid)?;
        if self.verify_distinct {
            check_distinct_servers(&nodes)?;
        }
        if nodes.len() % 2 == 0 {
            log::warn!(
                "Redlock over an even number of nodes ({}) tolerates no more failures than {}",
                nodes.len(),
                nodes.len() - 1
            );
        }
        let workers_per_node = self.options.pool_size as usize;
        let mut queues = Vec::new();
        let mut workers = Vec::new();
        for (i, _) in nodes.iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            queues.push(tx);
            for w in 0..workers_per_node {
                let rx = rx.clone();
                let handle = std::thread::Builder::new()
                    .name(format!("dlm-redlock-{i}-{w}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            job();
                        }
                    })
                    .map_err(|e| {
                        backend(BackendError::new(
                            BackendErrorKind::Other,
                            format!("cannot start a worker thread: {e}"),
                        ))
                    })?;
                workers.push(handle);
            }
        }
        let quorum = quorum(nodes.len());
        let hints = self.options.hints(&nodes);
        Ok(Redlock {
            inner: Arc::new(Inner {
                hints,
                nodes: nodes.into_iter().map(Arc::new).collect(),
                queues,
                workers: Mutex::new(workers),
                options: self.options,
                quorum,
            }),
        })
    }
}

fn check_distinct_addresses(nodes: &[Node]) -> Result<(), dlm_core::InvalidArgument> {
    let addrs: Vec<Vec<String>> = nodes.iter().map(|n| n.endpoint.socket_addrs()).collect();
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            if let Some(a) = addrs[i].iter().find(|a| addrs[j].contains(a)) {
                return Err(dlm_core::InvalidArgument::new(
                    "urls",
                    format!("nodes {i} and {j} are the same server ({a})"),
                ));
            }
        }
    }
    Ok(())
}

fn check_distinct_servers(nodes: &[Node]) -> dlm_core::Result<()> {
    let ids: Vec<Option<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes.iter().map(|n| s.spawn(move || n.run_id())).collect();
        handles
            .into_iter()
            .zip(nodes)
            .map(|(h, n)| match h.join() {
                Ok(Ok(id)) => Some(id),
                Ok(Err(e)) if e.kind() == BackendErrorKind::Auth => {
                    log::warn!("{}: cannot verify the node: {e}", n.endpoint);
                    None
                }
                Ok(Err(e)) => {
                    log::info!("{}: not reachable now, not verified: {e}", n.endpoint);
                    None
                }
                Err(_) => None,
            })
            .collect()
    });
    for i in 0..ids.len() {
        for j in i + 1..ids.len() {
            if ids[i].is_some() && ids[i] == ids[j] {
                return Err(invalid(dlm_core::InvalidArgument::new(
                    "urls",
                    format!("nodes {i} and {j} are the same server (same run_id)"),
                )));
            }
        }
    }
    Ok(())
}
