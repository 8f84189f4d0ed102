//! A fault-injecting TCP proxy: put it between a client and a real `redis-server` and
//! make the network misbehave, one direction at a time.
//!
//! | fault | what the sockets see |
//! |---|---|
//! | [`set_latency`](FaultProxy::set_latency) | every chunk is delivered that much later (order kept) |
//! | [`stall`](FaultProxy::stall) | nothing is delivered; bytes are kept and delivered on [`heal`](FaultProxy::heal) |
//! | [`blackhole`](FaultProxy::blackhole) | every byte is discarded; the connection stays open |
//! | [`drop_replies`](FaultProxy::drop_replies) | the next N whole RESP replies are discarded (the server did the work) |
//! | [`drop_http_replies`](FaultProxy::drop_http_replies) | the responses to the next N HTTP requests to a path are discarded (a proxy made with [`start_http`](FaultProxy::start_http)) |
//! | [`reset_all`](FaultProxy::reset_all) | every open connection is reset (RST to both peers) |
//! | [`refuse_new`](FaultProxy::refuse_new) | new connections are accepted and reset at once |
//!
//! Faults apply to open connections at once. Each connection has one thread per direction;
//! all of them end when the proxy is dropped.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlm_testkit::faults::{Direction, FaultProxy};
//! use dlm_testkit::redis_server::RedisServer;
//!
//! let server = RedisServer::spawn();
//! let proxy = FaultProxy::start(server.port());
//! proxy.set_latency(Direction::Both, Duration::from_millis(50));
//! // ... a client on proxy.url() now waits 100 ms per round trip ...
//! proxy.heal();
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

mod http;

/// How often a proxy thread looks up from its socket (to notice a fault, a due delivery or
/// the end).
const TICK: Duration = Duration::from_millis(5);

/// Which way bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Direction {
    /// Client to server (requests).
    ToServer,
    /// Server to client (replies).
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    fn covers(self, way: usize) -> bool {
        match self {
            Direction::ToServer => way == UP,
            Direction::ToClient => way == DOWN,
            Direction::Both => true,
        }
    }
}

const UP: usize = 0;
const DOWN: usize = 1;

#[derive(Default)]
struct Faults {
    latency: [Duration; 2],
    stalled: [bool; 2],
    blackhole: [bool; 2],
    /// Whole replies still to discard.
    drop_replies: usize,
    /// HTTP requests to this path whose responses are discarded, and how many more.
    drop_http: Option<(String, usize)>,
    refuse: bool,
    /// Incremented by `reset_all`: connections older than it reset themselves.
    resets: u64,
}

struct Shared {
    upstream: u16,
    /// The proxy frames HTTP/1.1 messages (for `drop_http_replies`).
    http: bool,
    faults: Mutex<Faults>,
    stop: AtomicBool,
    accepted: AtomicU64,
    /// The pumps of every connection accepted (joined on drop).
    pumps: Mutex<Vec<JoinHandle<()>>>,
    /// Connections open now.
    open: AtomicU64,
}

/// A running proxy in front of one server on 127.0.0.1; stops when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    listener: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("upstream", &self.shared.upstream)
            .field("connections", &self.connections())
            .finish()
    }
}

impl FaultProxy {
    /// A proxy on a free 127.0.0.1 port to `127.0.0.1:upstream_port`.
    ///
    /// # Panics
    /// If it cannot listen on a port.
    pub fn start(upstream_port: u16) -> FaultProxy {
        FaultProxy::started(upstream_port, false)
    }

    /// A proxy like [`start`](Self::start)'s that also finds the HTTP/1.1 messages in
    /// each connection, so that [`drop_http_replies`](Self::drop_http_replies) can
    /// discard whole responses (an etcd member's gateway).
    ///
    /// # Panics
    /// If it cannot listen on a port.
    pub fn start_http(upstream_port: u16) -> FaultProxy {
        FaultProxy::started(upstream_port, true)
    }

    fn started(upstream_port: u16, http: bool) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("local_addr").port();
        let shared = Arc::new(Shared {
            upstream: upstream_port,
            http,
            faults: Mutex::new(Faults::default()),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            pumps: Mutex::new(Vec::new()),
            open: AtomicU64::new(0),
        });
        let s = shared.clone();
        let listener = thread::Builder::new()
            .name("dlm-fault-proxy".into())
            .spawn(move || accept(&listener, &s))
            .expect("start the fault proxy");
        FaultProxy {
            port,
            shared,
            listener: Some(listener),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Delays every chunk in `direction` by `latency` (zero: none). Order is kept; a
    /// stream of chunks is delayed, not slowed to one per `latency`.
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        self.set(direction, |f, way| f.latency[way] = latency);
    }

    /// Stops delivering in `direction`: bytes are kept, and delivered in order on
    /// [`heal`](Self::heal) (a link that comes back).
    pub fn stall(&self, direction: Direction) {
        self.set(direction, |f, way| f.stalled[way] = true);
    }

    /// Discards every byte in `direction` until [`heal`](Self::heal), keeping the
    /// connections open (a link that silently loses everything).
    pub fn blackhole(&self, direction: Direction) {
        self.set(direction, |f, way| f.blackhole[way] = true);
    }

    /// Undoes latency, stalls and black holes in both directions (stalled bytes are
    /// delivered now), and forgets replies still to be dropped.
    pub fn heal(&self) {
        let mut f = self.shared.faults.lock();
        f.latency = [Duration::ZERO; 2];
        f.stalled = [false; 2];
        f.blackhole = [false; 2];
        f.drop_replies = 0;
        f.drop_http = None;
    }

    /// Discards the next `n` whole replies from the server (whatever connection they are
    /// on): the server did the work, the client never hears of it.
    pub fn drop_replies(&self, n: usize) {
        self.shared.faults.lock().drop_replies = n;
    }

    /// How many replies are still to be dropped.
    pub fn replies_to_drop(&self) -> usize {
        self.shared.faults.lock().drop_replies
    }

    /// Discards the responses to the next `n` HTTP requests to `path` (`/v3/kv/txn`),
    /// on whatever connection they come: the server did the work, the client never hears
    /// of it (it waits on the connection until its own timeout). Only on a proxy made
    /// with [`start_http`](Self::start_http).
    ///
    /// # Panics
    /// On a proxy made with [`start`](Self::start).
    pub fn drop_http_replies(&self, path: &str, n: usize) {
        assert!(
            self.shared.http,
            "drop_http_replies needs FaultProxy::start_http"
        );
        self.shared.faults.lock().drop_http = Some((path.to_owned(), n));
    }

    /// How many HTTP responses are still to be dropped.
    pub fn http_replies_to_drop(&self) -> usize {
        self.shared
            .faults
            .lock()
            .drop_http
            .as_ref()
            .map_or(0, |(_, n)| *n)
    }

    /// Resets every open connection: both peers see a reset (RST). New connections are
    /// accepted as usual.
    pub fn reset_all(&self) {
        self.shared.faults.lock().resets += 1;
    }

    /// While on, a new connection is accepted and reset at once (a server that is there
    /// but refuses service).
    pub fn refuse_new(&self, on: bool) {
        self.shared.faults.lock().refuse = on;
    }

    /// Connections open through the proxy now.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst) as usize
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    fn set(&self, direction: Direction, mut f: impl FnMut(&mut Faults, usize)) {
        let mut faults = self.shared.faults.lock();
        for way in [UP, DOWN] {
            if direction.covers(way) {
                f(&mut faults, way);
            }
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(l) = self.listener.take() {
            let _ = l.join();
        }
        let pumps = std::mem::take(&mut *self.shared.pumps.lock());
        for p in pumps {
            let _ = p.join();
        }
    }
}

/// Makes the socket reset its connection (RST, not FIN) when its last handle closes:
/// SO_LINGER with a zero timeout.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                thread::sleep(TICK);
                continue;
            }
            Err(_) => continue,
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let (refuse, resets) = {
            let f = shared.faults.lock();
            (f.refuse, f.resets)
        };
        if refuse {
            reset(&client);
            continue;
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", shared.upstream)) else {
            reset(&client);
            continue;
        };
        let _ = client.set_nonblocking(false);
        for s in [&client, &server] {
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(TICK));
        }
        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        shared.open.fetch_add(1, Ordering::SeqCst);
        // Set by the first pump to end: the other one ends too.
        let done = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicU64::new(0));
        // HTTP: whether each response to come on this connection is delivered, in order.
        let fates: Option<Fates> = shared.http.then(Fates::default);
        let mut pumps = shared.pumps.lock();
        for (way, from, to) in [(UP, client, server), (DOWN, server2, client2)] {
            let (s, done, ended) = (shared.clone(), done.clone(), ended.clone());
            let fates = fates.clone();
            let spawned = thread::Builder::new()
                .name("dlm-fault-pump".into())
                .spawn(move || {
                    pump(way, from, to, &s, resets, &done, fates.as_ref());
                    // The second pump to end closes the connection's count.
                    if ended.fetch_add(1, Ordering::SeqCst) == 1 {
                        s.open.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            if let Ok(p) = spawned {
                pumps.push(p);
            }
        }
        pumps.retain(|p| !p.is_finished());
    }
}

/// Whether each response to come on an HTTP connection is delivered, in order: the
/// requests' pump pushes, the responses' pump pops.
type Fates = Arc<Mutex<VecDeque<bool>>>;

/// Moves bytes one way, applying the faults of that way, until either side closes, the
/// proxy stops, or a reset.
fn pump(
    way: usize,
    mut from: TcpStream,
    mut to: TcpStream,
    shared: &Shared,
    resets: u64,
    done: &AtomicBool,
    fates: Option<&Fates>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut framer = http::Framer::new();
    // Chunks read and not yet delivered, with the time they are due.
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    // Replies being dropped: the bytes of a partial reply seen so far.
    let mut partial: Vec<u8> = Vec::new();
    loop {
        if shared.stop.load(Ordering::SeqCst) || done.load(Ordering::SeqCst) {
            break;
        }
        let (stalled, reset_now) = {
            let f = shared.faults.lock();
            (f.stalled[way], f.resets != resets)
        };
        if reset_now {
            reset(&from);
            reset(&to);
            break;
        }
        // Deliver what is due.
        if !stalled {
            let now = Instant::now();
            while queue.front().is_some_and(|(due, _)| *due <= now) {
                let (_, chunk) = queue.pop_front().expect("checked");
                if to.write_all(&chunk).is_err() {
                    reset(&from);
                    done.store(true, Ordering::SeqCst);
                    return;
                }
            }
        }
        let wait = match queue.front() {
            Some((due, _)) if !stalled => due.saturating_duration_since(Instant::now()),
            _ => TICK,
        };
        let _ = from.set_read_timeout(Some(wait.clamp(Duration::from_micros(200), TICK)));
        match from.read(&mut buf) {
            Ok(0) => {
                // Deliver what is left (unless stalled or black-holed), then pass the end on.
                // The faults as they are now: a stall set while this read waited counts.
                let held = {
                    let f = shared.faults.lock();
                    f.stalled[way] || f.blackhole[way]
                };
                if !held {
                    for (_, chunk) in queue.drain(..) {
                        let _ = to.write_all(&chunk);
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
                break;
            }
            Ok(n) => {
                // The faults as they are now that the bytes are here.
                let mut faults = shared.faults.lock();
                if faults.blackhole[way] {
                    continue;
                }
                let mut chunk = buf[..n].to_vec();
                match (fates, way) {
                    (None, DOWN) => chunk = drop_whole_replies(&mut faults, &mut partial, chunk),
                    (None, _) => {}
                    // Requests: each is delivered; its response's fate is decided here.
                    (Some(fates), UP) => {
                        framer.feed(&chunk, &mut |head| {
                            let drop = match &mut faults.drop_http {
                                Some((path, n)) if *n > 0 && http::path_of(head) == Some(path) => {
                                    *n -= 1;
                                    true
                                }
                                _ => false,
                            };
                            fates.lock().push_back(!drop);
                            true
                        });
                    }
                    (Some(fates), _) => {
                        chunk =
                            framer.feed(&chunk, &mut |_| fates.lock().pop_front().unwrap_or(true));
                    }
                }
                if !chunk.is_empty() {
                    queue.push_back((Instant::now() + faults.latency[way], chunk));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                reset(&to);
                break;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
}

/// Takes the whole replies to drop (per `faults.drop_replies`) out of `chunk`, which
/// follows the bytes of a reply partly seen (`partial`); returns what is delivered.
fn drop_whole_replies(faults: &mut Faults, partial: &mut Vec<u8>, chunk: Vec<u8>) -> Vec<u8> {
    if faults.drop_replies == 0 && partial.is_empty() {
        return chunk;
    }
    partial.extend_from_slice(&chunk);
    let mut at = 0;
    while faults.drop_replies > 0 {
        match reply_len(&partial[at..]) {
            Some(Ok(len)) => {
                at += len;
                faults.drop_replies -= 1;
            }
            // Not a whole reply yet: keep it for the next chunk.
            None => {
                partial.drain(..at);
                return Vec::new();
            }
            // Not RESP: deliver everything as it is.
            Some(Err(())) => {
                faults.drop_replies = 0;
                break;
            }
        }
    }
    let rest = partial[at..].to_vec();
    partial.clear();
    rest
}

/// The length of the RESP reply at the start of `b`: `None` when `b` holds only part of
/// it, `Some(Err(()))` when `b` does not start with a reply.
fn reply_len(b: &[u8]) -> Option<Result<usize, ()>> {
    fn line(b: &[u8]) -> Option<usize> {
        b.windows(2).position(|w| w == b"\r\n")
    }
    fn number(b: &[u8]) -> Result<i64, ()> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(())
    }
    let kind = *b.first()?;
    let eol = line(b)?;
    let next = eol + 2;
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(Ok(next)),
        b'$' | b'!' | b'=' => {
            let len = match number(&b[1..eol]) {
                Ok(len) => len,
                Err(()) => return Some(Err(())),
            };
            if len < 0 {
                return Some(Ok(next));
            }
            let end = next + len as usize + 2;
            (b.len() >= end).then_some(Ok(end))
        }
        b'*' | b'%' | b'~' | b'>' => {
            let n = match number(&b[1..eol]) {
                Ok(n) => n,
                Err(()) => return Some(Err(())),
            };
            let items = if kind == b'%' { 2 * n } else { n };
            let mut at = next;
            for _ in 0..items.max(0) {
                match reply_len(&b[at..])? {
                    Ok(len) => at += len,
                    Err(()) => return Some(Err(())),
                }
            }
            Some(Ok(at))
        }
        _ => Some(Err(())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lengths() {
        assert_eq!(reply_len(b"+OK\r\n"), Some(Ok(5)));
        assert_eq!(reply_len(b"+OK\r\n+OK\r\n"), Some(Ok(5)));
        assert_eq!(reply_len(b"-ERR x\r\n"), Some(Ok(8)));
        assert_eq!(reply_len(b":42\r\n"), Some(Ok(5)));
        assert_eq!(reply_len(b"$-1\r\n"), Some(Ok(5)));
        assert_eq!(reply_len(b"*-1\r\n"), Some(Ok(5)));
        assert_eq!(reply_len(b"$4\r\na\r\nb\r\n"), Some(Ok(10)));
        assert_eq!(
            reply_len(b"*2\r\n$1\r\nx\r\n*1\r\n:1\r\n+tail"),
            Some(Ok(19))
        );
        for cut in 0..19 {
            assert_eq!(
                reply_len(&b"*2\r\n$1\r\nx\r\n*1\r\n:1\r\n"[..cut]),
                None,
                "{cut}"
            );
        }
        assert_eq!(reply_len(b"hello\r\n"), Some(Err(())));
        assert_eq!(reply_len(b"$x\r\n"), Some(Err(())));
    }

    #[test]
    fn dropping_replies_across_chunks() {
        let mut faults = Faults {
            drop_replies: 2,
            ..Faults::default()
        };
        let mut partial = Vec::new();
        assert!(
            drop_whole_replies(&mut faults, &mut partial, b"+OK\r\n$3\r\na".to_vec()).is_empty()
        );
        assert_eq!(faults.drop_replies, 1);
        let out = drop_whole_replies(&mut faults, &mut partial, b"bc\r\n:7\r\n".to_vec());
        assert_eq!(out, b":7\r\n");
        assert_eq!(faults.drop_replies, 0);
        assert_eq!(
            drop_whole_replies(&mut faults, &mut partial, b"+x\r\n".to_vec()),
            b"+x\r\n"
        );
    }
}
