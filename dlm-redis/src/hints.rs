//! Release hints: one pub/sub listener thread per server routes release messages to the
//! threads waiting for those locks.
//!
//! Each listener holds one dedicated (not pooled) connection with a read timeout and
//! PSUBSCRIBEs to `prefix:*:released` once, so a waiter registers locally, without a
//! round trip. A release publishes a random id; the same id arriving from several Redlock
//! nodes wakes one waiter, not one per node, and only once it has been heard from a
//! quorum of them (see [`ReleaseId`]). While no listener is connected, `watch` returns
//! `None` and waiters poll; when the last listener loses its connection, current waiters'
//! subscriptions are closed so that they poll too, and the listener reconnects.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dlm_core::backend::{BackendErrorKind, Successor, WaitList, Watch};
use parking_lot::Mutex;

use crate::conn::{Endpoint, Timeouts};
use crate::protocol::ReleaseId;
use crate::transport::Resp;

/// How often a listener looks up from its socket to notice a shutdown.
const TICK: Duration = Duration::from_millis(100);
/// How many recent release ids are remembered per channel for de-duplication.
const RECENT: usize = 32;
/// The longest a process holds its own waiters back after a release it made for the
/// waiters of other processes (see [`Hints::released_for_others`]): the release's message
/// normally comes back within a round trip.
const YIELD: Duration = Duration::from_millis(10);

/// A release id heard on a channel: from how many nodes, and whether it woke a waiter.
struct Heard {
    id: u64,
    nodes: usize,
    woke: bool,
}

#[derive(Default)]
struct Channel {
    waiters: WaitList,
    recent: VecDeque<Heard>,
    /// A release wakes every waiter, not one: the channel of a semaphore or a read-write
    /// lock, where several waiters may get in at once (set by [`Hints::watch_all`]).
    all: bool,
    /// Until then (or until the release's message comes back), this process's waiters and
    /// newcomers hold back: a release that let the lock go free for other processes'
    /// waiters after a run of hand-overs ([`Hints::released_for_others`]).
    yield_until: Option<Instant>,
}

impl Channel {
    /// Starts remembering release `id`, heard from no node yet (the oldest one remembered
    /// is forgotten when there are [`RECENT`]).
    fn remember(&mut self, id: u64) -> &mut Heard {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Heard {
            id,
            nodes: 0,
            woke: false,
        });
        self.recent.back_mut().expect("just pushed")
    }
}

struct Shared {
    pattern: String,
    /// How many nodes must have published a release before it wakes a waiter: the
    /// quorum on Redlock, 1 elsewhere (see [`ReleaseId`]).
    quorum: usize,
    channels: Mutex<HashMap<String, Channel>>,
    /// Listeners currently subscribed.
    up: AtomicUsize,
    /// Set while every listener that had subscribed has lost its connection and is
    /// reconnecting (a restart, a failover): waiters keep their subscriptions, and all of
    /// them are woken when a listener is back, for the releases missed meanwhile.
    deaf: AtomicBool,
    shutdown: AtomicBool,
    /// Set once a server refused the subscription (ACL): warn once, then poll.
    denied: AtomicBool,
}

impl Shared {
    /// Wakes one waiter of `channel` (every waiter of a channel watched with
    /// [`Hints::watch_all`]) for the release `id` heard from one more node (or made here,
    /// `local`), once it counts (see [`ReleaseId`]) and unless it woke them already. A
    /// message without an id (not dlm's) wakes them too.
    fn route(&self, channel: &str, id: Option<u64>, local: bool) {
        // While fewer listeners than the quorum are up, as many as are up must do.
        let up = self.up.load(Ordering::Acquire).max(1);
        let mut channels = self.channels.lock();
        let Some(ch) = channels.get_mut(channel) else {
            return;
        };
        if let Some(id) = id {
            let need = match ReleaseId::of(id) {
                _ if local => 1,
                ReleaseId::Release => self.quorum.min(up),
                ReleaseId::Undo => 1,
            };
            let heard = match ch.recent.iter().position(|h| h.id == id) {
                Some(i) => &mut ch.recent[i],
                None => ch.remember(id),
            };
            if heard.woke {
                return; // the same release, heard from another node or announced here
            }
            heard.nodes += 1;
            if heard.nodes < need {
                return; // not released on a quorum yet
            }
            heard.woke = true;
            ch.yield_until = None;
        }
        if ch.all {
            ch.waiters.notify_all();
        } else {
            ch.waiters.notify_one();
        }
    }

    /// See [`Hints::released`].
    fn released(&self, channel: impl FnOnce() -> String, id: u64) {
        if self.channels.lock().is_empty() {
            return; // nobody waits here: no key to build
        }
        self.route(&channel(), Some(id), true);
    }

    /// See [`Hints::wake_pending`].
    fn wake_pending(&self, channel: impl FnOnce() -> String) -> bool {
        let channels = self.channels.lock();
        if channels.is_empty() {
            return false; // nobody waits here: no key to build
        }
        channels.get(&channel()).is_some_and(|ch| {
            ch.waiters.wake_pending() || ch.yield_until.is_some_and(|t| Instant::now() < t)
        })
    }

    fn prune(&self) {
        self.channels.lock().retain(|_, ch| !ch.waiters.is_empty());
    }

    /// Wakes every waiter: a release may have gone unheard.
    fn wake_all(&self) {
        for ch in self.channels.lock().values() {
            ch.waiters.notify_all();
        }
    }

    /// Closes every waiter's subscription: they fall back to polling.
    fn disconnect_waiters(&self) {
        for (_, ch) in self.channels.lock().drain() {
            ch.waiters.close();
        }
    }
}

/// The release-hint machinery of one backend: listeners start on the first `watch`.
pub(crate) struct Hints {
    shared: Arc<Shared>,
    endpoints: Vec<Endpoint>,
    timeouts: Timeouts,
    /// When the listener threads (detached; they stop on `shutdown`) were started.
    started: Mutex<Option<Instant>>,
    /// Disconnects once every listener has made its first subscription attempt: each
    /// holds a sender and drops it then.
    ready: Receiver<()>,
    ready_tx: Mutex<Option<Sender<()>>>,
}

impl Hints {
    /// The release-hint listeners for `endpoints` (one each, started on the first wait),
    /// if `options` enable them. A release wakes a waiter once `quorum` of them heard it
    /// (see [`ReleaseId`]).
    pub(crate) fn when_enabled(
        options: &crate::options::Options,
        endpoints: Vec<Endpoint>,
        quorum: usize,
    ) -> Option<Hints> {
        options
            .hints
            .then(|| Hints::new(&options.prefix, endpoints, quorum, options.timeouts()))
    }

    pub(crate) fn new(
        prefix: &str,
        endpoints: Vec<Endpoint>,
        quorum: usize,
        timeouts: Timeouts,
    ) -> Self {
        let (ready_tx, ready) = crossbeam_channel::bounded(0);
        Hints {
            shared: Arc::new(Shared {
                pattern: format!("{prefix}:*:released"),
                quorum,
                channels: Mutex::new(HashMap::new()),
                up: AtomicUsize::new(0),
                deaf: AtomicBool::new(false),
                shutdown: AtomicBool::new(false),
                denied: AtomicBool::new(false),
            }),
            endpoints,
            timeouts,
            started: Mutex::new(None),
            ready,
            ready_tx: Mutex::new(Some(ready_tx)),
        }
    }

    /// A subscription to `channel`'s release hints, or `None` while no listener is
    /// subscribed (the waiter then polls).
    pub(crate) fn watch(&self, channel: String) -> Option<Watch> {
        self.start();
        if self.shared.up.load(Ordering::Acquire) == 0 && !self.shared.deaf.load(Ordering::Acquire)
        {
            return None;
        }
        let mut channels = self.shared.channels.lock();
        Some(channels.entry(channel).or_default().waiters.subscribe())
    }

    /// [`watch`](Self::watch) of a channel whose every release wakes every waiter (a
    /// semaphore's or a read-write lock's: a release may let several in).
    pub(crate) fn watch_all(&self, channel: String) -> Option<Watch> {
        self.start();
        if self.shared.up.load(Ordering::Acquire) == 0 && !self.shared.deaf.load(Ordering::Acquire)
        {
            return None;
        }
        let mut channels = self.shared.channels.lock();
        let ch = channels.entry(channel).or_default();
        ch.all = true;
        Some(ch.waiters.subscribe())
    }

    /// A release made through this backend (the script deleted the key and published
    /// `id`): wakes a waiter of this process at once, instead of when the server's message
    /// comes back through the listener thread (which then recognises the id and wakes no
    /// one else). Waiters in other processes still hear the message.
    pub(crate) fn released(&self, channel: impl FnOnce() -> String, id: u64) {
        self.shared.released(channel, id);
    }

    /// A release made through this backend that let the lock go free although a waiter
    /// of this process offered to take it over ([`WaitList::yielded`]): its waiters and
    /// newcomers hold back until the release's message `id` comes back from the server
    /// (at most [`YIELD`]), so that the waiters of other processes, woken by the same
    /// message, have an even chance at it.
    pub(crate) fn released_for_others(&self, channel: impl FnOnce() -> String, id: u64) {
        let mut channels = self.shared.channels.lock();
        let Some(ch) = channels.get_mut(&channel()) else {
            return;
        };
        ch.yield_until = Some(Instant::now() + YIELD);
        ch.remember(id);
    }

    /// Whether a waiter of `channel` has been woken and not yet picked the wake-up up.
    pub(crate) fn wake_pending(&self, channel: impl FnOnce() -> String) -> bool {
        self.shared.wake_pending(channel)
    }

    /// How many waiters of `channel` are asleep offering to take the lock over.
    pub(crate) fn offers(&self, channel: impl FnOnce() -> String) -> usize {
        let channels = self.shared.channels.lock();
        if channels.is_empty() {
            return 0;
        }
        channels.get(&channel()).map_or(0, |ch| ch.waiters.offers())
    }

    /// A waiter of the mutex's `channel` in this process, claimed for a hand-over by a
    /// release made here (see [`WaitList::successor`]).
    /// `Err(())` when one offered and the release lets the lock go free all the same (see
    /// [`released_for_others`](Self::released_for_others)).
    pub(crate) fn successor(
        &self,
        channel: impl FnOnce() -> String,
    ) -> Result<Option<Successor>, ()> {
        let channels = self.shared.channels.lock();
        if channels.is_empty() {
            return Ok(None); // nobody waits here: no key to build
        }
        let Some(ch) = channels.get(&channel()).filter(|ch| !ch.all) else {
            return Ok(None);
        };
        match ch.waiters.successor() {
            None if ch.waiters.yielded() => Err(()),
            next => Ok(next),
        }
    }

    /// How many listeners are subscribed now.
    pub(crate) fn listeners_up(&self) -> usize {
        self.shared.up.load(Ordering::Acquire)
    }

    /// Starts the listeners on the first call; every call made while they make their
    /// first attempt waits for it (at most one connect timeout), so that no early waiter
    /// falls back to polling just because the listeners were still connecting.
    fn start(&self) {
        let started = {
            let mut started = self.started.lock();
            match *started {
                Some(t) => t,
                None => {
                    let now = Instant::now();
                    *started = Some(now);
                    self.spawn_listeners();
                    now
                }
            }
        };
        let deadline = started + self.timeouts.connect;
        if self.shared.up.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
            // Returns when every listener has reported (the channel disconnects).
            let _ = self.ready.recv_deadline(deadline);
        }
    }

    fn spawn_listeners(&self) {
        let Some(ready_tx) = self.ready_tx.lock().take() else {
            return;
        };
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let (shared, endpoint, timeouts, ready) = (
                self.shared.clone(),
                endpoint.clone(),
                self.timeouts,
                ready_tx.clone(),
            );
            if let Err(e) = std::thread::Builder::new()
                .name(format!("dlm-redis-hints-{i}"))
                .spawn(move || listen(&shared, &endpoint, timeouts, ready))
            {
                log::warn!("cannot start a release-hint listener: {e}");
            }
        }
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        // The listeners see this at their next tick (at most 100 ms) and exit, closing
        // their connections. Not joined: dropping a backend must not block on a socket.
        self.shared.shutdown.store(true, Ordering::Release);
    }
}

/// One listener: connect, subscribe, route messages; on loss, reconnect with backoff.
fn listen(shared: &Shared, endpoint: &Endpoint, timeouts: Timeouts, ready: Sender<()>) {
    let mut backoff = Duration::from_millis(10);
    // Dropped after the first attempt (by subscribe_and_route once subscribed, or here).
    let mut ready = Some(ready);
    while !shared.shutdown.load(Ordering::Acquire) {
        let outcome = subscribe_and_route(shared, endpoint, timeouts, &mut ready);
        ready = None;
        match outcome {
            Ok(()) => return, // shut down
            Err(e) if e.kind() == BackendErrorKind::Permission => {
                if !shared.denied.swap(true, Ordering::AcqRel) {
                    log::warn!(
                        "{endpoint}: no permission to subscribe to {} ({e}); waiters poll instead",
                        shared.pattern
                    );
                }
                if shared.up.load(Ordering::Acquire) == 0 {
                    // Nobody will hear releases: waiters poll.
                    shared.deaf.store(false, Ordering::Release);
                    shared.disconnect_waiters();
                }
                return;
            }
            Err(e) => {
                log::debug!("{endpoint}: release-hint listener lost its connection: {e}");
            }
        }
        // Sleep in ticks so that a shutdown is noticed.
        let mut slept = Duration::ZERO;
        while slept < backoff && !shared.shutdown.load(Ordering::Acquire) {
            std::thread::sleep(TICK.min(backoff));
            slept += TICK.min(backoff);
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn subscribe_and_route(
    shared: &Shared,
    endpoint: &Endpoint,
    timeouts: Timeouts,
    ready: &mut Option<Sender<()>>,
) -> Result<(), dlm_core::BackendError> {
    let mut con = endpoint.connect(Timeouts {
        connect: timeouts.connect,
        io: TICK,
    })?;
    // The subscription's confirmation, or the error (NOPERM for a user without channel
    // rights) that must not be mistaken for one.
    let mut psubscribe = Resp::new();
    psubscribe
        .command(2)
        .arg(b"PSUBSCRIBE")
        .arg(shared.pattern.as_bytes());
    con.send(&psubscribe.0, 1)
        .and_then(|()| con.receive())
        .and_then(redis::Value::extract_error)
        .map_err(|e| endpoint.error(&e))?;
    if shared.up.fetch_add(1, Ordering::AcqRel) == 0 && shared.deaf.swap(false, Ordering::AcqRel) {
        // Back after every listener was down: what was released meanwhile was not heard.
        shared.wake_all();
    }
    ready.take();
    let result = loop {
        if shared.shutdown.load(Ordering::Acquire) {
            break Ok(());
        }
        match con.next_message() {
            Ok(Some(message)) => {
                if let Some((channel, payload)) = pmessage(message) {
                    shared.route(&channel, payload.parse().ok(), false);
                }
            }
            Ok(None) => shared.prune(),
            Err(e) => break Err(endpoint.error(&e)),
        }
    };
    if shared.up.fetch_sub(1, Ordering::AcqRel) == 1 && !shared.shutdown.load(Ordering::Acquire) {
        // Reconnecting: waiters keep their subscriptions (see `deaf`).
        shared.deaf.store(true, Ordering::Release);
    }
    result
}

/// The channel and payload of a `pmessage` push (`pmessage`, pattern, channel, payload);
/// `None` for anything else.
fn pmessage(value: redis::Value) -> Option<(String, String)> {
    let redis::Value::Array(parts) = value else {
        return None;
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    match parts.as_slice() {
        [kind, _pattern, channel, payload] if text(kind).as_deref() == Some("pmessage") => {
            Some((text(channel)?, text(payload)?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        redlock(1)
    }

    /// The listeners' shared state of a Redlock over `n` nodes, all listeners up.
    fn redlock(n: usize) -> Shared {
        Shared {
            pattern: "dlm:*:released".into(),
            quorum: n / 2 + 1,
            channels: Mutex::new(HashMap::new()),
            up: AtomicUsize::new(n),
            deaf: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            denied: AtomicBool::new(false),
        }
    }

    fn subscribe(s: &Shared, channel: &str) -> Watch {
        s.channels
            .lock()
            .entry(channel.to_owned())
            .or_default()
            .waiters
            .subscribe()
    }

    #[test]
    fn a_local_release_wakes_one_waiter_and_its_echo_from_the_server_none() {
        let s = shared();
        let (a, b) = (
            subscribe(&s, "dlm:{x}:released"),
            subscribe(&s, "dlm:{x}:released"),
        );
        s.released(|| "dlm:{x}:released".into(), 7);
        assert!(
            a.receiver().try_recv().is_ok(),
            "the first waiter is woken at once"
        );
        // The server's message for the same release, from one node or five.
        for _ in 0..5 {
            s.route("dlm:{x}:released", Some(7), false);
        }
        assert!(b.receiver().try_recv().is_err(), "one release, one waiter");
        // Another release (from another process) wakes the next one.
        s.route("dlm:{x}:released", Some(8), false);
        assert!(b.receiver().try_recv().is_ok());
    }

    #[test]
    fn a_release_on_a_channel_watched_by_all_wakes_every_waiter_once() {
        let s = shared();
        let subscribe_all = |s: &Shared| {
            let mut channels = s.channels.lock();
            let ch = channels
                .entry("dlm:{x}:sem:released".to_owned())
                .or_default();
            ch.all = true;
            ch.waiters.subscribe()
        };
        let (a, b) = (subscribe_all(&s), subscribe_all(&s));
        s.released(|| "dlm:{x}:sem:released".into(), 4);
        assert!(a.receiver().try_recv().is_ok());
        assert!(
            b.receiver().try_recv().is_ok(),
            "a permit's release wakes all"
        );
        a.trying(false);
        b.trying(false);
        s.route("dlm:{x}:sem:released", Some(4), false);
        assert!(a.receiver().try_recv().is_err(), "its echo wakes no one");
        assert!(b.receiver().try_recv().is_err());
    }

    #[test]
    fn a_local_release_without_waiters_builds_no_key() {
        let s = shared();
        s.released(
            || unreachable!("no waiter: the channel name is not needed"),
            1,
        );
        assert!(!s.wake_pending(|| unreachable!("no waiter")));
    }

    #[test]
    fn a_wake_is_pending_until_the_waiters_attempt_is_over() {
        let s = shared();
        let a = subscribe(&s, "dlm:{x}:released");
        let _other = subscribe(&s, "dlm:{y}:released");
        assert!(!s.wake_pending(|| "dlm:{x}:released".into()));
        s.released(|| "dlm:{x}:released".into(), 3);
        assert!(s.wake_pending(|| "dlm:{x}:released".into()));
        assert!(!s.wake_pending(|| "dlm:{y}:released".into()), "per lock");
        a.receiver().try_recv().unwrap();
        assert!(
            s.wake_pending(|| "dlm:{x}:released".into()),
            "taken, the attempt not made yet"
        );
        a.trying(false);
        assert!(!s.wake_pending(|| "dlm:{x}:released".into()));
    }

    #[test]
    fn a_redlock_release_wakes_one_waiter_once_a_quorum_of_nodes_published_it() {
        let s = redlock(3);
        let (a, b) = (
            subscribe(&s, "dlm:{x}:released"),
            subscribe(&s, "dlm:{x}:released"),
        );
        let id = ReleaseId::Release.random();
        s.route("dlm:{x}:released", Some(id), false);
        assert!(
            a.receiver().try_recv().is_err(),
            "one node of three: the lock is still held on the others"
        );
        s.route("dlm:{x}:released", Some(id), false);
        assert!(a.receiver().try_recv().is_ok(), "a quorum released it");
        s.route("dlm:{x}:released", Some(id), false);
        assert!(
            b.receiver().try_recv().is_err(),
            "the third node: no one else"
        );
        // Made by this process (after a quorum released it): at once.
        s.released(|| "dlm:{x}:released".into(), ReleaseId::Release.random());
        assert!(b.receiver().try_recv().is_ok());
    }

    #[test]
    fn the_undo_of_a_failed_redlock_acquisition_wakes_at_the_first_node() {
        let s = redlock(5);
        let a = subscribe(&s, "dlm:{x}:released");
        s.route("dlm:{x}:released", Some(ReleaseId::Undo.random()), false);
        assert!(a.receiver().try_recv().is_ok());
    }

    #[test]
    fn while_fewer_listeners_than_the_quorum_are_up_those_up_must_do() {
        let s = redlock(5);
        s.up.store(2, Ordering::Release);
        let a = subscribe(&s, "dlm:{x}:released");
        let id = ReleaseId::Release.random();
        s.route("dlm:{x}:released", Some(id), false);
        assert!(a.receiver().try_recv().is_err());
        s.route("dlm:{x}:released", Some(id), false);
        assert!(a.receiver().try_recv().is_ok());
    }
}
