//! One Redis server: a pool of connections and the lock scripts.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind, LockName, OwnerToken};
use parking_lot::Mutex;
use redis::Script;

use crate::cluster::{Cluster, Redirect};
use crate::conn::{Conn, Endpoint, Manager, Timeouts};
use crate::options::ReplicaWait;
use crate::transport::{Resp, Wire};

struct Scripts {
    acquire: Script,
    extend: Script,
    release: Script,
    force_release: Script,
    inspect: Script,
    commit: Script,
}

/// Loaded once per process; each `Script` knows its SHA1 (EVALSHA, reloaded on NOSCRIPT).
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(include_str!("lua/acquire.lua")),
    extend: Script::new(include_str!("lua/extend.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    force_release: Script::new(include_str!("lua/force_release.lua")),
    inspect: Script::new(include_str!("lua/inspect.lua")),
    commit: Script::new(include_str!("lua/commit.lua")),
});

/// Whether an acquisition draws a fencing token from the stream of the lock's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// No.
    Off,
    /// Yes: the acquire script takes the lock and draws a new stream ID in one step (for
    /// Redlock, that node's draw: round 2 commits the largest draw of the quorum, plus one).
    Draw,
}

impl Fencing {
    /// The acquire script's mode argument.
    fn mode(self) -> &'static [u8] {
        match self {
            Fencing::Off => b"0",
            Fencing::Draw => b"1",
        }
    }
}

/// How many sequence numbers one millisecond of a stream ID may hold in a token:
/// `token = ms << SEQ_BITS | seq`. A server makes far fewer than 2^20 IDs per millisecond
/// (a billion a second); a larger sequence number is refused, never wrapped.
const SEQ_BITS: u32 = 20;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The fencing token of a stream ID `ms-seq`: `ms << 20 | seq`. The order of tokens is the
/// order of the IDs, which a stream only ever increases.
pub(crate) fn token_of_id(id: &[u8]) -> Option<u64> {
    let id = std::str::from_utf8(id).ok()?;
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    if seq > SEQ_MASK || ms >= 1 << (64 - SEQ_BITS) {
        return None;
    }
    Some(ms << SEQ_BITS | seq)
}

/// The stream ID of a token (the inverse of [`token_of_id`]).
pub(crate) fn id_of_token(token: u64) -> String {
    format!("{}-{}", token >> SEQ_BITS, token & SEQ_MASK)
}

impl Resp {
    /// `EVALSHA sha numkeys keys... args...`: the start of a script call with `keys`
    /// keys and `args` further arguments.
    fn evalsha(script: &Script, keys: usize, args: usize) -> Resp {
        let mut r = Resp::new();
        r.command(3 + keys + args)
            .arg(b"EVALSHA")
            .arg(script.get_hash().as_bytes())
            .arg_u64(keys as u64);
        r
    }
}

/// How a call's replies are read and what they mean.
#[derive(Clone, Copy)]
enum Shape {
    /// One EVALSHA: one reply; NOSCRIPT is answered by loading the script and retrying.
    Script(&'static Script),
    /// `SET key token NX PX ms GET`: one reply.
    SetGet,
    /// `WAIT replicas timeout`: one reply, the number of replicas that acknowledged.
    Wait,
}

impl Shape {
    /// How many replies the request gets.
    fn replies(self) -> usize {
        match self {
            Shape::Script(_) | Shape::SetGet | Shape::Wait => 1,
        }
    }

    /// The request's value from its replies: the reply, or an array of them.
    fn value(self, replies: &mut impl Iterator<Item = redis::Value>) -> redis::Value {
        match self.replies() {
            1 => replies.next().unwrap_or_default(),
            n => redis::Value::Array(replies.take(n).collect()),
        }
    }
}

/// One request prepared for one node (or a batch of them, sent in one write): encoded
/// before it is sent, so that a caller can send it to several nodes before reading any
/// reply (Redlock's pipelined fan-out), and read its replies as they arrive.
pub(crate) struct Call {
    bytes: Vec<u8>,
    parts: Parts,
}

enum Parts {
    /// One request.
    One(Shape),
    /// Several requests, each with its shape and its bytes (to send it again after a
    /// NOSCRIPT).
    Batch(Vec<(Shape, Range<usize>)>),
}

impl Call {
    /// The calls as one batch: written at once, read in order, one value per call.
    pub(crate) fn batch(calls: impl IntoIterator<Item = Call>) -> Call {
        let mut bytes = Vec::new();
        let mut parts = Vec::new();
        for call in calls {
            let shape = match call.parts {
                Parts::One(shape) => shape,
                Parts::Batch(_) => unreachable!("batches are not nested"),
            };
            let start = bytes.len();
            bytes.extend_from_slice(&call.bytes);
            parts.push((shape, start..bytes.len()));
        }
        Call {
            bytes,
            parts: Parts::Batch(parts),
        }
    }

    /// `WAIT replicas timeout`, to end a batch of writes: the reply counts the replicas
    /// that acknowledged every write made on the connection so far.
    pub(crate) fn wait(w: ReplicaWait) -> Call {
        let mut r = Resp::new();
        r.command(3)
            .arg(b"WAIT")
            .arg_u64(u64::from(w.replicas))
            .arg_u64(millis(w.timeout));
        Call {
            bytes: r.0,
            parts: Parts::One(Shape::Wait),
        }
    }

    /// How many calls a batch holds (1 for a single call).
    pub(crate) fn len(&self) -> usize {
        match &self.parts {
            Parts::One(_) => 1,
            Parts::Batch(parts) => parts.len(),
        }
    }

    /// How many replies the server sends.
    pub(crate) fn replies(&self) -> usize {
        match &self.parts {
            Parts::One(shape) => shape.replies(),
            Parts::Batch(parts) => parts.iter().map(|(s, _)| s.replies()).sum(),
        }
    }

    /// Writes the request.
    pub(crate) fn send(&self, con: &mut Wire) -> redis::RedisResult<()> {
        con.send(&self.bytes, self.replies())
    }

    /// Reads the replies to a request sent with [`send`](Self::send), blocking, and
    /// makes its value (see [`finish`](Self::finish)).
    pub(crate) fn receive(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        let mut replies = Vec::with_capacity(self.replies());
        while replies.len() < self.replies() {
            replies.push(con.receive()?);
        }
        self.finish(con, replies)
    }

    /// Reads the replies that have arrived; `true` once all are in `replies`. Takes the
    /// whole replies already buffered first, then reads the socket once (which returns
    /// at once after `poll` reported it readable). When it returns `false`, no whole
    /// reply is left in the buffer: the socket is the place to wait on.
    pub(crate) fn receive_some(
        &self,
        con: &mut Wire,
        replies: &mut Vec<redis::Value>,
    ) -> redis::RedisResult<bool> {
        let mut read = false;
        while replies.len() < self.replies() {
            match con.try_receive()? {
                Some(value) => replies.push(value),
                None if read => return Ok(false),
                None => {
                    con.read_some()?;
                    read = true;
                }
            }
        }
        Ok(true)
    }

    /// The value of the call from all its replies: one value per request (server errors
    /// kept as values, so that every reply is read; a script's error is `Err` for a
    /// single call), and for a request of several commands an array of their replies; a
    /// batch gives an array of those. A script the server did not know is loaded and
    /// run again (blocking, on this connection: all replies have been read).
    pub(crate) fn finish(
        &self,
        con: &mut Wire,
        replies: Vec<redis::Value>,
    ) -> redis::RedisResult<redis::Value> {
        let mut replies = replies.into_iter();
        match &self.parts {
            Parts::One(shape) => {
                let value = shape.value(&mut replies);
                match shape {
                    Shape::Script(script) if is_noscript(&value) => {
                        script.load(con)?;
                        self.send(con)?;
                        con.receive().and_then(redis::Value::extract_error)
                    }
                    Shape::Script(_) => value.extract_error(),
                    _ => Ok(value),
                }
            }
            Parts::Batch(parts) => {
                let mut values: Vec<redis::Value> = parts
                    .iter()
                    .map(|(shape, _)| shape.value(&mut replies))
                    .collect();
                // Scripts the server did not know: each loaded once, then every refused
                // call sent again in one write.
                let refused: Vec<usize> = (0..parts.len())
                    .filter(|&k| matches!(parts[k].0, Shape::Script(_)) && is_noscript(&values[k]))
                    .collect();
                if refused.is_empty() {
                    return Ok(redis::Value::Array(values));
                }
                let mut loaded: Vec<&str> = Vec::new();
                let mut again = Vec::new();
                for &k in &refused {
                    if let (Shape::Script(script), bytes) = &parts[k] {
                        if !loaded.contains(&script.get_hash()) {
                            script.load(con)?;
                            loaded.push(script.get_hash());
                        }
                        again.extend_from_slice(&self.bytes[bytes.clone()]);
                    }
                }
                // A WAIT in the batch is sent again after them, so that it covers them.
                let wait = parts.iter().position(|(s, _)| matches!(s, Shape::Wait));
                if let Some(w) = wait {
                    again.extend_from_slice(&self.bytes[parts[w].1.clone()]);
                }
                con.send(&again, refused.len() + usize::from(wait.is_some()))?;
                for &k in &refused {
                    values[k] = con.receive()?;
                }
                if let Some(w) = wait {
                    values[w] = con.receive()?;
                }
                Ok(redis::Value::Array(values))
            }
        }
    }

    /// The cluster redirection a reply asks for (a refusal of the request's key, kept as
    /// a value: the whole request was refused, a transaction aborted). `None` for a
    /// batch, whose requests can go to different slots: its caller looks at each.
    pub(crate) fn redirect_in(&self, value: &redis::Value) -> Option<Redirect> {
        match (&self.parts, value) {
            (Parts::Batch(_), _) => None,
            (Parts::One(_), value) => Redirect::of_value(value),
        }
    }

    /// Whether the reply says the request wrote the lock: a grant (a plain `SET` that
    /// found the key free, a transaction whose `SET` did, the acquire script's `1`) or a
    /// renewal (the extend script's `1`; for a batch, any of them). What `WAIT` is for.
    pub(crate) fn wrote(&self, value: &redis::Value) -> bool {
        use redis::Value::{Array, Int, Nil};
        fn one(shape: Shape, v: &redis::Value) -> bool {
            match shape {
                Shape::SetGet => matches!(v, Nil),
                Shape::Wait => false,
                Shape::Script(_) => {
                    matches!(v, Int(1))
                        || matches!(v, Array(r) if matches!(r.first(), Some(Int(1))))
                }
            }
        }
        match (&self.parts, value) {
            (Parts::One(shape), v) => one(*shape, v),
            (Parts::Batch(parts), Array(values)) => parts
                .iter()
                .zip(values)
                .any(|((shape, _), v)| one(*shape, v)),
            (Parts::Batch(_), _) => false,
        }
    }

    /// Sends the request and reads its replies.
    pub(crate) fn execute(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        self.send(con)?;
        self.receive(con)
    }
}

fn is_noscript(value: &redis::Value) -> bool {
    matches!(value, redis::Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// The key layout: one hash tag per lock, so the lock key and its release channel share a
/// cluster slot, and one fencing stream per slot (`prefix:fence:{tag}`, where the tag puts
/// it in the lock key's slot). Names go into KEYS only.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
    /// `PEXPIRE` of a fencing stream, refreshed by every acquisition that uses it.
    fence_ttl_ms: u64,
}

const LOCK: &str = "";
const CHANNEL: &str = ":released";

impl Keys {
    pub(crate) fn new(prefix: String, fence_ttl: Duration) -> Self {
        Keys {
            prefix,
            fence_ttl_ms: millis(fence_ttl),
        }
    }

    /// The hash slot of `prefix:{name}`, computed without building the key: the prefix
    /// holds no braces, so the hashed part is the name up to its first `}`, or the whole
    /// key when the name starts with one.
    pub(crate) fn slot(&self, name: &LockName) -> u16 {
        let n = name.as_str().as_bytes();
        match n.iter().position(|&b| b == b'}') {
            Some(0) => crate::slot::key_slot(self.lock(name).as_bytes()),
            Some(end) => crate::slot::key_slot_of_tag(&n[..end]),
            None => crate::slot::key_slot_of_tag(n),
        }
    }

    /// `prefix:fence:{tag}`: the fencing stream of `name`'s slot.
    pub(crate) fn fence(&self, name: &LockName) -> String {
        format!(
            "{}:fence:{{{}}}",
            self.prefix,
            crate::slot::tag(self.slot(name))
        )
    }

    /// Writes the fencing stream's key of `name` as one argument.
    fn fence_arg(&self, r: &mut Resp, name: &LockName) {
        r.arg_parts(&[
            self.prefix.as_bytes(),
            b":fence:{",
            crate::slot::tag(self.slot(name)).as_bytes(),
            b"}",
        ]);
    }

    fn key(&self, name: &LockName, suffix: &str) -> String {
        format!("{}:{{{}}}{suffix}", self.prefix, name.as_str())
    }

    /// `prefix:{name}`
    pub(crate) fn lock(&self, name: &LockName) -> String {
        self.key(name, LOCK)
    }

    /// `prefix:{name}:released`
    pub(crate) fn channel(&self, name: &LockName) -> String {
        self.key(name, CHANNEL)
    }

    /// Every key and the channel of `name`.
    pub(crate) fn all(&self, name: &LockName) -> crate::LockKeys {
        crate::LockKeys {
            lock: self.lock(name),
            fencing_stream: self.fence(name),
            channel: self.channel(name),
        }
    }

    /// Writes `prefix:{name}suffix` as one argument.
    fn arg(&self, r: &mut Resp, name: &LockName, suffix: &str) {
        r.arg_parts(&[
            self.prefix.as_bytes(),
            b":{",
            name.as_str().as_bytes(),
            b"}",
            suffix.as_bytes(),
        ]);
    }
}

/// What one server answered to an acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeAcquire {
    /// Ours now; the token drawn from the fencing stream (0 when fencing is off).
    Acquired { fence: u64 },
    /// Someone else's, for this much longer.
    Held { remaining: Duration },
}

/// What the reply to an acquire call says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The answer.
    Done(NodeAcquire),
    /// Ask again with the acquire script.
    Script,
}

/// The requests of one server that their callers stopped waiting for.
#[derive(Default)]
struct Background {
    /// How many there are (read without the lock on every request).
    count: AtomicUsize,
    entries: Mutex<Vec<Straggling>>,
    next_id: AtomicUsize,
}

struct Straggling {
    id: usize,
    /// The lock and owner token of an acquisition (its late reply is released).
    key: Option<(LockName, OwnerToken)>,
    since: Instant,
}

impl Background {
    fn enter(&self, key: Option<(LockName, OwnerToken)>) -> usize {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.entries.lock().push(Straggling {
            id,
            key,
            since: Instant::now(),
        });
        self.count.fetch_add(1, Ordering::AcqRel);
        id
    }

    fn leave(&self, id: usize) {
        self.entries.lock().retain(|s| s.id != id);
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    fn busy(&self, key: Option<(&LockName, &OwnerToken)>, slow: Duration) -> Option<&'static str> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let entries = self.entries.lock();
        if entries.iter().any(|s| s.since.elapsed() > slow) {
            return Some("an earlier request is still unanswered (a slow or stopped server)");
        }
        // Only the same acquisition (lock and owner token) must wait: the late reply's
        // clean-up is a compare-and-delete of that owner's key, which cannot touch another
        // owner's request, but could undo this owner's retry.
        if key.is_some_and(|(n, o)| {
            entries
                .iter()
                .any(|s| s.key.as_ref().is_some_and(|(sn, so)| sn == n && so == o))
        }) {
            return Some("an earlier request of this acquisition is still unanswered");
        }
        None
    }
}

/// A request counted in its server's background (see [`Node::busy`]) until dropped.
pub(crate) struct Ticket {
    node: Arc<Node>,
    id: usize,
}

impl Ticket {
    /// The server.
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.node.background.leave(self.id);
    }
}

/// A job for a node's connect worker.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A node's connect worker: a thread that makes a connection when a fan-out finds none
/// idle (so that one slow connect does not hold up the other nodes), started on first
/// need. Dropping it closes its channel: the thread ends after its current connect
/// (bounded by the connect timeout); [`Node::stop_connect_worker`] also waits for that.
struct Worker {
    jobs: crossbeam_channel::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

/// One server.
pub(crate) struct Node {
    pub(crate) endpoint: Endpoint,
    pool: r2d2::Pool<Manager>,
    pub(crate) keys: Keys,
    connects: Connects,
    /// Set once the server's persistence and eviction settings were checked.
    server_checked: AtomicBool,
    /// Set when the server turned out to be older than 7.0: acquire with the script.
    scripts_only: AtomicBool,
    /// Requests to this server whose caller stopped waiting and that are not answered
    /// yet (Redlock's stragglers and their late actions, see `fanout.rs`).
    background: Background,
    io_timeout: Duration,
    connect_timeout: Duration,
    /// A Redis Cluster master: its requests follow the cluster's redirections.
    cluster: Option<Weak<Cluster>>,
    /// The connect worker of fan-outs (see `fanout.rs`), started on first need.
    worker: Mutex<Option<Worker>>,
}

/// What the pool's connection attempts have shown: whether the server is down (its last
/// connection attempt failed and none has succeeded since), and the kind of that failure.
/// r2d2 keeps only the text of the last connect error; the kind lets a failed checkout
/// report `Auth` (never retried) rather than a transient `Unavailable`.
#[derive(Debug, Default, Clone)]
struct Connects(Arc<ConnectState>);

#[derive(Debug, Default)]
struct ConnectState {
    /// The last connect failure: its kind and its message (whose words are the OS's, the
    /// resolver's or the server's).
    last: Mutex<Option<(BackendErrorKind, String)>>,
    down: AtomicBool,
    /// How many connection attempts have failed, ever.
    failures: AtomicUsize,
}

impl r2d2::HandleError<BackendError> for Connects {
    fn handle_error(&self, error: BackendError) {
        log::debug!("redis connection failed: {error}");
        *self.0.last.lock() = Some((error.kind(), error.message().to_owned()));
        self.0.down.store(true, Ordering::Release);
        self.0.failures.fetch_add(1, Ordering::AcqRel);
    }
}

impl Connects {
    /// The kind of error for a call that found no connection: the last connect failure's
    /// kind when it was a refusal of the credentials or (if `timeouts` is set) a timeout,
    /// otherwise `Unavailable`.
    fn failure(&self, timeouts: bool) -> BackendErrorKind {
        match *self.0.last.lock() {
            Some((
                kind @ (BackendErrorKind::Auth
                | BackendErrorKind::Permission
                | BackendErrorKind::Tls),
                _,
            )) => kind,
            Some((BackendErrorKind::Timeout, _)) if timeouts => BackendErrorKind::Timeout,
            _ => BackendErrorKind::Unavailable,
        }
    }

    /// How many connection attempts have failed so far.
    fn failures(&self) -> usize {
        self.0.failures.load(Ordering::Acquire)
    }

    /// The last connect failure, as it was reported.
    fn last_error(&self) -> Option<BackendError> {
        self.0
            .last
            .lock()
            .as_ref()
            .map(|(kind, message)| BackendError::new(*kind, message.clone()))
    }
}

impl r2d2::HandleEvent for Connects {
    fn handle_acquire(&self, _: r2d2::event::AcquireEvent) {
        self.0.down.store(false, Ordering::Release);
        *self.0.last.lock() = None;
    }
}

/// The slices in which a checkout waits for a new connection (see `Node::checkout`).
const CHECKOUT_SLICE: Duration = Duration::from_millis(10);
/// How much longer than the connect timeout a checkout waits for the verdict of the
/// connection attempt it started (which has the connect timeout for itself, and starts
/// a little after the checkout on the pool's thread).
const CHECKOUT_GRACE: Duration = Duration::from_millis(50);

/// Whole milliseconds, rounded up, for PX/PEXPIRE.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl Node {
    /// A node whose pool connects lazily: a server that is down at start does not fail
    /// construction, it fails the calls that need it.
    pub(crate) fn new(
        endpoint: Endpoint,
        keys: Keys,
        timeouts: Timeouts,
        pool_size: u32,
        thread_pool: std::sync::Arc<scheduled_thread_pool::ScheduledThreadPool>,
    ) -> Node {
        let manager = Manager {
            endpoint: endpoint.clone(),
            timeouts,
        };
        let connects = Connects::default();
        let pool = r2d2::Pool::builder()
            .max_size(pool_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(timeouts.connect)
            .error_handler(Box::new(connects.clone()))
            .event_handler(Box::new(connects.clone()))
            .thread_pool(thread_pool)
            .build_unchecked(manager);
        Node {
            endpoint,
            pool,
            keys,
            connects,
            server_checked: AtomicBool::new(false),
            scripts_only: AtomicBool::new(false),
            background: Background::default(),
            io_timeout: timeouts.io,
            connect_timeout: timeouts.connect,
            cluster: None,
            worker: Mutex::new(None),
        }
    }

    /// Runs `job` on this node's connect worker (started if need be). If the thread
    /// cannot be started, the job is dropped unrun: its caller waits until its deadline.
    pub(crate) fn spawn_connect(&self, job: Job) {
        let mut worker = self.worker.lock();
        if worker.as_ref().is_none_or(|w| w.thread.is_finished()) {
            let (jobs, rx) = crossbeam_channel::unbounded::<Job>();
            let spawned = std::thread::Builder::new()
                .name("dlm-redis-connect".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                });
            match spawned {
                Ok(thread) => *worker = Some(Worker { jobs, thread }),
                Err(e) => {
                    log::error!("{}: cannot start a connect worker: {e}", self.endpoint);
                    return;
                }
            }
        }
        if let Some(w) = worker.as_ref() {
            let _ = w.jobs.send(job);
        }
    }

    /// Whether this node's connect worker is running.
    pub(crate) fn connect_worker_running(&self) -> bool {
        self.worker
            .lock()
            .as_ref()
            .is_some_and(|w| !w.thread.is_finished())
    }

    /// Stops the connect worker, waiting for its current connect (unless called on it).
    pub(crate) fn stop_connect_worker(&self) {
        let worker = self.worker.lock().take();
        if let Some(Worker { jobs, thread }) = worker {
            drop(jobs);
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }

    /// This node as a master of `cluster`: its requests follow the cluster's
    /// redirections.
    pub(crate) fn in_cluster(mut self, cluster: Weak<Cluster>) -> Node {
        self.cluster = Some(cluster);
        self
    }

    /// Runs `f` on a pooled connection. A connection that saw an I/O error or timeout is
    /// discarded: a late reply could otherwise answer the next command. In a cluster, a
    /// redirection is followed.
    pub(crate) fn run<T>(
        &self,
        f: impl Fn(&mut Wire) -> redis::RedisResult<T>,
    ) -> Result<T, BackendError> {
        self.run_routed(&f, &|_| None)
    }

    /// [`run`](Self::run), where `redirect_in` finds a cluster's redirection in a reply
    /// that keeps server errors as values.
    fn run_routed<T>(
        &self,
        f: &dyn Fn(&mut Wire) -> redis::RedisResult<T>,
        redirect_in: &dyn Fn(&T) -> Option<Redirect>,
    ) -> Result<T, BackendError> {
        if let Some(cluster) = self.cluster.as_ref().and_then(Weak::upgrade) {
            return cluster.run(self, f, redirect_in);
        }
        self.run_here(f, false)?
            .map_err(|e| self.endpoint.error(&e))
    }

    /// Runs `f` on a pooled connection of this server (after `ASKING` if `asking`); the
    /// outer error is a connection that could not be had.
    pub(crate) fn run_here<T>(
        &self,
        f: &dyn Fn(&mut Wire) -> redis::RedisResult<T>,
        asking: bool,
    ) -> Result<redis::RedisResult<T>, BackendError> {
        let mut conn = self.connection()?;
        let conn: &mut Conn = &mut conn;
        let result = if asking {
            redis::cmd("ASKING")
                .query::<()>(&mut conn.con)
                .and_then(|()| f(&mut conn.con))
        } else {
            f(&mut conn.con)
        };
        if let Err(e) = &result
            && (e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error())
        {
            conn.broken = true;
        }
        Ok(result)
    }

    /// A pooled connection, connecting if none is idle (within the connect timeout); the
    /// first one checks the server's settings.
    pub(crate) fn connection(&self) -> Result<r2d2::PooledConnection<Manager>, BackendError> {
        if let Some(e) = self.down() {
            return Err(e);
        }
        // An idle connection the server has closed meanwhile (or, with Sentinel, one to
        // a former master) is dropped, not handed out to fail its request; the pool holds
        // at most `pool_size` of them.
        let mut stale = 0;
        let mut conn = loop {
            let mut conn = self.checkout()?;
            if stale > self.pool.max_size() || !conn.is_stale(&self.endpoint) {
                break conn;
            }
            conn.broken = true;
            stale += 1;
        };
        if !self.server_checked.swap(true, Ordering::Relaxed) {
            self.check_server(&mut conn.con);
        }
        Ok(conn)
    }

    /// A pooled connection, or a new one within the connect timeout. r2d2's `get` waits
    /// the whole timeout even when every connection attempt is refused at once (a server
    /// that died, a master a failover left behind); so the wait is taken in short slices,
    /// and ends as soon as an attempt made meanwhile has failed.
    ///
    /// A failed attempt is reported as it is (the connect error names the server and
    /// says why in the OS's, the resolver's or the server's words; a TLS port spoken to
    /// in plain text says so): one clause per layer, never r2d2's "timed out waiting for
    /// connection" wrapped around it.
    fn checkout(&self) -> Result<r2d2::PooledConnection<Manager>, BackendError> {
        let start = Instant::now();
        let failures = self.connects.failures();
        let limit = self.connect_timeout + CHECKOUT_GRACE;
        loop {
            let left = limit.saturating_sub(start.elapsed());
            match self.pool.get_timeout(left.min(CHECKOUT_SLICE)) {
                Ok(conn) => return Ok(conn),
                Err(_) if self.connects.failures() != failures => {
                    return Err(self.connects.last_error().unwrap_or_else(|| {
                        BackendError::new(
                            BackendErrorKind::Unavailable,
                            format!("{}: the connection attempt failed", self.endpoint),
                        )
                    }));
                }
                Err(_) if left <= CHECKOUT_SLICE => {
                    return Err(BackendError::new(
                        self.connects.failure(true),
                        format!(
                            "{}: no connection within {:?}",
                            self.endpoint, self.connect_timeout
                        ),
                    ));
                }
                Err(_) => {}
            }
        }
    }

    /// How long a straggler's reply is awaited in the background before its connection is
    /// given up: ten request deadlines (a reply that never comes, lost by a middlebox or
    /// held by a server stopped for long, must not keep the server out for good).
    pub(crate) fn straggler_limit(&self) -> Duration {
        (self.connect_timeout + self.io_timeout) * 10
    }

    /// An error at once, without asking, when this server should not get a request for
    /// `name` now: a request to it has been unanswered for more than half the I/O
    /// timeout after its caller stopped waiting (the server is slow or stopped: new
    /// requests would only queue behind it), or an acquisition with this `key` (lock and
    /// owner token) sent to it is still unanswered (its late reply will be released,
    /// which must not overtake a retry of that acquisition on another connection).
    pub(crate) fn busy(&self, key: Option<(&LockName, &OwnerToken)>) -> Option<BackendError> {
        let why = self.background.busy(key, self.io_timeout / 2)?;
        Some(BackendError::new(
            BackendErrorKind::Timeout,
            format!("{}: {why}; not asked", self.endpoint),
        ))
    }

    /// Counts a request in the background (see [`busy`](Self::busy)) until the ticket
    /// is dropped. `key`: the lock and owner of an acquisition whose late reply will be
    /// undone.
    pub(crate) fn background(self: &Arc<Self>, key: Option<(LockName, OwnerToken)>) -> Ticket {
        let id = self.background.enter(key);
        Ticket {
            node: self.clone(),
            id,
        }
    }

    /// Warns once per server about settings that can lose locks: a restart without
    /// `appendonly yes` + `appendfsync always` loses the locks held there, and an eviction
    /// policy other than `noeviction` (with a `maxmemory`) can evict a lock key (every dlm
    /// key has an expiry, so even the `volatile-*` policies may pick it). Fencing tokens
    /// survive both: a lost stream is seeded again from the server's clock. Silently
    /// skipped when the user may not run `CONFIG GET`.
    fn check_server(&self, con: &mut Wire) {
        let mut config = Vec::new();
        for pattern in ["append*", "maxmemory*"] {
            let pairs: redis::RedisResult<Vec<String>> =
                redis::cmd("CONFIG").arg("GET").arg(pattern).query(con);
            match pairs {
                Ok(pairs) => config.extend(pairs),
                Err(e) => {
                    log::debug!(
                        "{}: cannot read the server's settings ({e}); locks survive a restart only with appendonly yes + appendfsync always, and only maxmemory-policy noeviction never evicts them",
                        self.endpoint
                    );
                    return;
                }
            }
        }
        let get = |k: &str| {
            config
                .chunks(2)
                .find(|p| p[0] == k)
                .and_then(|p| p.get(1).cloned())
                .unwrap_or_default()
        };
        let (aof, fsync) = (get("appendonly"), get("appendfsync"));
        if aof != "yes" || fsync != "always" {
            log::warn!(
                target: crate::SETTINGS_LOG_TARGET,
                "{}: appendonly {aof}, appendfsync {fsync}: a restart loses the locks held on this server, and they can be granted again (fencing tokens still increase: they follow the server's clock); use appendonly yes + appendfsync always",
                self.endpoint
            );
        }
        let (maxmemory, policy) = (get("maxmemory"), get("maxmemory-policy"));
        if maxmemory != "0" && !maxmemory.is_empty() && policy != "noeviction" {
            log::warn!(
                target: crate::SETTINGS_LOG_TARGET,
                "{}: maxmemory {maxmemory} with maxmemory-policy {policy} can evict lock keys (all of them have an expiry), and an evicted lock can be granted again; use maxmemory-policy noeviction",
                self.endpoint
            );
        }
    }

    fn unexpected_key(&self, name: &LockName, what: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::UnexpectedKey,
            format!(
                "{}: the key {} {what}; it was not written by dlm",
                self.endpoint,
                self.keys.lock(name)
            ),
        )
    }

    /// The first request of an acquisition. Without fencing, the plain
    /// `SET key token NX PX ms GET`, so that the server runs no script on the uncontended
    /// path. With fencing, the acquire script, which takes the lock and draws a new ID
    /// from the slot's fencing stream in one step, and touches the stream only once it
    /// has seen that it is one: a key of another type there (not written by dlm) is left
    /// exactly as it was. (A `MULTI` with `SET`, `XADD` and `PEXPIRE` was cheaper on the
    /// server, but its `PEXPIRE` ran whatever the key was, and set an expiry on a
    /// foreign key.) Servers older than 7.0 (no `SET ... NX GET`) also get the script.
    pub(crate) fn acquire_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Call {
        if fencing == Fencing::Draw || self.scripts_only.load(Ordering::Relaxed) {
            return self.acquire_script_call(name, owner, ttl, fencing);
        }
        let mut r = Resp::new();
        r.command(7).arg(b"SET");
        self.keys.arg(&mut r, name, LOCK);
        r.arg(owner.encoded().as_bytes())
            .arg(b"NX")
            .arg(b"PX")
            .arg_u64(millis(ttl))
            .arg(b"GET");
        Call {
            bytes: r.0,
            parts: Parts::One(Shape::SetGet),
        }
    }

    /// The acquire script: takes the lock if free, refreshes it if already ours, reports
    /// the holder's remaining lease otherwise (`src/lua/acquire.lua`).
    pub(crate) fn acquire_script_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Call {
        let script = &SCRIPTS.acquire;
        let mut r = Resp::evalsha(script, 2, 4);
        self.keys.arg(&mut r, name, LOCK);
        self.keys.fence_arg(&mut r, name);
        r.arg(owner.encoded().as_bytes())
            .arg_u64(millis(ttl))
            .arg(fencing.mode())
            .arg_u64(self.keys.fence_ttl_ms);
        Call {
            bytes: r.0,
            parts: Parts::One(Shape::Script(script)),
        }
    }

    /// What the reply to an acquire call means: the answer, or [`Step::Script`] when only
    /// the acquire script can tell (the key is someone else's: for how long? Or it is
    /// already ours: refresh it. Or the server is older than 7.0).
    pub(crate) fn parse_acquire(
        &self,
        name: &LockName,
        call: &Call,
        reply: redis::Value,
    ) -> Result<Step, BackendError> {
        let shape = match &call.parts {
            Parts::One(shape) => *shape,
            Parts::Batch(_) => return Err(self.protocol("a batch", &reply)),
        };
        let set = match shape {
            Shape::Script(_) => return self.parse_acquire_script(name, reply).map(Step::Done),
            Shape::Wait => return Err(self.protocol("WAIT", &reply)),
            Shape::SetGet => reply,
        };
        match set {
            redis::Value::Nil => Ok(Step::Done(NodeAcquire::Acquired { fence: 0 })),
            // Someone's token (perhaps ours): the script tells whose and for how long.
            redis::Value::BulkString(_) => Ok(Step::Script),
            redis::Value::ServerError(e) => {
                let e: redis::RedisError = e.into();
                if e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("syntax")) {
                    if !self.scripts_only.swap(true, Ordering::Relaxed) {
                        log::info!(
                            "{}: the server does not take SET ... NX GET (Redis < 7.0): acquiring with the script",
                            self.endpoint
                        );
                    }
                    return Ok(Step::Script);
                }
                if e.code() == Some("WRONGTYPE") {
                    return Err(self.unexpected_key(name, "is not a string"));
                }
                Err(self.endpoint.error(&e))
            }
            other => Err(self.protocol("SET", &other)),
        }
    }

    fn parse_acquire_script(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<NodeAcquire, BackendError> {
        let (code, value): (i64, redis::Value) = self.parse(reply)?;
        match code {
            // The new stream ID with fencing, 0 without.
            1 => match value {
                redis::Value::Int(_) => Ok(NodeAcquire::Acquired { fence: 0 }),
                draw => Ok(NodeAcquire::Acquired {
                    fence: self.parse_draw(name, draw)?,
                }),
            },
            0 => Ok(NodeAcquire::Held {
                remaining: Duration::from_millis(self.parse::<i64>(value)?.max(0) as u64),
            }),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            -3 => Err(self.foreign_fence(name)),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: acquire script returned {other}", self.endpoint),
            )),
        }
    }

    /// The fencing token of the ID the slot's stream drew (`XADD`). A key of another type
    /// at the stream's name was not written by dlm.
    fn parse_draw(&self, name: &LockName, value: redis::Value) -> Result<u64, BackendError> {
        match value {
            redis::Value::BulkString(id) => token_of_id(&id).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!(
                        "{}: the fencing stream gave the ID {:?}, which makes no token",
                        self.endpoint,
                        String::from_utf8_lossy(&id)
                    ),
                )
            }),
            redis::Value::ServerError(e) => {
                let e: redis::RedisError = e.into();
                if e.code() == Some("WRONGTYPE") {
                    return Err(self.foreign_fence(name));
                }
                Err(self.endpoint.error(&e))
            }
            other => Err(self.protocol("XADD", &other)),
        }
    }

    fn foreign_fence(&self, name: &LockName) -> BackendError {
        BackendError::new(
            BackendErrorKind::UnexpectedKey,
            format!(
                "{}: the fencing stream {} is not a stream; it was not written by dlm",
                self.endpoint,
                self.keys.fence(name)
            ),
        )
    }

    fn protocol(&self, what: &str, reply: &redis::Value) -> BackendError {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{}: unexpected reply to {what}: {reply:?}", self.endpoint),
        )
    }

    /// One whole acquisition attempt on this node: the plain request, then the script
    /// when the reply needs it; with `wait`, also how many replicas acknowledged a grant.
    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
        wait: Option<ReplicaWait>,
    ) -> Result<(NodeAcquire, Option<u32>), BackendError> {
        let call = self.acquire_call(name, owner, ttl, fencing);
        let (reply, acked) = self.execute_acked(&call, wait)?;
        match self.parse_acquire(name, &call, reply)? {
            Step::Done(answer) => Ok((answer, acked)),
            Step::Script => {
                let call = self.acquire_script_call(name, owner, ttl, fencing);
                let (reply, acked) = self.execute_acked(&call, wait)?;
                Ok((self.parse_acquire_script(name, reply)?, acked))
            }
        }
    }

    /// Converts a script's reply.
    pub(crate) fn parse<T: redis::FromRedisValue>(
        &self,
        reply: redis::Value,
    ) -> Result<T, BackendError> {
        redis::from_redis_value(reply).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: unexpected script reply: {e}", self.endpoint),
            )
        })
    }

    /// The replies of a batch (see [`Call::batch`]) of `n` calls, each parsed by `one`; a
    /// call's server error is its own result, not the batch's.
    pub(crate) fn parse_batch<T>(
        &self,
        reply: redis::Value,
        n: usize,
        one: impl Fn(redis::Value) -> Result<T, BackendError>,
    ) -> Result<Vec<Result<T, BackendError>>, BackendError> {
        Ok(self
            .batch_values(reply, n)?
            .into_iter()
            .map(|v| match v.extract_error() {
                Ok(v) => one(v),
                Err(e) => Err(self.endpoint.error(&e)),
            })
            .collect())
    }

    /// The `n` replies of a batch, as they came (server errors kept as values).
    pub(crate) fn batch_values(
        &self,
        reply: redis::Value,
        n: usize,
    ) -> Result<Vec<redis::Value>, BackendError> {
        match reply {
            redis::Value::Array(values) if values.len() == n => Ok(values),
            other => Err(self.protocol("a batch", &other)),
        }
    }

    /// `1` -> `true`, `0` -> `false`.
    pub(crate) fn parse_flag(&self, reply: redis::Value) -> Result<bool, BackendError> {
        Ok(self.parse::<i64>(reply)? == 1)
    }

    /// A script call over the lock key (and `second` key, if any) with `args`.
    fn script_call(
        &self,
        script: &'static Script,
        name: &LockName,
        channel: bool,
        args: &[&[u8]],
    ) -> Call {
        let mut r = Resp::evalsha(script, 1, args.len() + usize::from(channel));
        self.keys.arg(&mut r, name, LOCK);
        if channel {
            self.keys.arg(&mut r, name, CHANNEL);
        }
        for a in args {
            r.arg(a);
        }
        Call {
            bytes: r.0,
            parts: Parts::One(Shape::Script(script)),
        }
    }

    /// Compare-and-PEXPIRE; the reply parses with [`parse_flag`](Self::parse_flag).
    pub(crate) fn extend_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        let mut ms = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.extend,
            name,
            false,
            &[
                owner.encoded().as_bytes(),
                ms.format(millis(ttl)).as_bytes(),
            ],
        )
    }

    /// Renews the lock if it is still `owner`'s; with `wait`, also how many replicas
    /// acknowledged the renewal.
    pub(crate) fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        wait: Option<ReplicaWait>,
    ) -> Result<(bool, Option<u32>), BackendError> {
        let (reply, acked) = self.execute_acked(&self.extend_call(name, owner, ttl), wait)?;
        Ok((self.parse_flag(reply)?, acked))
    }

    /// Redlock fencing round 2: raises the slot's fencing stream to the ID of `token` if
    /// the lock is still ours.
    pub(crate) fn commit_call(&self, name: &LockName, owner: &OwnerToken, token: u64) -> Call {
        let script = &SCRIPTS.commit;
        let mut r = Resp::evalsha(script, 2, 3);
        self.keys.arg(&mut r, name, LOCK);
        self.keys.fence_arg(&mut r, name);
        r.arg(owner.encoded().as_bytes())
            .arg(id_of_token(token).as_bytes())
            .arg_u64(self.keys.fence_ttl_ms);
        Call {
            bytes: r.0,
            parts: Parts::One(Shape::Script(script)),
        }
    }

    /// Releases if ours, publishing `release_id` on the lock's channel.
    pub(crate) fn release_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Call {
        let mut id = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.release,
            name,
            true,
            &[owner.encoded().as_bytes(), id.format(release_id).as_bytes()],
        )
    }

    /// See [`release_call`](Self::release_call).
    pub(crate) fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Result<bool, BackendError> {
        let reply = self.execute(&self.release_call(name, owner, release_id))?;
        self.parse_flag(reply)
    }

    /// Runs a prepared call on a pooled connection.
    pub(crate) fn execute(&self, call: &Call) -> Result<redis::Value, BackendError> {
        self.run_routed(&|con| call.execute(con), &|value| call.redirect_in(value))
    }

    /// [`execute`](Self::execute), then, when `wait` is set and the call wrote the lock,
    /// `WAIT replicas timeout` on the same connection (`WAIT` counts the replicas that
    /// acknowledged this connection's writes): the reply and how many acknowledged
    /// (`None` when nothing was waited for).
    pub(crate) fn execute_acked(
        &self,
        call: &Call,
        wait: Option<ReplicaWait>,
    ) -> Result<(redis::Value, Option<u32>), BackendError> {
        let Some(w) = wait else {
            return self.execute(call).map(|value| (value, None));
        };
        self.run_routed(
            &|con| {
                let value = call.execute(con)?;
                if call.redirect_in(&value).is_some() || !call.wrote(&value) {
                    return Ok((value, None));
                }
                let acked: i64 = redis::cmd("WAIT")
                    .arg(w.replicas)
                    .arg(millis(w.timeout))
                    .query(con)?;
                Ok((value, Some(u32::try_from(acked.max(0)).unwrap_or(u32::MAX))))
            },
            &|(value, _)| call.redirect_in(value),
        )
    }

    /// The error for a write that fewer than `w.replicas` replicas acknowledged.
    pub(crate) fn not_replicated(
        &self,
        w: ReplicaWait,
        acked: Option<u32>,
        what: &str,
    ) -> BackendError {
        BackendError::new(
            BackendErrorKind::NotReplicated,
            format!(
                "{}: {what} acknowledged by {} of the {} replicas asked for within {:?} (WAIT)",
                self.endpoint,
                acked.unwrap_or(0),
                w.replicas,
                w.timeout
            ),
        )
    }

    /// An idle pooled connection, if one is ready (never connects, never waits).
    pub(crate) fn idle_connection(&self) -> Option<r2d2::PooledConnection<Manager>> {
        self.pool.try_get()
    }

    /// An error at once, without waiting, when the server is down: its last connection
    /// attempt failed (refused, timed out, or refused the credentials), none has
    /// succeeded since, and no connection is idle. The pool keeps trying to connect in
    /// the background (every half connect timeout at most), and the first success ends
    /// this; meanwhile a call costs nothing instead of a whole connect timeout.
    pub(crate) fn down(&self) -> Option<BackendError> {
        if !self.connects.0.down.load(Ordering::Acquire) || self.pool.state().idle_connections > 0 {
            return None;
        }
        Some(BackendError::new(
            // A down server answers at once: no timeout to report.
            self.connects.failure(false),
            match self.connects.last_error() {
                Some(last) => format!(
                    "{} (the last connection attempt; retrying in the background)",
                    last.message()
                ),
                None => format!(
                    "{}: down (the last connection attempt failed; retrying in the background)",
                    self.endpoint
                ),
            },
        ))
    }

    pub(crate) fn force_release_call(&self, name: &LockName, release_id: u64) -> Call {
        let mut id = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.force_release,
            name,
            true,
            &[id.format(release_id).as_bytes()],
        )
    }

    pub(crate) fn parse_force_release(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<bool, BackendError> {
        match self.parse::<i64>(reply)? {
            -1 => Err(self.unexpected_key(name, "is not a string")),
            n => Ok(n == 1),
        }
    }

    pub(crate) fn force_release(
        &self,
        name: &LockName,
        release_id: u64,
    ) -> Result<bool, BackendError> {
        let reply = self.execute(&self.force_release_call(name, release_id))?;
        self.parse_force_release(name, reply)
    }

    pub(crate) fn inspect_call(&self, name: &LockName) -> Call {
        self.script_call(&SCRIPTS.inspect, name, false, &[])
    }

    pub(crate) fn parse_inspect(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<Option<Duration>, BackendError> {
        match self.parse::<i64>(reply)? {
            -3 => Ok(None),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            ms => Ok(Some(Duration::from_millis(ms.max(0) as u64))),
        }
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let reply = self.execute(&self.inspect_call(name))?;
        self.parse_inspect(name, reply)
    }

    /// The server's `run_id` (INFO server), to spot one server listed twice.
    pub(crate) fn run_id(&self) -> Result<String, BackendError> {
        let info: String = self.run(|con| redis::cmd("INFO").arg("server").query(con))?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{}: INFO server has no run_id", self.endpoint),
                )
            })
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("server", &self.endpoint)
            .field("pool", &self.pool.state())
            .finish()
    }
}
