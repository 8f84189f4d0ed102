//! Redlock's fan-out: one request per node, all sent before any reply is read, and an
//! answer as soon as the outcome is decided.
//!
//! - The calling thread writes every request on an idle pooled connection and reads the
//!   replies: the oldest request's first, with a read that waits a short slice at most;
//!   when that one has not answered, whatever else is ready (a zero-timeout `poll`), and
//!   from then on a `poll` on every socket. A healthy round so costs no thread hand-off
//!   and about one wake-up. A node without an idle connection is connected by its worker
//!   thread (which then sends the request and hands the connection back through a
//!   channel and an eventfd that a `poll` on the sockets watches while any worker has not
//!   delivered), so one slow connect does not hold up the others.
//! - The caller stops waiting when the operation's `decided` test says the outcome is
//!   known (a quorum acquired, a quorum impossible, ...), after a short grace for the
//!   replies still on their way from healthy nodes (as long as the first reply took, at
//!   least [`GRACE`]), or at the deadline.
//! - Requests still unanswered then are stragglers: their connections go to the
//!   drainer, a background thread that reads the late replies (keeping each connection
//!   until its reply comes, it fails, or ten request deadlines have passed) and then
//!   does what the operation asked for late replies ([`Late`]): a late acquisition is
//!   released (on the same connection once its reply is read, so the release follows
//!   it), anything else is dropped. So every request is answered, or its connection
//!   failed or was given up, before anything else is sent to that node for the same
//!   lock. (A request given up on may still be applied later by a server that was
//!   stopped longer than that: its key then lasts until its lease ends.)
//! - While a node has a straggler (or a late action) outstanding, later requests do not
//!   wait for it: it counts as failed at once ([`Node::busy`]). A paused minority thus
//!   costs one round's grace, not an I/O timeout per call, and a cleanup on one
//!   connection can never overtake a newer request on another.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind, LockName, OwnerToken};
use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::conn::{Job, Pooled};
use crate::node::{Node, Outstanding};
use crate::protocol::Call;

mod drain;
mod pickup;
mod replies;
mod shared;

pub(crate) use drain::Late;
use drain::{Drainer, Straggler};
use pickup::{Delivery, Pickup, clear, signal};
pub(crate) use replies::Replies;
pub(crate) use shared::same_for_all;

/// The least time the replies of the other nodes are awaited once the outcome is
/// decided (more when the first reply took longer).
const GRACE: Duration = Duration::from_millis(5);

/// The longest a round waits for its oldest unanswered request before it looks at the
/// others, and waits on all of them (see `Fanout::call_all`). A socket read timeout: the
/// kernel rounds it up to its timer tick (measured 7-12 ms here), so a round spends it
/// once at most.
const SLICE: Duration = Duration::from_millis(1);

type Conn = Pooled;

/// One request on its way: the node, its connection and what has been read of its
/// replies.
struct InFlight {
    i: usize,
    conn: Conn,
    call: Call,
    replies: Vec<redis::Value>,
}

/// The fan-out of one backend: the drainer that reads its late replies. The nodes are
/// given with each call (Redlock's N masters; the masters a cluster's renewals go to),
/// and each node has its own connect worker (see [`Node::spawn_connect`]).
pub(crate) struct Fanout {
    drainer: Drainer,
}

/// What the caller of a round and its connect workers share.
struct Round {
    /// Set when the caller stops waiting: connections delivered after that go to the
    /// drainer.
    over: bool,
    /// Then, per node whose worker had not delivered: its request counted in the
    /// node's background, for the worker to hand on.
    outstanding: Vec<Option<Outstanding>>,
}

impl Fanout {
    /// The fan-out of a backend of `kind` (the `backend` label of its metrics).
    pub(crate) fn new(kind: &'static str) -> Fanout {
        Fanout {
            drainer: Drainer::new(kind),
        }
    }

    /// How many threads this fan-out runs now over `nodes` (their connect workers and
    /// the drainer).
    pub(crate) fn threads(&self, nodes: &[Arc<Node>]) -> usize {
        nodes.iter().filter(|n| n.connect_worker_running()).count()
            + usize::from(self.drainer.running())
    }

    /// Sends `make(i, node)` to every targeted node of `nodes` (all when `targets` is
    /// `None`) and
    /// parses the replies as they come, until `decided` says the outcome is known (then a
    /// short grace for the others), every node answered, or `deadline`. Nodes that are
    /// down, or busy with an earlier straggler ([`Node::busy`]; `name`: the lock this
    /// request is about), count as failed at once; requests left unanswered go to the
    /// drainer with `late`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call_all<T>(
        &self,
        nodes: &[Arc<Node>],
        deadline: Instant,
        targets: Option<&[bool]>,
        key: Option<(&LockName, &OwnerToken)>,
        make: impl Fn(usize, &Node) -> Call,
        parse: impl Fn(&Node, &Call, redis::Value) -> Result<T, BackendError>,
        decided: impl Fn(&Replies<T>) -> bool,
        late: Late,
    ) -> Replies<T> {
        let n = nodes.len();
        let mut replies = Replies::new(n, targets);
        let mut flying: Vec<InFlight> = Vec::with_capacity(n);
        // Made only when a node has no idle connection: its worker connects.
        let mut pickup: Option<Pickup> = None;
        for (i, node) in nodes.iter().enumerate() {
            if targets.is_some_and(|t| !t[i]) {
                continue;
            }
            if let Some(e) = node.down().or_else(|| node.busy(key)) {
                replies.replies[i] = Some(Err(e.never_sent()));
                continue;
            }
            let call = make(i, node);
            if let Some(mut conn) = node.idle_connection() {
                match call.send(&mut conn.con) {
                    Ok(()) => flying.push(InFlight {
                        i,
                        conn,
                        call,
                        replies: Vec::new(),
                    }),
                    Err(e) => {
                        conn.broken = true;
                        replies.replies[i] = Some(Err(node.endpoint.error(&e)));
                    }
                }
                continue;
            }
            if pickup.is_none() {
                match Pickup::new(n) {
                    Ok(p) => pickup = Some(p),
                    Err(e) => {
                        replies.replies[i] = Some(Err(e));
                        continue;
                    }
                }
            }
            let p = pickup.as_mut().expect("made above");
            p.connecting.push(i);
            self.connect_and_send(node, i, call, deadline, p, late.clone());
        }
        let started = Instant::now();
        // How long the first whole answer took: about what a healthy node needs.
        let mut first: Option<Duration> = None;
        let mut stop_at = deadline;
        let mut settled = false;
        // Whether the read of the oldest request waited its slice in vain: from then on
        // the round waits with a `poll` on every socket (its timeout is exact; the read
        // timeout's is rounded up to the kernel's timer tick).
        let mut slice_spent = false;
        loop {
            if !settled && decided(&replies) {
                settled = true;
                let grace = first.unwrap_or_default().max(GRACE);
                stop_at = stop_at.min(Instant::now() + grace);
            }
            if flying.is_empty() && pickup.as_ref().is_none_or(|p| p.connecting.is_empty()) {
                break;
            }
            let now = Instant::now();
            if now >= stop_at {
                break;
            }
            let mut outcomes: Vec<(usize, redis::RedisResult<redis::Value>)> = Vec::new();
            let connecting = pickup.as_ref().is_some_and(|p| !p.connecting.is_empty());
            // When the replies read now came in is not known (after a slice spent in vain).
            let mut arrival_unknown = false;
            let ready = if connecting || slice_spent || stop_at - now < SLICE {
                // All the sockets (and, while a connect worker may deliver, its wake-up
                // fd) at once.
                let wake = pickup.as_ref().map(|p| p.wake.as_ref());
                let (ready, woken) = wait(&flying, wake, stop_at - now);
                if woken && let Some(p) = &mut pickup {
                    clear(&p.wake);
                    p.collect(&mut flying, &mut replies);
                }
                ready
            } else {
                // The oldest request first: replies mostly come in the order the requests
                // went out, so a read that waits for the oldest sleeps once where a
                // `poll` on all of them wakes for each reply (a wake-up is the largest
                // client cost of a round on a loaded machine), and the next oldest is
                // then usually in already. The read waits `SLICE` at most (rounded up to
                // a timer tick: 4-10 ms); when nothing came, the others are looked at
                // without waiting and the round goes on with `poll`, so a stopped node
                // holds up the decision by a tick once, not by its timeout.
                let f = &mut flying[0];
                match f
                    .call
                    .receive_within(&mut f.conn.con, &mut f.replies, SLICE)
                {
                    Ok(false) => {
                        slice_spent = true;
                        arrival_unknown = true;
                        wait(&flying, None, Duration::ZERO).0
                    }
                    Ok(true) => {
                        let read = std::mem::take(&mut f.replies);
                        outcomes.push((0, f.call.finish(&mut f.conn.con, read)));
                        Vec::new()
                    }
                    Err(e) => {
                        outcomes.push((0, Err(e)));
                        Vec::new()
                    }
                }
            };
            // Read the answers that are ready (last first, so that removing keeps the
            // indices of those still to look at, and the rest in send order).
            for k in (0..ready.len()).rev() {
                if !ready[k] {
                    continue;
                }
                let f = &mut flying[k];
                // Ready: the read does not wait (bounded all the same, which keeps the
                // socket's read timeout as the oldest request's read left it).
                let outcome = match f
                    .call
                    .receive_within(&mut f.conn.con, &mut f.replies, SLICE)
                {
                    Ok(false) => continue,
                    Ok(true) => {
                        let read = std::mem::take(&mut f.replies);
                        f.call.finish(&mut f.conn.con, read)
                    }
                    Err(e) => Err(e),
                };
                outcomes.push((k, outcome));
            }
            // In decreasing `k` (the oldest request's alone, or those read above):
            // removing from the highest keeps the indices of the others.
            for (k, outcome) in outcomes {
                // The grace after the decision lasts as long as the first reply took (at
                // least `GRACE`): a reply found after a spent slice counts as a slice's.
                first.get_or_insert_with(|| {
                    if arrival_unknown {
                        SLICE
                    } else {
                        started.elapsed()
                    }
                });
                let InFlight {
                    i, mut conn, call, ..
                } = flying.remove(k);
                let node = &nodes[i];
                replies.replies[i] = Some(match outcome {
                    Ok(value) => parse(node, &call, value),
                    Err(e) => {
                        if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() {
                            conn.broken = true;
                        }
                        Err(node.endpoint.error(&e))
                    }
                });
            }
        }
        // Whatever is still on its way is late now: the drainer reads it, and its node
        // counts as busy until then.
        if let Some(p) = &mut pickup {
            let round = p.state.clone();
            let mut state = round.lock();
            state.over = true;
            p.collect(&mut flying, &mut replies);
            for &i in &p.connecting {
                // Its worker hands the request to the drainer (or gives up, dropping it).
                state.outstanding[i] = Some(nodes[i].background(late.key()));
            }
        }
        for f in flying {
            self.drainer.hand_over(Straggler {
                give_up: Instant::now() + nodes[f.i].straggler_limit(),
                outstanding: nodes[f.i].background(late.key()),
                conn: f.conn,
                call: f.call,
                replies: f.replies,
                late: late.clone(),
            });
        }
        replies
    }

    /// Has node `i`'s worker take a connection (connecting if needed), send `call` on
    /// it and deliver it to the caller, or to the drainer when the caller has stopped
    /// waiting.
    fn connect_and_send(
        &self,
        node: &Arc<Node>,
        i: usize,
        call: Call,
        deadline: Instant,
        p: &Pickup,
        late: Late,
    ) {
        let worker_node = node.clone();
        let node = node.clone();
        let drainer = self.drainer.handle();
        let (state, tx, wake) = (p.state.clone(), p.tx.clone(), p.wake.clone());
        let job: Job = Box::new(move || {
            let sent = if Instant::now() >= deadline {
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("{}: not connected in time", node.endpoint),
                )
                .never_sent())
            } else {
                node.connection()
                    .map_err(BackendError::never_sent)
                    .and_then(|mut conn| match call.send(&mut conn.con) {
                        Ok(()) => Ok(conn),
                        Err(e) => {
                            conn.broken = true;
                            Err(node.endpoint.error(&e))
                        }
                    })
            };
            let mut state = state.lock();
            if !state.over {
                let delivery = match sent {
                    Ok(conn) => Delivery::Sent(InFlight {
                        i,
                        conn,
                        call,
                        replies: Vec::new(),
                    }),
                    Err(e) => Delivery::Failed(i, e),
                };
                let _ = tx.send(delivery);
                signal(&wake);
                return;
            }
            // The caller has gone, and counted this request on the node.
            let outstanding = state.outstanding[i].take();
            drop(state);
            if let (Ok(conn), Some(outstanding)) = (sent, outstanding) {
                drainer.hand_over(Straggler {
                    give_up: Instant::now() + node.straggler_limit(),
                    outstanding,
                    conn,
                    call,
                    replies: Vec::new(),
                    late,
                });
            }
        });
        worker_node.spawn_connect(job);
    }

    /// Stops the drainer (it finishes what it is doing first; the stragglers it holds are
    /// dropped, and their keys end with their leases).
    pub(crate) fn stop(&self) {
        self.drainer.stop();
    }
}

/// Waits until a connection has something to read, the wake-up fd fires, or `timeout`;
/// which connections are ready, and whether the wake-up fired.
/// (`Call::receive_some` leaves no whole reply in a buffer, so the sockets are the
/// places to wait on.)
fn wait(flying: &[InFlight], wake: Option<&OwnedFd>, timeout: Duration) -> (Vec<bool>, bool) {
    let mut fds: Vec<PollFd<'_>> = flying
        .iter()
        .map(|f| PollFd::new(&f.conn.con, PollFlags::IN))
        .collect();
    if let Some(wake) = wake {
        fds.push(PollFd::new(wake, PollFlags::IN));
    }
    let timeout = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    });
    if poll(&mut fds, Some(&timeout)).is_err() {
        // EINTR or the like: look again.
        return (vec![false; flying.len()], false);
    }
    let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
    let woken = wake.is_some() && ready.last().copied().unwrap_or(false);
    let mut ready = ready;
    ready.truncate(flying.len());
    (ready, woken)
}
