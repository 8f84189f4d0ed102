//! The single-instance backend.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Renewal, Watch,
};

use crate::cluster::{Cluster, Redirect};
use crate::fanout::{Fanout, Late};
use crate::hints::Hints;
use crate::node::{Call, Fencing, Keys, Node, NodeAcquire};

use crate::options::{Options, invalid, option_setters};

/// A lock on one Redis server.
///
/// Safe while that one server keeps its data: a failover to a replica or a restart without
/// persistence can lose a lock that is held (see the README's "Semantics and caveats").
/// Fencing tokens are IDs drawn from the fencing stream of the lock's cluster slot (`XADD`
/// in one transaction with the `SET NX` that takes it): they increase even after the
/// server lost its data, as long as its clock has not gone back below them.
///
/// ```no_run
/// use dlm_core::{Lock, LockClient};
/// use dlm_redis::RedisBackend;
///
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379/").build()?;
/// let client = LockClient::new(backend);
/// let guard = client.get_lock("invoice-42")?.lock()?;
/// println!("fencing token {:?}", guard.fencing_token());
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    keys: Keys,
    options: Options,
    hints: Option<Hints>,
    /// Renewals go to every node at once (in a cluster, every master of the holds).
    fanout: Fanout,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.fanout.stop();
        let nodes = match &self.target {
            Target::One(node) => vec![node.clone()],
            Target::Cluster(cluster) => cluster.masters(),
        };
        for node in nodes {
            node.stop_connect_worker();
        }
    }
}

/// Where the lock keys live.
enum Target {
    /// One server (or the master that Sentinel names).
    One(Arc<Node>),
    /// The master of the key's slot in a Redis Cluster.
    Cluster(Arc<Cluster>),
}

impl RedisBackend {
    /// A builder for a backend on the server at `url`: `redis://[user:pass@]host:port[/db]`
    /// or `redis+unix:///path/to/socket`.
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            options: Options::single(),
            sentinel: None,
            sentinel_only: None,
            cluster: None,
        }
    }

    /// A builder for a backend on a Redis Cluster, given one or more of its nodes
    /// (`redis://[user:pass@]host:port`, `rediss://` for TLS; every node is reached with
    /// the seeds' credentials and TLS settings). `build` asks every seed for the cluster's
    /// slot map, and refuses a server without cluster mode and seeds of two clusters.
    ///
    /// A lock's keys share one hash slot (the name is the hash tag), so each lock lives
    /// on one master: the slot's. `MOVED` and `ASK` are followed (slot migrations keep
    /// working), and the map is read again when a master stops answering. Safe only while
    /// that master keeps its data: a failover to a replica that had not received the
    /// grant can lose a held lock (see the README's "Which deployment gives which
    /// guarantee").
    ///
    /// ```no_run
    /// use dlm_redis::RedisBackend;
    ///
    /// let backend =
    ///     RedisBackend::cluster(&["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]).build()?;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn cluster<S: AsRef<str>>(seeds: &[S]) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: String::new(),
            options: Options::single(),
            sentinel: None,
            sentinel_only: None,
            cluster: Some(seeds.iter().map(|s| s.as_ref().to_owned()).collect()),
        }
    }

    /// A builder for a backend on the master of a Redis Sentinel deployment: the server
    /// that the `sentinels` (URLs `redis://[user:pass@]host:port`, with the sentinels' own
    /// credentials; `rediss://` when the deployment uses TLS, for the sentinels and the
    /// data nodes alike) name as the master of `master_name`. The data nodes' credentials
    /// and database are [`master_auth`](RedisBackendBuilder::master_auth) and
    /// [`master_db`](RedisBackendBuilder::master_db).
    ///
    /// Each new connection asks the sentinels for the master (the answer is cached until
    /// a failure casts doubt on it) and checks it with `ROLE`; connections to a former
    /// master are dropped, and its `READONLY` refusals are retried against the new one.
    /// Safe only while the master keeps its data: a failover to a replica that had not
    /// received the latest writes can lose a held lock (see the README's "Which deployment
    /// gives which guarantee").
    ///
    /// ```no_run
    /// use dlm_redis::RedisBackend;
    ///
    /// let backend = RedisBackend::sentinel(
    ///     "mymaster",
    ///     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    /// )
    /// .master_auth(None, "data-password")
    /// .build()?;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn sentinel<S: AsRef<str>>(master_name: &str, sentinels: &[S]) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: String::new(),
            options: Options::single(),
            sentinel: Some(SentinelSpec {
                master_name: master_name.to_owned(),
                sentinels: sentinels.iter().map(|s| s.as_ref().to_owned()).collect(),
                username: None,
                password: None,
                db: None,
            }),
            sentinel_only: None,
            cluster: None,
        }
    }

    /// The backend for `url` with the default settings. No I/O happens here: a server that
    /// is down fails the calls that need it, not the construction.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL.
    pub fn new(url: &str) -> dlm_core::Result<Self> {
        RedisBackend::builder(url).build()
    }

    /// The Redis keys and the channel of the lock called `name`.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a name that [`LockName::new`] rejects.
    pub fn keys(&self, name: &str) -> dlm_core::Result<crate::LockKeys> {
        Ok(self.inner.keys.all(&LockName::new(name)?))
    }

    /// [`fenced_set`](crate::fenced_set) on this backend's server, over its pooled
    /// connections (with its TLS, credentials, database and timeouts): the resource-side
    /// check for a value kept next to the lock.
    ///
    /// ```no_run
    /// use dlm_core::{Lock, LockClient};
    /// use dlm_redis::{FencedWriteError, RedisBackend};
    ///
    /// let backend = std::sync::Arc::new(RedisBackend::new("redis://127.0.0.1:6379/")?);
    /// let client = LockClient::new(backend.clone());
    /// let guard = client.get_lock("report:42")?.lock()?;
    /// let token = guard.fencing_token().expect("fencing is on by default");
    /// match backend.fenced_set("report:42:value", token, b"done") {
    ///     Ok(()) => {}
    ///     Err(FencedWriteError::Stale(e)) => eprintln!("a newer holder wrote first: {e}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// assert_eq!(backend.fenced_get("report:42:value")?, Some((b"done".to_vec(), token)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`FencedWriteError::Stale`](crate::FencedWriteError::Stale) when a newer token wrote
    /// first; [`FencedWriteError::Backend`](crate::FencedWriteError::Backend) when Redis
    /// fails.
    pub fn fenced_set(
        &self,
        key: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<(), crate::FencedWriteError> {
        let reply = self
            .on_node_of_key(key, |node| {
                node.run(|con| crate::fenced::set_request(con, key, token, value))
            })
            .map_err(crate::FencedWriteError::Backend)?;
        crate::fenced::set_verdict(token, reply)
    }

    /// [`fenced_get`](crate::fenced_get) on this backend's server, over its pooled
    /// connections: the value stored by [`fenced_set`](RedisBackend::fenced_set) at `key`,
    /// with the token of its last write.
    ///
    /// # Errors
    /// [`BackendError`] when Redis fails.
    pub fn fenced_get(&self, key: &str) -> Result<Option<(Vec<u8>, FencingToken)>, BackendError> {
        self.on_node_of_key(key, |node| {
            node.run(|con| crate::fenced::get_request(con, key))
        })
    }

    /// Whether the release-hint listener is subscribed now (it starts with the first
    /// wait; `false` while its connection is down or when hints are off).
    pub fn release_hints_active(&self) -> bool {
        self.inner
            .hints
            .as_ref()
            .is_some_and(|h| h.listeners_up() > 0)
    }

    /// Wakes a waiter of this process for the release `id` at once (see `Hints::released`).
    fn released_here(&self, name: &LockName, id: u64) {
        if let Some(hints) = &self.inner.hints {
            hints.released(|| self.inner.keys.channel(name), id);
        }
    }

    /// Runs `f` on the node that serves the lock `name` (in a cluster, on the new master
    /// if the slot's master failed and was replaced).
    fn on_node<T>(
        &self,
        name: &LockName,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.on_slot(|| self.inner.keys.slot(name), f)
    }

    /// [`on_node`](Self::on_node) for the node that serves `key`.
    fn on_node_of_key<T>(
        &self,
        key: &str,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.on_slot(|| crate::slot::key_slot(key.as_bytes()), f)
    }

    fn on_slot<T>(
        &self,
        slot: impl FnOnce() -> u16,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        match &self.inner.target {
            Target::One(node) => {
                // Sentinel: a request that failed because the master was demoted or
                // went away goes once to the master the sentinels name now (a holder's
                // release during a failover, instead of a lock left to its lease).
                let generation = node.endpoint.generation();
                match f(node) {
                    Err(e)
                        if e.is_transient()
                            && node
                                .endpoint
                                .moved_since(generation, self.inner.options.timeouts()) =>
                    {
                        f(node)
                    }
                    other => other,
                }
            }
            Target::Cluster(cluster) => cluster.on_slot(slot(), f),
        }
    }

    fn lease(&self, start: Instant, ttl: Duration, fence: u64) -> Option<Lease> {
        let valid_until = start + ttl.checked_sub(self.inner.options.drift(ttl))?;
        if valid_until <= Instant::now() {
            return None;
        }
        let lease = Lease::new(valid_until);
        Some(if self.inner.options.fencing && fence > 0 {
            lease.with_fence(FencingToken::new(fence))
        } else {
            lease
        })
    }
}

impl RedisBackend {
    /// The node that serves `name` now.
    fn node_of(&self, name: &LockName) -> Result<Arc<Node>, BackendError> {
        match &self.inner.target {
            Target::One(node) => Ok(node.clone()),
            Target::Cluster(cluster) => cluster.node(self.inner.keys.slot(name)),
        }
    }

    /// What one renewal of a batch came to, from its reply (`acked`: how many replicas
    /// acknowledged the batch, when `WAIT` was asked for). A renewal the node refused
    /// with a cluster redirection (its slot moved) is sent again on its own, where the
    /// cluster says.
    fn renewal(
        &self,
        node: &Node,
        r: &Renewal<'_>,
        value: redis::Value,
        acked: Option<u32>,
        start: Instant,
    ) -> Result<Option<Lease>, BackendError> {
        if Redirect::of_value(&value).is_some() {
            return self.extend(r.name, r.owner, r.ttl);
        }
        let ok = value
            .extract_error()
            .map_err(|e| node.endpoint.error(&e))
            .and_then(|v| node.parse_flag(v))?;
        if let Some(w) = self.inner.options.replica_wait
            && ok
            && acked.unwrap_or(0) < w.replicas
        {
            // Renewed on the master only: a failover now could bring back the previous
            // lease, which the front keeps until a renewal replicates.
            return Err(node.not_replicated(w, acked, "the renewal"));
        }
        // The front keeps the acquisition's fencing token.
        Ok(ok.then(|| self.lease(start, r.ttl, 0)).flatten())
    }

    /// One acquisition attempt on `node`.
    fn acquire_on(
        &self,
        node: &Node,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let start = Instant::now();
        let fencing = if self.inner.options.fencing {
            Fencing::Draw
        } else {
            Fencing::Off
        };
        let wait = self.inner.options.replica_wait;
        let (answer, acked) = node.acquire(name, owner, ttl, fencing, wait)?;
        if let (NodeAcquire::Acquired { .. }, Some(w)) = (answer, wait)
            && acked.unwrap_or(0) < w.replicas
        {
            // Not on enough replicas: a failover could lose it. Undone, as if never
            // granted (if the release fails too, the key ends with its lease).
            let _ = node.release(name, owner, rand::random());
            return Err(node.not_replicated(w, acked, "the grant"));
        }
        match answer {
            NodeAcquire::Acquired { fence } => match self.lease(start, ttl, fence) {
                Some(lease) => Ok(Acquire::Acquired(lease)),
                None => {
                    let _ = node.release(name, owner, rand::random());
                    Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "{}: acquiring took {:?}, more than the lease's validity",
                            node.endpoint,
                            start.elapsed()
                        ),
                    ))
                }
            },
            NodeAcquire::Held { remaining } => Ok(Acquire::Held {
                retry_after: Some(remaining),
            }),
        }
    }
}

impl LockBackend for RedisBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.on_node(name, |node| self.acquire_on(node, name, owner, ttl))
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.on_node(name, |node| {
            let start = Instant::now();
            let wait = self.inner.options.replica_wait;
            let (extended, acked) = node.extend(name, owner, ttl, wait)?;
            if !extended {
                return Ok(None);
            }
            // Renewed on the master only: a failover now could bring back the previous
            // lease, which the front keeps until a renewal replicates.
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the renewal"));
            }
            // The front keeps the acquisition's fencing token.
            Ok(self.lease(start, ttl, 0))
        })
    }

    /// Each node's extensions go pipelined in one write (followed by `WAIT` when asked
    /// for), to every node at once through the fan-out: a round costs one round trip,
    /// whatever the number of holds and (in a cluster) of masters, and a stopped master
    /// delays nobody else's renewals: they are applied on the other masters at once, and
    /// the round ends when every node answered or after a quarter of the shortest lease
    /// (at most the request deadline). A node that did not answer by then fails its
    /// renewals with `Timeout`; its late replies go to the drainer, and while they are
    /// outstanding the node counts as busy.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
        let mut out: Vec<Option<Result<Option<Lease>, BackendError>>> =
            renewals.iter().map(|_| None).collect();
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, r) in renewals.iter().enumerate() {
            match self.node_of(r.name) {
                Ok(node) => match nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
                    Some(g) => groups[g].push(i),
                    None => {
                        nodes.push(node);
                        groups.push(vec![i]);
                    }
                },
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let wait = self.inner.options.replica_wait;
        let start = Instant::now();
        let options = &self.inner.options;
        // A round waits for a node at most a quarter of the shortest lease it renews (and
        // never past the request deadline): a stopped master then fails its own renewals
        // (retried sooner by the watchdog while their leases last) without holding up the
        // next round of every other master's.
        let budget = renewals
            .iter()
            .map(|r| r.ttl / 4)
            .min()
            .unwrap_or_default()
            .min(options.connect_timeout + options.io_timeout);
        let replies = self.inner.fanout.call_all(
            &nodes,
            start + budget,
            None,
            None,
            |g, node| {
                let extends = groups[g].iter().map(|&i| {
                    node.extend_call(renewals[i].name, renewals[i].owner, renewals[i].ttl)
                });
                Call::batch(extends.chain(wait.map(Call::wait)))
            },
            |node, call, reply| node.batch_values(reply, call.len()),
            // Every node's answer is needed: each serves its own holds.
            |_| false,
            Late::Drop,
        );
        for ((node, group), reply) in nodes.iter().zip(&groups).zip(replies.replies) {
            match reply {
                Some(Ok(mut values)) => {
                    let acked = match wait {
                        Some(_) => match values.pop() {
                            Some(redis::Value::Int(n)) => {
                                Some(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
                            }
                            _ => Some(0),
                        },
                        None => None,
                    };
                    for (&i, value) in group.iter().zip(values) {
                        out[i] = Some(self.renewal(node, &renewals[i], value, acked, start));
                    }
                }
                failed => {
                    let e = failed.and_then(Result::err).unwrap_or_else(|| {
                        BackendError::new(
                            BackendErrorKind::Timeout,
                            format!(
                                "{}: no answer to the renewals within {budget:?}",
                                node.endpoint,
                            ),
                        )
                    });
                    for &i in group {
                        out[i] = Some(Err(BackendError::new(e.kind(), e.message().to_owned())));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every renewal has its result"))
            .collect()
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let id = rand::random();
        let released = self.on_node(name, |node| node.release(name, owner, id))?;
        if released {
            self.released_here(name, id);
        }
        Ok(released)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let id = rand::random();
        let released = self.on_node(name, |node| node.force_release(name, id))?;
        if released {
            self.released_here(name, id);
        }
        Ok(released)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let hints = self.inner.hints.as_ref()?;
        hints.watch(self.inner.keys.channel(name))
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.on_node(name, |node| node.inspect(name))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner
            .hints
            .as_ref()
            .is_some_and(|h| h.wake_pending(|| self.inner.keys.channel(name)))
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field(
                "server",
                &match &self.inner.target {
                    Target::One(node) => format!("{}", node.endpoint),
                    Target::Cluster(cluster) => format!("{cluster:?}"),
                },
            )
            .field("prefix", &self.inner.options.prefix)
            .field("fencing", &self.inner.options.fencing)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RedisBackend`]. Created by [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    options: Options,
    sentinel: Option<SentinelSpec>,
    /// A Sentinel-only setter used on a single server's builder: refused by `build`.
    sentinel_only: Option<&'static str>,
    /// Cluster mode: the seed URLs.
    cluster: Option<Vec<String>>,
}

/// What [`RedisBackend::sentinel`] and its setters were given.
struct SentinelSpec {
    master_name: String,
    sentinels: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    db: Option<i64>,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: not shown.
        f.debug_struct("RedisBackendBuilder")
            .field("options", &self.options)
            .field(
                "sentinel_master",
                &self.sentinel.as_ref().map(|s| &s.master_name),
            )
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    option_setters!();

    /// Narrows the failover window: after each acquisition and each renewal, waits
    /// (`WAIT replicas timeout`, on the same connection) until at least `replicas`
    /// replicas acknowledged the write, or `timeout` passed. An acquisition fewer
    /// replicas acknowledged is undone (the key released) and reported as
    /// [`BackendErrorKind::NotReplicated`] (transient: `lock` retries it within the
    /// error budget); a renewal is reported the same way and the guard keeps its previous
    /// lease. Off by default. Redisson has the same check.
    ///
    /// What it buys: a failover that promotes a replica that acknowledged the grant
    /// keeps the lock. What it does not: Redis replication stays asynchronous and `WAIT`
    /// is not a consensus protocol. A failover may still promote a replica that did not
    /// acknowledge (Sentinel and Cluster prefer the most up-to-date replica, but do not
    /// require it), a replica that acknowledged can lose the write in a restart without
    /// `appendfsync always`, and a grant is on the master before `WAIT` answers (another
    /// client can see it then, and it stays there if the release after a refusal fails).
    /// `timeout` must be shorter than `io_timeout`. See the README's "Which deployment
    /// gives which guarantee".
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let backend = dlm_redis::RedisBackend::sentinel("mymaster", &["redis://10.0.0.1:26379"])
    ///     .wait_for_replicas(1, Duration::from_millis(200))
    ///     .build()?;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.options.replica_wait = Some(crate::options::ReplicaWait { replicas, timeout });
        self
    }

    /// Sentinel mode ([`RedisBackend::sentinel`]): the ACL user (if any) and password of
    /// the data nodes. The sentinels' own credentials go in their URLs.
    pub fn master_auth(mut self, username: Option<&str>, password: &str) -> Self {
        if let Some(s) = &mut self.sentinel {
            s.username = username.map(str::to_owned);
            s.password = Some(password.to_owned());
        } else {
            self.sentinel_only.get_or_insert("master_auth");
        }
        self
    }

    /// Sentinel mode ([`RedisBackend::sentinel`]): the database number on the master.
    /// Defaults to 0.
    pub fn master_db(mut self, db: i64) -> Self {
        if let Some(s) = &mut self.sentinel {
            s.db = Some(db);
        } else {
            self.sentinel_only.get_or_insert("master_db");
        }
        self
    }

    /// Builds the backend. No I/O for a single server: the pool connects on first use.
    /// In Sentinel mode, every sentinel is asked for the master once.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL or setting, and in
    /// Sentinel mode for a master name the sentinels do not know, or sentinels that
    /// disagree about the master; [`dlm_core::Error::Backend`] when no sentinel answers.
    pub fn build(self) -> dlm_core::Result<RedisBackend> {
        let keys = Keys::new(self.options.prefix.clone(), self.options.fence_ttl);
        if let Some(seeds) = &self.cluster {
            if let Some(setter) = self.sentinel_only {
                return Err(invalid(dlm_core::InvalidArgument::new(
                    setter,
                    "only for RedisBackend::sentinel: the seed URLs carry the cluster's credentials",
                )));
            }
            let cluster = Cluster::connect(self.options.clone(), seeds)?;
            let hints = self.options.hints_at(vec![cluster.any_node()]);
            return Ok(RedisBackend {
                inner: Arc::new(Inner {
                    target: Target::Cluster(cluster),
                    keys,
                    options: self.options,
                    hints,
                    fanout: Fanout::new(),
                }),
            });
        }
        let node = match &self.sentinel {
            Some(spec) => self.sentinel_node(spec)?,
            None if self.sentinel_only.is_some() => {
                return Err(invalid(dlm_core::InvalidArgument::new(
                    self.sentinel_only.unwrap_or_default(),
                    "only for RedisBackend::sentinel: a server's URL carries its credentials and database",
                )));
            }
            None => self
                .options
                .nodes(std::slice::from_ref(&self.url))
                .map_err(invalid)?
                .pop()
                .expect("one URL gives one node"),
        };
        let hints = self.options.hints(std::slice::from_ref(&node));
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                target: Target::One(Arc::new(node)),
                keys,
                options: self.options,
                hints,
                fanout: Fanout::new(),
            }),
        })
    }

    /// The node of a Sentinel deployment's master; asks every sentinel once.
    fn sentinel_node(&self, spec: &SentinelSpec) -> dlm_core::Result<Node> {
        use redis::IntoConnectionInfo;
        let bad =
            |field: &'static str, why: &str| invalid(dlm_core::InvalidArgument::new(field, why));
        self.options.validate().map_err(invalid)?;
        if spec.master_name.is_empty() || spec.master_name.len() > 256 {
            return Err(bad("master_name", "must be 1 to 256 bytes"));
        }
        if spec.sentinels.is_empty() {
            return Err(bad("sentinels", "no sentinel URL"));
        }
        let (sentinels, tls) = self.options.endpoints(&spec.sentinels).map_err(invalid)?;
        let tls_urls = spec
            .sentinels
            .iter()
            .filter(|u| u.to_ascii_lowercase().starts_with("rediss://"))
            .count();
        if tls_urls != 0 && tls_urls != spec.sentinels.len() {
            return Err(bad(
                "sentinels",
                "some sentinel URLs are rediss:// and some are not: a deployment uses TLS everywhere or nowhere",
            ));
        }
        let mut settings = "redis://127.0.0.1/"
            .into_connection_info()
            .expect("a valid URL")
            .redis_settings()
            .clone()
            .set_db(spec.db.unwrap_or(0));
        if let Some(user) = &spec.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &spec.password {
            settings = settings.set_password(password);
        }
        let template = "redis://127.0.0.1/"
            .into_connection_info()
            .expect("a valid URL")
            .set_redis_settings(settings);
        let discovery = Arc::new(crate::sentinel::Discovery::new(
            spec.master_name.clone(),
            sentinels,
            template,
            tls,
        ));
        discovery.check(self.options.timeouts())?;
        Ok(self.options.node(discovery.endpoint()))
    }
}
