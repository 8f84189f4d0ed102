//! dlm and the minimal hand-written client, as bench systems.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_core::{
    FencedResource, FencingToken, Lock, LockClient, LockGuard, MultiLockGuard, TokenDraw,
};

use crate::recorder::Atomics;
use crate::system::{LockHandle, LockSystem};

/// What a dlm system's handles take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// The mutex.
    Mutex,
    /// A permit of a semaphore with this many permits.
    Permit(u32),
    /// A read hold of a read-write lock.
    Read,
    /// One handle in every `n` (the first of each round of `n` threads) takes write holds
    /// of a read-write lock, the others read holds.
    OneWriterIn(usize),
    /// A multi-lock of this many names (`key/1`, `key/2`, ...), one guard for the set.
    Multi(usize),
    /// The same names as [`Multi`](Primitive::Multi), taken as single locks one after
    /// another (in the same order) and released in the reverse order.
    OneByOne(usize),
}

/// dlm over any backend; each handle is its own client (a separate owner).
pub struct Dlm {
    name: String,
    backend: Arc<dyn LockBackend>,
    ttl: Duration,
    /// The recorder its clients report to (`None`: the facade's no-op).
    recorder: Option<Arc<Atomics>>,
    token_draw: TokenDraw,
    primitive: Primitive,
    /// Handles made so far (which of them write, for `OneWriterIn`).
    handles: AtomicUsize,
}

impl Dlm {
    /// dlm named `name` over `backend`, leases of `ttl`.
    pub fn new(name: &str, backend: Arc<dyn LockBackend>, ttl: Duration) -> Self {
        Dlm {
            name: name.to_owned(),
            backend,
            ttl,
            recorder: None,
            token_draw: TokenDraw::default(),
            primitive: Primitive::Mutex,
            handles: AtomicUsize::new(0),
        }
    }

    /// The same taking `primitive` instead of the mutex.
    pub fn primitive(mut self, primitive: Primitive) -> Self {
        self.primitive = primitive;
        self
    }

    /// The same, with each client's metrics registered with `recorder` (build the
    /// backend with it in place too, for the backend's own metrics).
    pub fn with_metrics(mut self, recorder: Arc<Atomics>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The same with fencing tokens drawn as `when` says.
    pub fn token_draw(mut self, when: TokenDraw) -> Self {
        self.token_draw = when;
        self
    }
}

impl LockSystem for Dlm {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let build = || {
            LockClient::builder(self.backend.clone())
                .lease(self.ttl)
                .token_draw(self.token_draw)
                .build()
                .unwrap()
        };
        let client = match &self.recorder {
            Some(r) => metrics::with_local_recorder(r.as_ref(), build),
            None => build(),
        };
        let primitive = match self.primitive {
            Primitive::OneWriterIn(n)
                if self
                    .handles
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(n) =>
            {
                Take::Write
            }
            Primitive::OneWriterIn(_) | Primitive::Read => Take::Read,
            Primitive::Permit(n) => Take::Permit(n),
            Primitive::Mutex => Take::Mutex,
            Primitive::Multi(n) => Take::Multi(n),
            Primitive::OneByOne(n) => Take::OneByOne(n),
        };
        Box::new(DlmHandle {
            client,
            primitive,
            guard: None,
            multi: None,
            singles: Vec::new(),
            resource: FencedResource::new(0),
        })
    }
}

/// What one handle takes.
#[derive(Clone, Copy)]
enum Take {
    Mutex,
    Permit(u32),
    Read,
    Write,
    Multi(usize),
    OneByOne(usize),
}

/// The names a set of `n` takes for `key`.
fn set_names(key: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{key}/{i}")).collect()
}

struct DlmHandle {
    client: LockClient,
    primitive: Take,
    guard: Option<LockGuard>,
    /// A [`Take::Multi`] hold.
    multi: Option<MultiLockGuard>,
    /// A [`Take::OneByOne`] hold, in the order taken.
    singles: Vec<LockGuard>,
    /// What `fenced-use` writes to (one per handle: its thread locks one name).
    resource: FencedResource<u64>,
}

impl LockHandle for DlmHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        self.lock(key, 0)
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        let wait = Duration::from_millis(max_wait_ms);
        let c = &self.client;
        match self.primitive {
            Take::Multi(n) => {
                self.multi = c
                    .get_multi_lock(set_names(key, n))
                    .and_then(|m| m.try_lock_timeout(wait))
                    .unwrap_or(None);
                return self.multi.is_some();
            }
            Take::OneByOne(n) => {
                // One deadline for the set, as the multi-lock's.
                let deadline = std::time::Instant::now() + wait;
                for name in set_names(key, n) {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    match c.get_lock(&name).and_then(|l| l.try_lock_timeout(left)) {
                        Ok(Some(g)) => self.singles.push(g),
                        _ => {
                            while let Some(g) = self.singles.pop() {
                                drop(g);
                            }
                            return false;
                        }
                    }
                }
                return true;
            }
            _ => {}
        }
        self.guard = match self.primitive {
            Take::Mutex => c.get_lock(key).and_then(|l| l.try_lock_timeout(wait)),
            Take::Permit(n) => c
                .get_semaphore(key, n)
                .and_then(|s| s.try_acquire_timeout(wait)),
            Take::Read => c.get_rw_lock(key).and_then(|l| l.try_read_timeout(wait)),
            // The write hold as a plain guard: `WriteGuard` derefs to one, and `unlock`
            // is all the bench does with it.
            Take::Write => c
                .get_rw_lock(key)
                .and_then(|l| l.try_write_timeout(wait))
                .map(|w| w.map(dlm_core::WriteGuard::into_guard)),
            Take::Multi(_) | Take::OneByOne(_) => unreachable!("taken above"),
        }
        .unwrap_or(None);
        self.guard.is_some()
    }

    fn unlock(&mut self) {
        if let Some(g) = self.guard.take() {
            let _ = g.unlock();
        }
        if let Some(m) = self.multi.take() {
            let _ = m.unlock();
        }
        while let Some(g) = self.singles.pop() {
            let _ = g.unlock();
        }
    }

    fn use_token(&mut self, fresh: bool) -> bool {
        let Some(token) = self.guard.as_ref().and_then(|g| g.fencing_token().ok()) else {
            return false;
        };
        if fresh {
            self.resource = FencedResource::new(0);
        }
        self.resource.write(token, |n| *n += 1).is_ok()
    }
}

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// The fenced minimal client's acquisition: `SET NX PX`, and where it took the lock, a
/// stream ID drawn from the server's clock (`XADD ... *`) and the stream's expiry renewed:
/// the least a token drawn on the server in the acquisition's round trip costs. No owner
/// check beyond `NX`, no foreign-key check, no carry, no Redlock commit: a floor, not a
/// safe design.
const ACQUIRE_FENCED: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '0', '*', 'f', '1') \
redis.call('PEXPIRE', KEYS[2], ARGV[3]) return id end return false";

/// The bar: SET NX PX to acquire, EVALSHA compare-and-delete to release, one persistent
/// connection per node per thread; on several nodes, writes to all sockets and then reads
/// all replies. Its `lock` spins on `try_lock`.
///
/// Over the redis crate's connection by default; [`Minimal::over_dlm_transport`] runs the
/// same code over dlm's own connection (`Wire`), which isolates the transport for the A/B.
pub struct Minimal {
    urls: Vec<String>,
    ttl_ms: u64,
    dlm_transport: bool,
    fenced: bool,
}

impl Minimal {
    /// The minimal client over `urls`.
    pub fn new(urls: &[String], ttl: Duration) -> Self {
        Minimal {
            urls: urls.to_vec(),
            ttl_ms: ttl.as_millis() as u64,
            dlm_transport: false,
            fenced: false,
        }
    }

    /// The same client drawing a fencing token in its acquisition ([`ACQUIRE_FENCED`]):
    /// the floor of `fenced-use` for any design that draws the token on the server in the
    /// acquisition's round trip.
    pub fn fenced(urls: &[String], ttl: Duration) -> Self {
        Minimal {
            fenced: true,
            ..Minimal::new(urls, ttl)
        }
    }

    /// The same client over dlm's transport.
    pub fn over_dlm_transport(urls: &[String], ttl: Duration) -> Self {
        Minimal {
            dlm_transport: true,
            ..Minimal::new(urls, ttl)
        }
    }

    fn handle_over<C: Transport + 'static>(&self, open: impl Fn(&str) -> C) -> Box<dyn LockHandle> {
        let load = |script: &str| {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script)
                .get_packed_command()
        };
        let cons = self
            .urls
            .iter()
            .map(|u| {
                let mut con = open(u);
                for script in [RELEASE, ACQUIRE_FENCED] {
                    con.send(&load(script));
                    assert!(matches!(con.recv(), redis::Value::BulkString(_)));
                }
                con
            })
            .collect();
        let sha = |script: &str| redis::Script::new(script).get_hash().to_owned();
        Box::new(MinimalHandle {
            cons,
            ttl_ms: self.ttl_ms,
            sha: sha(RELEASE),
            fenced_sha: self.fenced.then(|| sha(ACQUIRE_FENCED)),
            token: format!("{:032x}", rand::random::<u128>()),
            key: None,
            fencing_token: None,
            resource: FencedResource::new(0),
        })
    }
}

impl LockSystem for Minimal {
    fn name(&self) -> String {
        match (self.dlm_transport, self.fenced) {
            (true, _) => "minimal (dlm transport)".into(),
            (false, true) => "minimal (fenced)".into(),
            (false, false) => "minimal".into(),
        }
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        if self.dlm_transport {
            self.handle_over(|u| {
                dlm_redis::bench_internals::Connection::open(u, Duration::from_secs(5)).unwrap()
            })
        } else {
            self.handle_over(|u| redis::Client::open(u).unwrap().get_connection().unwrap())
        }
    }
}

/// A connection the minimal client can send packed requests on and read replies from.
trait Transport: Send {
    fn send(&mut self, packed: &[u8]);
    fn recv(&mut self) -> redis::Value;
}

impl Transport for redis::Connection {
    fn send(&mut self, packed: &[u8]) {
        self.send_packed_command(packed).unwrap();
    }
    fn recv(&mut self) -> redis::Value {
        self.recv_response().unwrap()
    }
}

impl Transport for dlm_redis::bench_internals::Connection {
    fn send(&mut self, packed: &[u8]) {
        self.send_packed_command(packed).unwrap();
    }
    fn recv(&mut self) -> redis::Value {
        self.recv_response().unwrap()
    }
}

struct MinimalHandle<C> {
    cons: Vec<C>,
    ttl_ms: u64,
    sha: String,
    /// The fenced acquisition's script, for [`Minimal::fenced`].
    fenced_sha: Option<String>,
    token: String,
    key: Option<String>,
    /// The fenced client's token of the current hold: the largest ID its majority drew.
    fencing_token: Option<FencingToken>,
    resource: FencedResource<u64>,
}

impl<C: Transport> MinimalHandle<C> {
    /// Sends `cmd` to every node, then reads every reply.
    fn all(&mut self, cmd: &redis::Cmd) -> Vec<redis::Value> {
        let packed = cmd.get_packed_command();
        for con in &mut self.cons {
            con.send(&packed);
        }
        self.cons.iter_mut().map(|con| con.recv()).collect()
    }

    fn release(&mut self, key: &str) {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(1).arg(key).arg(&self.token);
        self.all(&cmd);
    }
}

impl<C: Transport> LockHandle for MinimalHandle<C> {
    fn try_lock(&mut self, key: &str) -> bool {
        let key = format!("minimal:{key}");
        let mut cmd;
        if let Some(sha) = &self.fenced_sha {
            cmd = redis::cmd("EVALSHA");
            cmd.arg(sha)
                .arg(2)
                .arg(&key)
                .arg(format!("minimal-fence:{key}"))
                .arg(&self.token)
                .arg(self.ttl_ms)
                .arg(86_400_000);
        } else {
            cmd = redis::cmd("SET");
            cmd.arg(&key)
                .arg(&self.token)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl_ms);
        }
        let (mut ok, mut token) = (0, None);
        for v in self.all(&cmd) {
            match v {
                redis::Value::Okay => ok += 1,
                redis::Value::BulkString(id) => {
                    ok += 1;
                    token = token.max(stream_id_token(&id));
                }
                _ => {}
            }
        }
        if ok > self.cons.len() / 2 {
            self.fencing_token = token;
            self.key = Some(key);
            true
        } else {
            if ok > 0 {
                self.release(&key);
            }
            false
        }
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        let end = std::time::Instant::now() + Duration::from_millis(max_wait_ms);
        while std::time::Instant::now() < end {
            if self.try_lock(key) {
                return true;
            }
        }
        false
    }

    fn unlock(&mut self) {
        if let Some(key) = self.key.take() {
            self.release(&key);
        }
    }

    fn use_token(&mut self, fresh: bool) -> bool {
        if self.fenced_sha.is_none() {
            return true;
        }
        let Some(token) = self.fencing_token.take() else {
            return false;
        };
        if fresh {
            self.resource = FencedResource::new(0);
        }
        self.resource.write(token, |n| *n += 1).is_ok()
    }
}

/// A stream ID `ms-seq` as a token, `ms << 20 | seq` (dlm's layout).
fn stream_id_token(id: &[u8]) -> Option<FencingToken> {
    let (ms, seq) = std::str::from_utf8(id).ok()?.split_once('-')?;
    Some(FencingToken::new(
        ms.parse::<u64>().ok()? << 20 | seq.parse::<u64>().ok()?,
    ))
}

/// The release of [`MinimalPubSub`]: compare-and-delete, then a message on the key's
/// channel (passed as a second key: one node only).
const RELEASE_PUBLISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], '1') return 1 end return 0";

/// The bar's pub/sub-woken variant, on one node: the same `SET NX PX` and
/// compare-and-delete, the release also publishes on the key's channel, and a waiter
/// sleeps on a subscription of its own (one more connection per handle, subscribed to the
/// key's channel on its first wait) until a message or its deadline, then tries again.
/// Every subscriber hears every release (they all try): the pattern of Redisson and of
/// most pub/sub-woken clients, and nothing more.
pub struct MinimalPubSub {
    url: String,
    ttl_ms: u64,
}

impl MinimalPubSub {
    /// The pub/sub-woken minimal client of the server at `url`.
    pub fn new(url: &str, ttl: Duration) -> Self {
        MinimalPubSub {
            url: url.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
        }
    }
}

impl LockSystem for MinimalPubSub {
    fn name(&self) -> String {
        "minimal (pub/sub)".into()
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut con = client.get_connection().unwrap();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE_PUBLISH)
            .query(&mut con)
            .unwrap();
        Box::new(PubSubHandle {
            con,
            sub: client.get_connection().unwrap(),
            subscribed: None,
            sha,
            token: format!("{:032x}", rand::random::<u128>()),
            key: None,
            ttl_ms: self.ttl_ms,
        })
    }
}

struct PubSubHandle {
    con: redis::Connection,
    /// The subscriber connection.
    sub: redis::Connection,
    /// The channel `sub` is subscribed to.
    subscribed: Option<String>,
    sha: String,
    token: String,
    key: Option<String>,
    ttl_ms: u64,
}

impl PubSubHandle {
    /// Subscribes `sub` to `channel` (and from the one before), reading up to the
    /// confirmation.
    fn subscribe(&mut self, channel: &str) {
        if let Some(old) = self.subscribed.take() {
            let packed = redis::cmd("UNSUBSCRIBE").arg(&old).get_packed_command();
            self.sub.send_packed_command(&packed).unwrap();
            self.read_until(b"unsubscribe");
        }
        let packed = redis::cmd("SUBSCRIBE").arg(channel).get_packed_command();
        self.sub.send_packed_command(&packed).unwrap();
        self.read_until(b"subscribe");
        self.subscribed = Some(channel.to_owned());
    }

    /// Reads pub/sub replies until one of `kind` (messages before it are dropped).
    fn read_until(&mut self, kind: &[u8]) {
        self.sub.set_read_timeout(None).unwrap();
        loop {
            if let redis::Value::Array(parts) = self.sub.recv_response().unwrap()
                && matches!(parts.first(), Some(redis::Value::BulkString(k)) if k == kind)
            {
                return;
            }
        }
    }
}

impl LockHandle for PubSubHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        let key = format!("minimal:{key}");
        let taken: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms)
            .query(&mut self.con)
            .unwrap();
        if taken.is_some() {
            self.key = Some(key);
        }
        taken.is_some()
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        let end = std::time::Instant::now() + Duration::from_millis(max_wait_ms);
        let channel = format!("minimal-released:{{minimal:{key}}}");
        loop {
            if self.try_lock(key) {
                return true;
            }
            if self.subscribed.as_deref() != Some(channel.as_str()) {
                // Subscribed, then one more try: a release in between is not missed.
                self.subscribe(&channel);
                continue;
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            self.sub.set_read_timeout(Some(left)).unwrap();
            match self.sub.recv_response() {
                Ok(_) => {}
                Err(e) if e.is_timeout() => return self.try_lock(key),
                Err(e) => panic!("subscriber connection: {e}"),
            }
        }
    }

    fn unlock(&mut self) {
        if let Some(key) = self.key.take() {
            let channel = format!("minimal-released:{{{key}}}");
            let _: i64 = redis::cmd("EVALSHA")
                .arg(&self.sha)
                .arg(2)
                .arg(&key)
                .arg(&channel)
                .arg(&self.token)
                .query(&mut self.con)
                .unwrap();
        }
    }
}
