//! One Redis server: a pool of connections and the lock scripts.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dlm_core::{BackendError, BackendErrorKind, LockName, OwnerToken};
use parking_lot::Mutex;
use redis::Script;

use crate::conn::{Conn, Endpoint, Manager, Timeouts, map_error};
use crate::wire::{Resp, Wire, decimal_digits};

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

/// What an acquisition does with the fencing counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Nothing.
    Off,
    /// `INCR` it (single instance: the new value is the token).
    Increment,
    /// Read it (Redlock round 1; the token is committed in round 2).
    Read,
}

impl Fencing {
    /// The acquire script's mode argument.
    fn mode(self) -> &'static [u8] {
        match self {
            Fencing::Off => b"0",
            Fencing::Increment => b"1",
            Fencing::Read => b"2",
        }
    }
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
    /// `SET key token NX PX ms GET` and `GET fence`, pipelined: two replies.
    SetGetFence,
    /// `MULTI`, `SET key token NX PX ms GET`, `INCR fence`, `EXEC`: four replies, kept as
    /// they are (what they mean depends on which were refused: see `parse_acquire`).
    SetIncrFence,
}

/// One request prepared for one node: encoded before it is sent, so that a caller can
/// send it to several nodes before reading any reply (Redlock's pipelined fan-out).
pub(crate) struct Call {
    bytes: Vec<u8>,
    shape: Shape,
}

impl Call {
    /// Writes the request.
    pub(crate) fn send(&self, con: &mut Wire) -> redis::RedisResult<()> {
        con.send(&self.bytes)
    }

    /// Reads the replies to a request sent with [`send`](Self::send): one value, or an
    /// array of one value per pipelined command (errors kept as values, so that every
    /// reply is read). A script the server does not know is loaded and the call re-run.
    pub(crate) fn receive(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        match self.shape {
            Shape::Script(script) => match con.receive().and_then(redis::Value::extract_error) {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load(con)?;
                    self.send(con)?;
                    con.receive().and_then(redis::Value::extract_error)
                }
                other => other,
            },
            Shape::SetGet => con.receive(),
            Shape::SetGetFence => {
                let set = con.receive()?;
                let fence = con.receive()?;
                Ok(redis::Value::Array(vec![set, fence]))
            }
            Shape::SetIncrFence => {
                let mut replies = Vec::with_capacity(4);
                for _ in 0..4 {
                    replies.push(con.receive()?);
                }
                Ok(redis::Value::Array(replies))
            }
        }
    }

    /// Sends the request and reads its replies.
    pub(crate) fn execute(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        self.send(con)?;
        self.receive(con)
    }
}

/// The key layout: one hash tag per lock, so the lock key, its fencing counter and its
/// release channel share a cluster slot. Names go into KEYS only.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

const LOCK: &str = "";
const FENCE: &str = ":fence";
const CHANNEL: &str = ":released";

impl Keys {
    pub(crate) fn new(prefix: String) -> Self {
        Keys { prefix }
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
    /// Ours now; the fencing counter's value (0 when fencing is off).
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

/// One server.
pub(crate) struct Node {
    pub(crate) endpoint: Endpoint,
    pool: r2d2::Pool<Manager>,
    pub(crate) keys: Keys,
    connects: Connects,
    /// Set once the server's persistence was checked (fencing needs durable counters).
    durability_checked: AtomicBool,
    /// Set when the server turned out to be older than 7.0: acquire with the script.
    scripts_only: AtomicBool,
    /// Set when the server refused `MULTI` (an ACL without it): the single-instance fenced
    /// acquisition uses the script.
    no_multi: AtomicBool,
    io_timeout: Duration,
}

/// What the pool's connection attempts have shown: whether the server is down (its last
/// connection attempt failed and none has succeeded since), and the kind of that failure.
/// r2d2 keeps only the text of the last connect error; the kind lets a failed checkout
/// report `Auth` (never retried) rather than a transient `Unavailable`.
#[derive(Debug, Default, Clone)]
struct Connects(Arc<ConnectState>);

#[derive(Debug, Default)]
struct ConnectState {
    kind: Mutex<Option<BackendErrorKind>>,
    down: AtomicBool,
}

impl r2d2::HandleError<BackendError> for Connects {
    fn handle_error(&self, error: BackendError) {
        log::debug!("redis connection failed: {error}");
        *self.0.kind.lock() = Some(error.kind());
        self.0.down.store(true, Ordering::Release);
    }
}

impl Connects {
    /// The kind of error for a call that found no connection: the last connect failure's
    /// kind when it was a refusal of the credentials or (if `timeouts` is set) a timeout,
    /// otherwise `Unavailable`.
    fn failure(&self, timeouts: bool) -> BackendErrorKind {
        match *self.0.kind.lock() {
            Some(kind @ (BackendErrorKind::Auth | BackendErrorKind::Permission)) => kind,
            Some(BackendErrorKind::Timeout) if timeouts => BackendErrorKind::Timeout,
            _ => BackendErrorKind::Unavailable,
        }
    }
}

impl r2d2::HandleEvent for Connects {
    fn handle_acquire(&self, _: r2d2::event::AcquireEvent) {
        self.0.down.store(false, Ordering::Release);
        *self.0.kind.lock() = None;
    }
}

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
        fencing: bool,
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
            durability_checked: AtomicBool::new(!fencing),
            scripts_only: AtomicBool::new(false),
            no_multi: AtomicBool::new(false),
            io_timeout: timeouts.io,
        }
    }

    /// Runs `f` on a pooled connection. A connection that saw an I/O error or timeout is
    /// discarded: a late reply could otherwise answer the next command.
    fn run<T>(
        &self,
        f: impl FnOnce(&mut Wire) -> redis::RedisResult<T>,
    ) -> Result<T, BackendError> {
        if let Some(e) = self.down() {
            return Err(e);
        }
        let mut conn = self.pool.get().map_err(|e| {
            let kind = self.connects.failure(true);
            BackendError::new(kind, format!("{}: no connection: {e}", self.endpoint))
        })?;
        let conn: &mut Conn = &mut conn;
        if !self.durability_checked.swap(true, Ordering::Relaxed) {
            self.check_durability(&mut conn.con);
        }
        f(&mut conn.con).map_err(|e| {
            if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() {
                conn.broken = true;
            }
            map_error(&e, &self.endpoint.to_string())
        })
    }

    /// Fencing tokens are only as durable as the counters: warns once when the server
    /// would lose them on a restart (needs `appendonly yes` and `appendfsync always`).
    fn check_durability(&self, con: &mut Wire) {
        let config: redis::RedisResult<Vec<String>> =
            redis::cmd("CONFIG").arg("GET").arg("append*").query(con);
        match config {
            Ok(pairs) => {
                let get = |k: &str| {
                    pairs
                        .chunks(2)
                        .find(|p| p[0] == k)
                        .map(|p| p[1].clone())
                        .unwrap_or_default()
                };
                let (aof, fsync) = (get("appendonly"), get("appendfsync"));
                if aof != "yes" || fsync != "always" {
                    log::warn!(
                        "{}: fencing tokens without durable counters (appendonly {aof}, appendfsync {fsync}): a restart can reissue old tokens; use appendonly yes + appendfsync always",
                        self.endpoint
                    );
                }
            }
            Err(e) => log::debug!(
                "{}: cannot read the persistence settings ({e}); fencing tokens survive restarts only with appendonly yes + appendfsync always",
                self.endpoint
            ),
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

    /// The first request of an acquisition: the plain `SET key token NX PX ms GET`, so that
    /// the server runs no script on the uncontended path. With the counter read (Redlock
    /// round 1) a `GET` of it is pipelined; with the counter incremented (single instance)
    /// the SET and an `INCR` go in one `MULTI`/`EXEC` transaction: nothing runs between
    /// them, so tokens follow the order of acquisitions. The INCR also runs when the SET
    /// finds the lock taken (tokens then skip a number; they still only increase).
    /// Servers older than 7.0 (no `SET ... NX GET`), and fenced acquisitions where `MULTI`
    /// is refused, use the acquire script.
    pub(crate) fn acquire_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Call {
        if self.scripts_only.load(Ordering::Relaxed)
            || (fencing == Fencing::Increment && self.no_multi.load(Ordering::Relaxed))
        {
            return self.acquire_script_call(name, owner, ttl, fencing);
        }
        let token = owner.encoded();
        let mut r = Resp::new();
        if fencing == Fencing::Increment {
            r.command(1).arg(b"MULTI");
        }
        r.command(7).arg(b"SET");
        self.keys.arg(&mut r, name, LOCK);
        r.arg(token.as_bytes())
            .arg(b"NX")
            .arg(b"PX")
            .arg_u64(millis(ttl))
            .arg(b"GET");
        let shape = match fencing {
            Fencing::Off => Shape::SetGet,
            Fencing::Read => {
                r.command(2).arg(b"GET");
                self.keys.arg(&mut r, name, FENCE);
                Shape::SetGetFence
            }
            Fencing::Increment => {
                r.command(2).arg(b"INCR");
                self.keys.arg(&mut r, name, FENCE);
                r.command(1).arg(b"EXEC");
                Shape::SetIncrFence
            }
        };
        Call { bytes: r.0, shape }
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
        let mut r = Resp::evalsha(script, 2, 3);
        self.keys.arg(&mut r, name, LOCK);
        self.keys.arg(&mut r, name, FENCE);
        r.arg(owner.encoded().as_bytes())
            .arg_u64(millis(ttl))
            .arg(fencing.mode());
        Call {
            bytes: r.0,
            shape: Shape::Script(script),
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
        let (set, fence) = match call.shape {
            Shape::Script(_) => return self.parse_acquire_script(name, reply).map(Step::Done),
            Shape::SetGet => (reply, None),
            Shape::SetGetFence => match reply {
                redis::Value::Array(mut v) if v.len() == 2 => {
                    let fence = v.pop();
                    (v.pop().unwrap_or_default(), fence)
                }
                other => return Err(self.protocol("SET + GET", &other)),
            },
            Shape::SetIncrFence => match reply {
                redis::Value::Array(v) if v.len() == 4 => {
                    let [multi, set, incr, exec]: [redis::Value; 4] = v
                        .try_into()
                        .unwrap_or_else(|_| unreachable!("four replies"));
                    self.transaction(multi, set, incr, exec)?
                }
                other => return Err(self.protocol("MULTI", &other)),
            },
        };
        match set {
            redis::Value::Nil => {
                let fence = match fence {
                    Some(value) => self.parse_counter(name, value)?,
                    None => 0,
                };
                Ok(Step::Done(NodeAcquire::Acquired { fence }))
            }
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
                Err(map_error(&e, &self.endpoint.to_string()))
            }
            other => Err(self.protocol("SET", &other)),
        }
    }

    fn parse_acquire_script(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<NodeAcquire, BackendError> {
        let (code, value): (i64, i64) = self.parse(reply)?;
        match code {
            1 => Ok(NodeAcquire::Acquired {
                fence: value.max(0) as u64,
            }),
            0 => Ok(NodeAcquire::Held {
                remaining: Duration::from_millis(value.max(0) as u64),
            }),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            -3 => Err(self.foreign_counter(name)),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: acquire script returned {other}", self.endpoint),
            )),
        }
    }

    /// The SET's and the INCR's replies out of the four replies of the fenced
    /// transaction.
    fn transaction(
        &self,
        multi: redis::Value,
        set: redis::Value,
        incr: redis::Value,
        exec: redis::Value,
    ) -> Result<(redis::Value, Option<redis::Value>), BackendError> {
        if let redis::Value::ServerError(e) = &multi {
            // No transaction: the SET and the INCR ran on their own, right after each
            // other, and their replies are the answer. Safe for this once (a later holder's
            // SET can only come between them if our key vanished, and then our lease's
            // validity is gone before the reply arrives); later acquisitions use the
            // script.
            if !self.no_multi.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "{}: MULTI refused ({}): fenced acquisitions use the acquire script (allow +multi +exec for the faster path)",
                    self.endpoint,
                    e.details().unwrap_or_default()
                );
            }
            return Ok((set, Some(incr)));
        }
        // A command refused while queueing (an ACL denial) aborts the transaction: that
        // refusal is the answer, and nothing ran.
        if let Some(refused) = [set, incr]
            .into_iter()
            .find(|r| matches!(r, redis::Value::ServerError(_)))
        {
            return Ok((refused, None));
        }
        match exec {
            redis::Value::Array(mut v) if v.len() == 2 => {
                let incr = v.pop();
                Ok((v.pop().unwrap_or_default(), incr))
            }
            other => Err(self.protocol("EXEC", &other)),
        }
    }

    /// The fencing counter as `GET` or `INCR` returns it. A counter that is not a number
    /// (or not a string) was not written by dlm.
    fn parse_counter(&self, name: &LockName, value: redis::Value) -> Result<u64, BackendError> {
        let foreign = || self.foreign_counter(name);
        match value {
            redis::Value::Nil => Ok(0),
            redis::Value::ServerError(e) => {
                let e: redis::RedisError = e.into();
                if e.code() == Some("WRONGTYPE")
                    || e.detail().is_some_and(|d| d.contains("not an integer"))
                {
                    return Err(foreign());
                }
                Err(map_error(&e, &self.endpoint.to_string()))
            }
            other => self.parse(other).map_err(|_| foreign()),
        }
    }

    fn foreign_counter(&self, name: &LockName) -> BackendError {
        BackendError::new(
            BackendErrorKind::UnexpectedKey,
            format!(
                "{}: the fencing counter {} is not a number; it was not written by dlm",
                self.endpoint,
                self.keys.key(name, FENCE)
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
    /// when the reply needs it.
    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Result<NodeAcquire, BackendError> {
        let call = self.acquire_call(name, owner, ttl, fencing);
        let reply = self.execute(&call)?;
        match self.parse_acquire(name, &call, reply)? {
            Step::Done(answer) => Ok(answer),
            Step::Script => {
                let call = self.acquire_script_call(name, owner, ttl, fencing);
                let reply = self.execute(&call)?;
                self.parse_acquire_script(name, reply)
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

    /// `1` -> `true`, `0` -> `false`.
    pub(crate) fn parse_flag(&self, reply: redis::Value) -> Result<bool, BackendError> {
        Ok(self.parse::<i64>(reply)? == 1)
    }

    /// A script call over the lock key (and `second` key, if any) with `args`.
    fn script_call(
        &self,
        script: &'static Script,
        name: &LockName,
        second: Option<&str>,
        args: &[&[u8]],
    ) -> Call {
        let keys = 1 + usize::from(second.is_some());
        let mut r = Resp::evalsha(script, keys, args.len());
        self.keys.arg(&mut r, name, LOCK);
        if let Some(suffix) = second {
            self.keys.arg(&mut r, name, suffix);
        }
        for a in args {
            r.arg(a);
        }
        Call {
            bytes: r.0,
            shape: Shape::Script(script),
        }
    }

    /// Compare-and-PEXPIRE; the reply parses with [`parse_flag`](Self::parse_flag).
    pub(crate) fn extend_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        let mut ms = [0u8; 20];
        self.script_call(
            &SCRIPTS.extend,
            name,
            None,
            &[
                owner.encoded().as_bytes(),
                decimal_digits(millis(ttl), &mut ms),
            ],
        )
    }

    pub(crate) fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let reply = self.execute(&self.extend_call(name, owner, ttl))?;
        self.parse_flag(reply)
    }

    /// Redlock fencing round 2: raises the counter to `token` if the lock is still ours.
    pub(crate) fn commit_call(&self, name: &LockName, owner: &OwnerToken, token: u64) -> Call {
        let mut t = [0u8; 20];
        self.script_call(
            &SCRIPTS.commit,
            name,
            Some(FENCE),
            &[owner.encoded().as_bytes(), decimal_digits(token, &mut t)],
        )
    }

    /// Releases if ours, publishing `release_id` on the lock's channel.
    pub(crate) fn release_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Call {
        let mut id = [0u8; 20];
        self.script_call(
            &SCRIPTS.release,
            name,
            Some(CHANNEL),
            &[
                owner.encoded().as_bytes(),
                decimal_digits(release_id, &mut id),
            ],
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
        self.run(|con| call.execute(con))
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
            format!(
                "{}: down (the last connection attempt failed; retrying in the background)",
                self.endpoint
            ),
        ))
    }

    /// The I/O timeout of this node's connections.
    pub(crate) fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    pub(crate) fn force_release_call(&self, name: &LockName, release_id: u64) -> Call {
        let mut id = [0u8; 20];
        self.script_call(
            &SCRIPTS.force_release,
            name,
            Some(CHANNEL),
            &[decimal_digits(release_id, &mut id)],
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
        self.script_call(&SCRIPTS.inspect, name, None, &[])
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
