//! One Redis server speaking the lock protocol: its pooled connections, the lock
//! requests run on them (`requests.rs`), the requests whose callers stopped waiting
//! (stragglers), and a connect worker for fan-outs. A topology above may route its requests (a cluster
//! follows redirections): see [`Router`]. This layer hands the router each try's answer
//! and the server's refusal in it; what a refusal means is the router's.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, LockName, OwnerToken};

use crate::conn::{Background, Conn, ConnectWorker, Endpoint, Job, Pool, Pooled};
use crate::options::Options;
use crate::protocol::{Keys, Refusal, ReplyReader};
use crate::transport::Wire;

mod requests;

pub(crate) use requests::Dialect;

/// The `log` target of the warnings about a server's settings (no `appendonly yes` +
/// `appendfsync always`, an eviction policy that can evict lock keys), logged once per server and process: a short-lived program (a CLI run by cron)
/// can route or lower them without hiding other warnings. The settings are read (two
/// `CONFIG GET`) only while warnings of this target are enabled in the `log` facade.
pub const SETTINGS_LOG_TARGET: &str = "dlm_redis::settings";

/// What one try of a request on one node came to, for a [`Router`].
pub(crate) enum Try {
    /// Answered (the answer is with the caller), with the server's refusal when the
    /// answer is one: the router may send the request elsewhere or later instead.
    Answered(Option<Refusal>),
    /// No connection to the node could be had.
    Unreachable(BackendError),
}

/// A topology that routes a node's requests: a Redis Cluster follows `MOVED`, `ASK` and
/// `TRYAGAIN` (`topology/cluster/redirect.rs`). Implemented above this layer, called
/// through the node's weak handle.
pub(crate) trait Router: Send + Sync {
    /// Runs `attempt` on `first`, then where the refusals it reports send it
    /// (`attempt(node, asking)`: `asking` when the request goes to a node once, after
    /// `ASKING`), until an answer stands (`Ok`: the last try's answer is the request's) or
    /// the request fails. Without `retry`, a refusal that asks to try later is not waited
    /// out: the request fails with `Unavailable`.
    fn route(
        &self,
        first: &Node,
        retry: bool,
        attempt: &mut dyn FnMut(&Node, bool) -> Try,
    ) -> Result<(), BackendError>;
}

/// A request to a server whose caller stopped waiting (a straggler, or one still waiting
/// for its connection), counted in the server's background (see [`Node::busy`]) until
/// it is done or given up on, when this is dropped.
pub(crate) struct Outstanding {
    node: Arc<Node>,
    id: usize,
}

impl Outstanding {
    /// The server.
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.node.background.leave(self.id);
    }
}

/// One server.
pub(crate) struct Node {
    pub(crate) endpoint: Endpoint,
    pool: Pool,
    pub(crate) keys: Keys,
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
    router: Option<Weak<dyn Router>>,
    /// The connect worker of fan-outs (see `fanout.rs`), started on first need.
    worker: ConnectWorker,
}

impl Node {
    /// A node for `endpoint` with `options`' pool size, timeouts and key layout. Its pool
    /// connects lazily: a server that is down at start does not fail construction, it
    /// fails the calls that need it.
    pub(crate) fn new(endpoint: Endpoint, options: &Options) -> Node {
        let timeouts = options.timeouts();
        Node {
            pool: Pool::new(endpoint.clone(), timeouts, options.pool_size),
            endpoint,
            keys: Keys::new(options.prefix.clone(), options.fence_ttl),
            server_checked: AtomicBool::new(false),
            scripts_only: AtomicBool::new(false),
            background: Background::default(),
            io_timeout: timeouts.io,
            connect_timeout: timeouts.connect,
            router: None,
            worker: ConnectWorker::default(),
        }
    }

    /// The nodes of `urls`, one each.
    pub(crate) fn for_urls(
        options: &Options,
        urls: &[String],
    ) -> Result<Vec<Node>, dlm_core::InvalidArgument> {
        options.validate()?;
        Ok(options
            .endpoints(urls)?
            .0
            .into_iter()
            .map(|e| Node::new(e, options))
            .collect())
    }

    /// Runs `job` on this node's connect worker (started if need be).
    pub(crate) fn spawn_connect(&self, job: Job) {
        self.worker.spawn(&self.endpoint, job);
    }

    /// Whether this node's connect worker is running.
    pub(crate) fn connect_worker_running(&self) -> bool {
        self.worker.running()
    }

    /// Stops the connect worker, waiting for its current connect (unless called on it).
    pub(crate) fn stop_connect_worker(&self) {
        self.worker.stop();
    }

    /// Reads this server's replies (its name is in every error).
    pub(crate) fn reader(&self) -> ReplyReader<'_> {
        ReplyReader {
            server: &self.endpoint,
            keys: &self.keys,
        }
    }

    /// This node with its requests routed by `router` (a cluster's master follows the
    /// cluster's redirections).
    pub(crate) fn routed_by(mut self, router: Weak<dyn Router>) -> Node {
        self.router = Some(router);
        self
    }

    /// Runs `f` on a pooled connection. A connection that saw an I/O error or timeout is
    /// discarded: a late reply could otherwise answer the next command. In a cluster, a
    /// redirection is followed.
    pub(crate) fn run<T>(
        &self,
        f: impl Fn(&mut Wire) -> redis::RedisResult<T>,
    ) -> Result<T, BackendError> {
        self.run_routed(&f, &|_| None, true)
    }

    /// [`run`](Self::run), where `refusal_in` finds the server's refusal in a reply that
    /// keeps server errors as values. With a router (a cluster's master), the router
    /// says where a refused request goes next; without `retry`, a refusal that asks to
    /// try later is not waited out (see [`Router::route`]).
    fn run_routed<T>(
        &self,
        f: &dyn Fn(&mut Wire) -> redis::RedisResult<T>,
        refusal_in: &dyn Fn(&T) -> Option<Refusal>,
        retry: bool,
    ) -> Result<T, BackendError> {
        let Some(router) = self.router.as_ref().and_then(Weak::upgrade) else {
            return self
                .run_here(f, false)?
                .map_err(|e| self.endpoint.error(&e));
        };
        let mut answer = None;
        router.route(
            self,
            retry,
            &mut |node, asking| match node.run_here(f, asking) {
                Err(e) => Try::Unreachable(e),
                Ok(result) => {
                    let refusal = match &result {
                        Ok(value) => refusal_in(value),
                        Err(e) => Refusal::of_error(e),
                    };
                    answer = Some(result.map_err(|e| node.endpoint.error(&e)));
                    Try::Answered(refusal)
                }
            },
        )?;
        answer.unwrap_or_else(|| {
            Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: the router ended without an answer", self.endpoint),
            ))
        })
    }

    /// Runs `f` on a pooled connection of this server (after `ASKING` if `asking`); the
    /// outer error is a connection that could not be had.
    pub(crate) fn run_here<T>(
        &self,
        f: &dyn Fn(&mut Wire) -> redis::RedisResult<T>,
        asking: bool,
    ) -> Result<redis::RedisResult<T>, BackendError> {
        // No connection: the request was not sent.
        let mut conn = self.connection().map_err(BackendError::never_sent)?;
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
    /// first one made while the settings warnings are enabled checks the server's
    /// settings.
    pub(crate) fn connection(&self) -> Result<Pooled, BackendError> {
        if let Some(e) = self.pool.down() {
            return Err(e);
        }
        // An idle connection the server has closed meanwhile (or, with Sentinel, one to
        // a former master) is dropped, not handed out to fail its request; the pool holds
        // at most `pool_size` of them.
        let mut stale = 0;
        let mut conn = loop {
            let mut conn = self.pool.checkout()?;
            if stale > self.pool.max_size() || !conn.is_stale(&self.endpoint) {
                break conn;
            }
            conn.broken = true;
            stale += 1;
        };
        // Only when the warnings would be seen: a program whose logger drops them (a
        // `dlm run` without -v, a program with no logger) pays no round trips for them.
        if log::log_enabled!(target: SETTINGS_LOG_TARGET, log::Level::Warn)
            && !self.server_checked.swap(true, Ordering::Relaxed)
        {
            self.check_server(&mut conn.con);
        }
        Ok(conn)
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

    /// Counts a request in the background (see [`busy`](Self::busy)) until the returned
    /// [`Outstanding`] is dropped. `key`: the lock and owner of an acquisition whose late reply will be
    /// undone.
    pub(crate) fn background(self: &Arc<Self>, key: Option<(LockName, OwnerToken)>) -> Outstanding {
        let id = self.background.enter(key);
        Outstanding {
            node: self.clone(),
            id,
        }
    }

    /// Warns once per server about settings that can lose locks (asked on the first
    /// connection made while these warnings are enabled in the `log` facade): a restart without
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
                target: SETTINGS_LOG_TARGET,
                "{}: appendonly {aof}, appendfsync {fsync}: a restart loses the locks held on this server, and they can be granted again (fencing tokens still increase: they follow the server's clock); use appendonly yes + appendfsync always",
                self.endpoint
            );
        }
        let (maxmemory, policy) = (get("maxmemory"), get("maxmemory-policy"));
        if maxmemory != "0" && !maxmemory.is_empty() && policy != "noeviction" {
            log::warn!(
                target: SETTINGS_LOG_TARGET,
                "{}: maxmemory {maxmemory} with maxmemory-policy {policy} can evict lock keys (all of them have an expiry), and an evicted lock can be granted again; use maxmemory-policy noeviction",
                self.endpoint
            );
        }
    }

    /// An idle pooled connection, if one is ready (never connects, never waits).
    pub(crate) fn idle_connection(&self) -> Option<Pooled> {
        self.pool.idle()
    }

    /// An error at once, without waiting, when the server is down (see [`Pool::down`]).
    pub(crate) fn down(&self) -> Option<BackendError> {
        self.pool.down()
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("server", &self.endpoint)
            .field("pool (connections, idle)", &self.pool.counts())
            .finish()
    }
}
