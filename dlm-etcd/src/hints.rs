//! Release hints: one streaming `/v3/watch` per backend on every lock key (deletions
//! only), its events routed to each lock's `WaitList` (one waiter per mutex release;
//! every waiter of a semaphore or read-write lock when a key under it goes). [`Hints`] is
//! the registry of those subscriptions and owns the thread; [`WatchStream`] is that
//! thread's side, the etcd watch itself.
//!
//! The stream is read on a thread of its own over a connection of its own, TCP or TLS
//! (the gateway's watch is one long HTTP/1.1 response of newline-separated JSON messages, chunked), so that the
//! backend's drop can shut it down at once. It starts at the revision just after the
//! failed attempt that made the first waiter subscribe (etcd catches up a watcher that
//! starts in the past only every 100 ms; one that starts at the next revision is in sync
//! at once), and after a break it starts again just after the last revision it has seen,
//! so no release is missed across a reconnection. If etcd has compacted those revisions
//! away, every waiter is woken to look again.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use dlm_core::backend::channel::{self, Receiver, RecvTimeoutError, Sender};
use dlm_core::backend::{LockName, WaitList, Watch};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::gateway::{Gateway, b64, int, unb64};

thread_local! {
    /// The revision of this thread's last attempt that found a lock held: the shared watch,
    /// when this thread starts it, starts just after it (see `hints`).
    pub(crate) static LAST_HELD_REVISION: Cell<i64> = const { Cell::new(0) };
}

/// How often the watch thread looks at its stop channel while the stream is idle.
const TICK: Duration = Duration::from_millis(200);

/// How long the stream may stay silent, while this backend has waiters, before the watch
/// thread asks its member whether it still serves the cluster. etcd sends nothing on an idle
/// watch, and a member that is stopped (SIGSTOP, a VM frozen) keeps the connection open and
/// says nothing either, as does one cut off from the leader: without the question its
/// waiters would wait for the holder's lease. (The watch is also asked for with
/// `hasleader`, etcd's require-leader: a member that knows it lost its leader ends it.)
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// The subscriptions, shared by [`Hints`] and its [`WatchStream`].
type Registry = Arc<Mutex<Lists>>;

/// Each resource's waiters, and what this backend already announced.
#[derive(Default)]
struct Lists {
    /// The waiters of each lock name or resource id.
    by_name: HashMap<Vec<u8>, WaitList>,
    /// Releases made by this backend and already announced to its waiters: the deletion's
    /// revision, so that its event does not wake a second waiter.
    announced: HashMap<Vec<u8>, i64>,
    /// Size after the last sweep of empty lists.
    swept_at: usize,
}

/// The release-hint subscriptions of one backend, and its watch thread.
pub(crate) struct Hints {
    /// The subscriptions.
    lists: Registry,
    /// Dropped to stop the watch thread.
    stop: Option<Sender<()>>,
    /// The watch's connection, shut down to stop the thread at once.
    socket: Arc<Mutex<Option<TcpStream>>>,
    /// The watch thread; `None` when it could not be started (waiters poll).
    thread: Option<JoinHandle<()>>,
}

impl Hints {
    /// Starts the thread; `start_revision` 0 means "from now".
    pub(crate) fn start(gateway: &Arc<Gateway>, key_prefix: &[u8], start_revision: i64) -> Hints {
        let mut end = key_prefix.to_vec();
        // The range end of a prefix: its last byte plus one (the prefix ends in '/').
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        Hints::spawn(
            gateway,
            key_prefix,
            (key_prefix.to_vec(), end),
            false,
            start_revision,
        )
    }

    /// A watch of its own for an observer of one resource (an election): every change of
    /// the keys in `range` (puts too, unlike the shared watch's deletions), from
    /// `start_revision` on.
    pub(crate) fn observe(
        gateway: &Arc<Gateway>,
        key_prefix: &[u8],
        range: (Vec<u8>, Vec<u8>),
        start_revision: i64,
    ) -> Hints {
        Hints::spawn(gateway, key_prefix, range, true, start_revision)
    }

    fn spawn(
        gateway: &Arc<Gateway>,
        key_prefix: &[u8],
        range: (Vec<u8>, Vec<u8>),
        puts: bool,
        start_revision: i64,
    ) -> Hints {
        let lists = Registry::default();
        let (stop_tx, stop_rx) = channel::bounded::<()>(0);
        let socket = Arc::new(Mutex::new(None));
        let stream = WatchStream {
            gateway: gateway.clone(),
            key_prefix: key_prefix.to_vec(),
            range,
            puts,
            lists: lists.clone(),
            stop: stop_rx,
            socket: socket.clone(),
            next_revision: start_revision,
        };
        let thread = thread::Builder::new()
            .name("dlm-etcd-watch".into())
            .spawn(move || stream.run())
            .map_err(|e| {
                log::warn!("dlm-etcd: cannot start the watch thread ({e}); waiters will poll")
            })
            .ok();
        Hints {
            lists,
            stop: Some(stop_tx),
            socket,
            thread,
        }
    }

    /// A subscription to the hints of `resource`: a lock's name, or the resource id of a
    /// semaphore or read-write lock (`resource::Resource::id`).
    pub(crate) fn subscribe_to(&self, resource: &[u8]) -> Option<Watch> {
        self.thread.as_ref()?;
        let mut lists = self.lists.lock();
        if lists.by_name.len() > 64 && lists.by_name.len() >= 2 * lists.swept_at {
            lists.by_name.retain(|_, l| !l.is_empty());
            let Lists {
                by_name, announced, ..
            } = &mut *lists;
            announced.retain(|k, _| by_name.contains_key(k));
            lists.swept_at = lists.by_name.len();
        }
        let list = lists.by_name.entry(resource.to_vec()).or_default();
        Some(list.subscribe())
    }

    /// This backend released `name` at `revision`: wake one of its waiters now, without
    /// waiting for the watch event (a thread that releases and asks again at once must
    /// find the hand-over pending), and let the event wake nobody else.
    pub(crate) fn announce(&self, name: &LockName, revision: i64) {
        let mut lists = self.lists.lock();
        let key = name.as_str().as_bytes();
        let Some(list) = lists.by_name.get(key) else {
            return;
        };
        if list.is_empty() {
            return;
        }
        list.notify_one();
        lists.announced.insert(key.to_vec(), revision);
    }

    /// A holder of the semaphore or read-write lock `resource` left (released here): wake
    /// its waiters of this backend now (the event wakes them again; several may get in).
    pub(crate) fn wake_all(&self, resource: &[u8]) {
        if let Some(list) = self.lists.lock().by_name.get(resource) {
            list.notify_all();
        }
    }

    /// Whether a hand-over of `name` to one of this backend's waiters is under way (see
    /// `LockBackend::wake_pending`).
    pub(crate) fn wake_pending(&self, name: &LockName) -> bool {
        self.lists
            .lock()
            .by_name
            .get(name.as_str().as_bytes())
            .is_some_and(WaitList::wake_pending)
    }

    /// Stops the thread and waits for it; its waiters' channels close (they poll).
    pub(crate) fn stop(mut self) {
        drop(self.stop.take());
        if let Some(s) = self.socket.lock().as_ref() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for list in self.lists.lock().by_name.values() {
            list.close();
        }
    }
}

/// The watch thread's side: one `/v3/watch` stream after another (the next member after
/// a break), each message routed to the subscriptions it wakes.
struct WatchStream {
    gateway: Arc<Gateway>,
    /// The backend's key prefix: what a deletion's key begins with.
    key_prefix: Vec<u8>,
    /// The keys watched: every lock key (the shared watch), or one resource's.
    range: (Vec<u8>, Vec<u8>),
    /// Puts are sent too (an observer's watch), not only deletions.
    puts: bool,
    /// The subscriptions its events wake.
    lists: Registry,
    /// Closed when the backend stops the thread.
    stop: Receiver<()>,
    /// The current stream's connection, for [`Hints::stop`] to shut down.
    socket: Arc<Mutex<Option<TcpStream>>>,
    /// The revision the next stream starts at: just after the last one seen (0: from now).
    next_revision: i64,
}

/// Why a stream ended.
enum End {
    Stopped,
    Broken(String),
}

impl WatchStream {
    /// Waits up to `wait` for the stop: whether it came.
    fn stopped(&self, wait: Duration) -> bool {
        !matches!(self.stop.recv_timeout(wait), Err(RecvTimeoutError::Timeout))
    }

    /// The thread's body: streams until the backend stops it, starting again (with a
    /// backoff) on the next member after a break.
    fn run(mut self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let member = self.gateway.preferred();
            match self.stream(member) {
                End::Stopped => return,
                End::Broken(why) => {
                    log::debug!(
                        "dlm-etcd: watch on {} ended: {why}",
                        self.gateway.members()[member]
                    );
                    self.gateway.skip(member);
                }
            }
            *self.socket.lock() = None;
            if self.stopped(backoff) {
                return;
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// One watch stream on member `i`, until it breaks or the backend stops.
    fn stream(&mut self, i: usize) -> End {
        let gateway = self.gateway.clone();
        let timeouts = gateway.timeouts;
        let token = match gateway.token(i) {
            Ok(t) => t,
            Err(e) => return End::Broken(e.to_string()),
        };
        let (mut s, tcp, host) = match gateway.connect(i) {
            Ok(c) => c,
            Err(e) => return End::Broken(e.to_string()),
        };
        let _ = tcp.set_nodelay(true);
        let _ = tcp.set_write_timeout(Some(timeouts.io));
        // The I/O timeout while the request (and a TLS handshake) is sent, then ticks.
        let _ = tcp.set_read_timeout(Some(timeouts.io));
        *self.socket.lock() = Some(tcp);
        if self.stop.try_recv() != Err(channel::TryRecvError::Empty) {
            return End::Stopped;
        }
        let filters: &[&str] = if self.puts { &[] } else { &["NOPUT"] };
        let body = json!({ "create_request": {
            "key": b64(&self.range.0),
            "range_end": b64(&self.range.1),
            "start_revision": self.next_revision.to_string(),
            "filters": filters,
        }})
        .to_string();
        let authorization = token
            .as_deref()
            .map(|t| format!("Authorization: {t}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "POST /v3/watch HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nGrpc-Metadata-Hasleader: true\r\n{authorization}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if let Err(e) = s.write_all(request.as_bytes()).and_then(|()| s.flush()) {
            return End::Broken(e.to_string());
        }
        if let Some(tcp) = self.socket.lock().as_ref() {
            let _ = tcp.set_read_timeout(Some(TICK));
        }
        let mut raw = Vec::new();
        let mut headers_done = false;
        let mut payload = Vec::new();
        let mut buf = [0u8; 8192];
        let mut heard = Instant::now();
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) => return End::Broken("closed".into()),
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.stop.try_recv() != Err(channel::TryRecvError::Empty) {
                        return End::Stopped;
                    }
                    if heard.elapsed() >= PROBE_AFTER && self.has_waiters() {
                        // A restart resumes after the last revision seen: nothing is missed.
                        if !gateway.answers(i, &self.key_prefix) {
                            return End::Broken(format!(
                                "silent, and the member did not answer a request within {:?}",
                                timeouts.io
                            ));
                        }
                        heard = Instant::now();
                    }
                    continue;
                }
                Err(e) => {
                    if self.stop.try_recv() != Err(channel::TryRecvError::Empty) {
                        return End::Stopped;
                    }
                    return End::Broken(e.to_string());
                }
            };
            heard = Instant::now();
            raw.extend_from_slice(&buf[..n]);
            if !headers_done {
                let Some(at) = find(&raw, b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
                if !head.starts_with("http/1.1 200") {
                    return End::Broken(head.lines().next().unwrap_or("").to_owned());
                }
                if !head.contains("transfer-encoding: chunked") {
                    return End::Broken("not a chunked stream".into());
                }
                raw.drain(..at + 4);
                headers_done = true;
            }
            // De-chunk what is complete.
            while let Some(eol) = find(&raw, b"\r\n") {
                let size_text = String::from_utf8_lossy(&raw[..eol]);
                let size_text = size_text.split(';').next().unwrap_or("").trim();
                let Ok(size) = usize::from_str_radix(size_text, 16) else {
                    return End::Broken("bad chunk".into());
                };
                if size == 0 {
                    return End::Broken("stream ended".into());
                }
                if raw.len() < eol + 2 + size + 2 {
                    break;
                }
                payload.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
                raw.drain(..eol + 2 + size + 2);
            }
            // Each message is one JSON object followed by a newline.
            while let Some(nl) = payload.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = payload.drain(..=nl).collect();
                if let Some(why) = self.message(&line) {
                    if why == "canceled" {
                        // etcd cancels a watch whose token it refused (it says
                        // "permission denied" either way): the next stream gets a new one.
                        gateway.forget_token(token.as_ref());
                    }
                    return End::Broken(why);
                }
            }
        }
    }

    /// Whether a waiter of this backend waits for a release hint.
    fn has_waiters(&self) -> bool {
        self.lists.lock().by_name.values().any(|l| !l.is_empty())
    }

    /// Handles one message of the stream; `Some(why)` when the stream must be restarted.
    fn message(&mut self, line: &[u8]) -> Option<String> {
        let v: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => return Some(format!("bad message: {e}")),
        };
        if let Some(err) = v.get("error") {
            return Some(format!("error: {err}"));
        }
        let result = v.get("result")?;
        let header_rev = result
            .get("header")
            .and_then(|h| int(h, "revision").ok())
            .unwrap_or(0);
        let compacted = int(result, "compact_revision").unwrap_or(0);
        if compacted > 0 {
            // The revisions we asked for are gone: wake everyone to look again.
            for list in self.lists.lock().by_name.values() {
                list.notify_all();
            }
            self.next_revision = compacted;
            return Some("compacted".into());
        }
        if result.get("canceled").and_then(Value::as_bool) == Some(true) {
            return Some("canceled".into());
        }
        let created = result.get("created").and_then(Value::as_bool) == Some(true);
        let events = result.get("events").and_then(Value::as_array);
        match events {
            Some(events) if !events.is_empty() => {
                let mut lists = self.lists.lock();
                for e in events {
                    let Some(kv) = e.get("kv") else { continue };
                    if let Ok(rev) = int(kv, "mod_revision") {
                        self.next_revision = self.next_revision.max(rev + 1);
                    }
                    // Only deletions are sent on the shared watch (NOPUT; expiry of a
                    // lease deletes too); an observer's own watch sends puts as well.
                    let Some(key) = kv.get("key").and_then(unb64) else {
                        continue;
                    };
                    let Some(name) = key.strip_prefix(self.key_prefix.as_slice()) else {
                        continue;
                    };
                    if let Some(resource) = claim_resource(name) {
                        // A holder of a semaphore or read-write lock left (or a writer's
                        // mark ended): every waiter looks again, several may get in.
                        if let Some(list) = lists.by_name.get(resource) {
                            list.notify_all();
                        }
                        continue;
                    }
                    let rev = int(kv, "mod_revision").unwrap_or(0);
                    if lists.announced.get(name) == Some(&rev) {
                        lists.announced.remove(name);
                        continue;
                    }
                    if let Some(list) = lists.by_name.get(name) {
                        list.notify_one();
                    }
                }
            }
            _ if created && self.next_revision == 0 => {
                // Started "from now": everything after the header's revision will come.
                self.next_revision = header_rev + 1;
            }
            _ if !created && header_rev > 0 => {
                // A progress notification: nothing up to it is left to send.
                self.next_revision = self.next_revision.max(header_rev + 1);
            }
            _ => {}
        }
        None
    }
}

/// The resource id (`name 0 kind`) of a semaphore's or read-write lock's key, given
/// without the key prefix (`name 0 kind 0 ...`); `None` for a mutex's key (a lock name
/// holds no control character).
fn claim_resource(key: &[u8]) -> Option<&[u8]> {
    let first = key.iter().position(|&b| b == 0)?;
    let second = first + 1 + key[first + 1..].iter().position(|&b| b == 0)?;
    Some(&key[..second])
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
