//! One Redis server: a pool of connections and the lock scripts.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dlm_core::{BackendError, BackendErrorKind, LockName, OwnerToken};
use parking_lot::Mutex;
use redis::Script;

use crate::conn::{Conn, Endpoint, Manager, Timeouts, map_error};

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

/// What the acquire script does with the fencing counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Nothing.
    Off,
    /// `INCR` it (single instance: the new value is the token).
    Increment,
    /// Read it (Redlock round 1; the token is committed in round 2).
    Read,
}

/// One script call prepared for one node: built before it is sent, so that a caller can
/// send it to several nodes before reading any reply (Redlock's pipelined fan-out).
pub(crate) struct Call {
    script: &'static Script,
    /// `EVALSHA sha numkeys keys... args...`
    cmd: redis::Cmd,
}

impl Call {
    fn new(script: &'static Script, keys: &[String], args: impl FnOnce(&mut redis::Cmd)) -> Call {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        args(&mut cmd);
        Call { script, cmd }
    }

    /// The request as bytes on the wire.
    pub(crate) fn packed(&self) -> Vec<u8> {
        self.cmd.get_packed_command()
    }

    /// Runs the call on `con`, loading the script first if the server does not know it.
    pub(crate) fn execute(&self, con: &mut redis::Connection) -> redis::RedisResult<redis::Value> {
        match self.cmd.query::<redis::Value>(con) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load(con)?;
                self.cmd.query(con)
            }
            other => other,
        }
    }
}

/// The key layout: one hash tag per lock, so the lock key, its fencing counter and its
/// release channel share a cluster slot. Names go into KEYS only.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: String) -> Self {
        Keys { prefix }
    }

    /// `prefix:{name}`
    pub(crate) fn lock(&self, name: &LockName) -> String {
        format!("{}:{{{}}}", self.prefix, name.as_str())
    }

    /// `prefix:{name}:fence`
    pub(crate) fn fence(&self, name: &LockName) -> String {
        format!("{}:{{{}}}:fence", self.prefix, name.as_str())
    }

    /// `prefix:{name}:released`
    pub(crate) fn channel(&self, name: &LockName) -> String {
        format!("{}:{{{}}}:released", self.prefix, name.as_str())
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

/// One server.
pub(crate) struct Node {
    pub(crate) endpoint: Endpoint,
    pool: r2d2::Pool<Manager>,
    pub(crate) keys: Keys,
    last_connect_error: LastConnectError,
    /// Set once the server's persistence was checked (fencing needs durable counters).
    durability_checked: std::sync::atomic::AtomicBool,
    io_timeout: Duration,
}

/// r2d2 keeps only the text of the last connect error; this keeps its kind, so that a
/// failed checkout reports `Auth` (never retried) rather than a transient `Unavailable`.
#[derive(Debug, Default, Clone)]
struct LastConnectError(Arc<Mutex<Option<BackendErrorKind>>>);

impl r2d2::HandleError<BackendError> for LastConnectError {
    fn handle_error(&self, error: BackendError) {
        log::debug!("redis connection failed: {error}");
        *self.0.lock() = Some(error.kind());
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
        let last_connect_error = LastConnectError::default();
        let pool = r2d2::Pool::builder()
            .max_size(pool_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(timeouts.connect)
            .error_handler(Box::new(last_connect_error.clone()))
            .thread_pool(thread_pool)
            .build_unchecked(manager);
        Node {
            endpoint,
            pool,
            keys,
            last_connect_error,
            durability_checked: std::sync::atomic::AtomicBool::new(!fencing),
            io_timeout: timeouts.io,
        }
    }

    /// Runs `f` on a pooled connection. A connection that saw an I/O error or timeout is
    /// discarded: a late reply could otherwise answer the next command.
    fn run<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, BackendError> {
        let mut conn = self.pool.get().map_err(|e| {
            let kind = match self.last_connect_error.0.lock().take() {
                Some(kind @ (BackendErrorKind::Auth | BackendErrorKind::Permission)) => kind,
                Some(BackendErrorKind::Timeout) => BackendErrorKind::Timeout,
                _ => BackendErrorKind::Unavailable,
            };
            BackendError::new(kind, format!("{}: no connection: {e}", self.endpoint))
        })?;
        let conn: &mut Conn = &mut conn;
        if !self
            .durability_checked
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
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
    fn check_durability(&self, con: &mut redis::Connection) {
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

    pub(crate) fn acquire_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Call {
        Call::new(
            &SCRIPTS.acquire,
            &[self.keys.lock(name), self.keys.fence(name)],
            |cmd| {
                cmd.arg(owner.encode()).arg(millis(ttl)).arg(match fencing {
                    Fencing::Off => "0",
                    Fencing::Increment => "1",
                    Fencing::Read => "2",
                });
            },
        )
    }

    pub(crate) fn parse_acquire(
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
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: acquire script returned {other}", self.endpoint),
            )),
        }
    }

    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Result<NodeAcquire, BackendError> {
        let reply = self.execute(&self.acquire_call(name, owner, ttl, fencing))?;
        self.parse_acquire(name, reply)
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

    /// Compare-and-PEXPIRE; the reply parses with [`parse_flag`](Self::parse_flag).
    pub(crate) fn extend_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        Call::new(&SCRIPTS.extend, &[self.keys.lock(name)], |cmd| {
            cmd.arg(owner.encode()).arg(millis(ttl));
        })
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
        Call::new(
            &SCRIPTS.commit,
            &[self.keys.lock(name), self.keys.fence(name)],
            |cmd| {
                cmd.arg(owner.encode()).arg(token);
            },
        )
    }

    /// Releases if ours, publishing `release_id` on the lock's channel.
    pub(crate) fn release_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Call {
        Call::new(
            &SCRIPTS.release,
            &[self.keys.lock(name), self.keys.channel(name)],
            |cmd| {
                cmd.arg(owner.encode()).arg(release_id);
            },
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

    /// The I/O timeout of this node's connections.
    pub(crate) fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    pub(crate) fn force_release_call(&self, name: &LockName, release_id: u64) -> Call {
        Call::new(
            &SCRIPTS.force_release,
            &[self.keys.lock(name), self.keys.channel(name)],
            |cmd| {
                cmd.arg(release_id);
            },
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
        Call::new(&SCRIPTS.inspect, &[self.keys.lock(name)], |_| {})
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
