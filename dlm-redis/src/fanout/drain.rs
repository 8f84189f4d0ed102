//! The fan-out's drainer: a background thread that reads the replies that came after
//! their caller stopped waiting (stragglers), and does what their operation asked for a
//! late reply ([`Late`]). See the module docs of `fanout`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use dlm_core::backend::{LockName, OwnerToken};
use dlm_core::metric_names as names;
use metrics::Counter;
use parking_lot::Mutex;
use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::conn::Pooled;
use crate::node::{Node, Outstanding};
use crate::protocol::{Call, ReleaseId};

type Conn = Pooled;

/// How often the drainer looks at its channel while it has stragglers.
const DRAIN_TICK: Duration = Duration::from_millis(20);

/// What is done with a reply that comes after the operation returned.
#[derive(Clone)]
pub(crate) enum Late {
    /// Nothing (a late release, extension, commit or inspection changes nothing that
    /// matters: the caller has moved on and counted that node as failed).
    Drop,
    /// Release the key of this acquisition on that node, whatever the reply said (the
    /// caller counted the node as failed, so a key there is nobody's). The owner token is
    /// unique to the acquisition, so this never touches a later one.
    Release { name: LockName, owner: OwnerToken },
}

impl Late {
    /// The acquisition (lock and owner token) whose later requests must wait for this one
    /// (see [`Node::busy`]).
    pub(crate) fn key(&self) -> Option<(LockName, OwnerToken)> {
        match self {
            Late::Drop => None,
            Late::Release { name, owner } => Some((name.clone(), *owner)),
        }
    }

    /// Does what was asked, on `conn` (the straggler's connection, all of whose replies
    /// were read: the release then follows the acquisition on one connection) or else on
    /// a pooled one, and counts a release.
    fn run(&self, node: &Node, conn: Option<&mut Conn>, counts: &LateReleases) {
        let Late::Release { name, owner } = self else {
            return;
        };
        let released = match conn {
            Some(conn) => {
                let call = node
                    .keys
                    .release_call(name, owner, ReleaseId::Undo.random());
                call.execute(&mut conn.con)
                    .map_err(|e| {
                        conn.broken = true;
                        node.endpoint.error(&e)
                    })
                    .and_then(|reply| node.reader().released(reply))
            }
            None => node
                .release(name, owner, ReleaseId::Undo.random())
                .map(|(released, _)| released),
        };
        counts.count(released.is_ok());
        if let Err(e) = released {
            log::debug!(
                "{}: releasing a late acquisition failed (it ends with its lease): {e}",
                node.endpoint
            );
        }
    }
}

/// The counters of late acquisitions released in the background
/// ([`names::STRAGGLERS_RELEASED`]), registered with the recorder in place when the
/// backend is built.
#[derive(Clone)]
pub(crate) struct LateReleases {
    ok: Counter,
    failed: Counter,
}

impl LateReleases {
    fn register(kind: &'static str) -> LateReleases {
        metrics::describe_counter!(
            names::STRAGGLERS_RELEASED,
            metrics::Unit::Count,
            "Late acquisitions of a fan-out (replies after the operation returned) released in the background, by outcome: ok, failed."
        );
        let counter = |outcome: &'static str| metrics::counter!(names::STRAGGLERS_RELEASED, names::BACKEND => kind, names::OUTCOME => outcome);
        LateReleases {
            ok: counter("ok"),
            failed: counter("failed"),
        }
    }

    fn count(&self, ok: bool) {
        if ok { &self.ok } else { &self.failed }.increment(1);
    }
}

/// A request whose caller has moved on.
pub(crate) struct Straggler {
    /// Counts it in its node's background until it is done.
    pub(crate) outstanding: Outstanding,
    /// When its reply is given up on (see `Node::straggler_limit`).
    pub(crate) give_up: Instant,
    pub(crate) conn: Conn,
    pub(crate) call: Call,
    pub(crate) replies: Vec<redis::Value>,
    pub(crate) late: Late,
}

/// Reads late replies in the background and does what their operation asked (see the
/// module docs). One thread per backend, started by the first straggler.
pub(crate) struct Drainer {
    inner: Arc<DrainerInner>,
}

struct DrainerInner {
    tx: Mutex<Option<Sender<Straggler>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counts: LateReleases,
}

impl Drainer {
    /// The drainer of a backend of `kind` (the `backend` label of its counters).
    pub(crate) fn new(kind: &'static str) -> Drainer {
        Drainer {
            inner: Arc::new(DrainerInner {
                tx: Mutex::new(None),
                thread: Mutex::new(None),
                counts: LateReleases::register(kind),
            }),
        }
    }

    pub(crate) fn handle(&self) -> Drainer {
        Drainer {
            inner: self.inner.clone(),
        }
    }

    pub(crate) fn running(&self) -> bool {
        self.inner
            .thread
            .lock()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Takes over a straggler until it is answered (or its connection fails).
    pub(crate) fn hand_over(&self, s: Straggler) {
        let mut tx = self.inner.tx.lock();
        let counts = &self.inner.counts;
        if tx.is_none() {
            let (sender, rx) = crossbeam_channel::unbounded();
            let thread_counts = counts.clone();
            match std::thread::Builder::new()
                .name("dlm-redis-drain".into())
                .spawn(move || drain(&rx, &thread_counts))
            {
                Ok(thread) => {
                    *self.inner.thread.lock() = Some(thread);
                    *tx = Some(sender);
                }
                Err(e) => {
                    log::error!("cannot start the fan-out's drainer thread: {e}");
                    complete(s, false, counts);
                    return;
                }
            }
        }
        let Some(tx) = tx.as_ref() else { return };
        if let Err(e) = tx.send(s) {
            complete(e.into_inner(), false, counts);
        }
    }

    pub(crate) fn stop(&self) {
        self.inner.tx.lock().take();
        if let Some(thread) = self.inner.thread.lock().take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// The drainer's loop: waits for the stragglers' replies (however long), then completes
/// them. Ends when the Redlock is dropped (its stragglers' connections are then closed
/// and their keys, if any, end with their leases).
fn drain(rx: &Receiver<Straggler>, counts: &LateReleases) {
    let mut stragglers: Vec<Straggler> = Vec::new();
    loop {
        if stragglers.is_empty() {
            match rx.recv() {
                Ok(s) => stragglers.push(s),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(s) => stragglers.push(s),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = stragglers
                .iter()
                .map(|s| PollFd::new(&s.conn.con, PollFlags::IN))
                .collect();
            let tick = Timespec::try_from(DRAIN_TICK).expect("a small duration");
            if poll(&mut fds, Some(&tick)).is_err() {
                continue;
            }
            fds.iter().map(|f| !f.revents().is_empty()).collect()
        };
        let now = Instant::now();
        for k in (0..ready.len()).rev() {
            if !ready[k] {
                if stragglers[k].give_up <= now {
                    log::debug!(
                        "{}: no reply within {:?}; the connection is given up",
                        stragglers[k].outstanding.node().endpoint,
                        stragglers[k].outstanding.node().straggler_limit()
                    );
                    complete(stragglers.swap_remove(k), false, counts);
                }
                continue;
            }
            let s = &mut stragglers[k];
            let done = match s.call.receive_some(&mut s.conn.con, &mut s.replies) {
                Ok(false) => continue,
                Ok(true) => true,
                Err(_) => false,
            };
            complete(stragglers.swap_remove(k), done, counts);
        }
    }
}

/// Ends a straggler: its late action runs (on its connection when every reply was read,
/// else on another), its connection goes back to the pool or is discarded, and its node
/// stops counting it.
fn complete(s: Straggler, answered: bool, counts: &LateReleases) {
    let Straggler {
        outstanding,
        mut conn,
        late,
        ..
    } = s;
    if answered {
        late.run(outstanding.node(), Some(&mut conn), counts);
    } else {
        conn.broken = true;
        drop(conn);
        late.run(outstanding.node(), None, counts);
    }
    drop(outstanding);
}
