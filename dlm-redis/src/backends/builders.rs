//! One builder per deployment, each with the setters that apply to it: the settings
//! every backend has ([`option_setters`]), `wait_for_replicas` for the single-master
//! deployments, and Sentinel's data-node credentials.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::BackendErrorKind;

use super::redis::RedisBackend;
use super::redlock::{Redlock, quorum};
use crate::node::Node;
use crate::options::{Options, invalid};
use crate::protocol::ReplicaWait;
use crate::topology::{Cluster, MasterAuth, Sentinel, Topology};

/// The setters every builder has.
macro_rules! option_setters {
    () => {
        /// The key prefix: a lock called `n` lives at `prefix:{n}`, its release channel is
        /// `prefix:{n}:released`, and its fencing stream is `prefix:fence:{tag}` (one per
        /// cluster slot). 1 to 64 bytes, no braces. Defaults to `dlm`.
        pub fn prefix(mut self, prefix: &str) -> Self {
            self.options.prefix = prefix.to_owned();
            self
        }

        /// The most connections kept per server. Defaults to 8.
        pub fn pool_size(mut self, size: u32) -> Self {
            self.options.pool_size = size;
            self
        }

        /// How long connecting (and waiting for a pooled connection) may take.
        pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.options.connect_timeout = timeout;
            self
        }

        /// The read and write timeout of every request.
        pub fn io_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.options.io_timeout = timeout;
            self
        }

        /// The clock-drift allowance as a fraction of the lease: validity =
        /// lease - elapsed - (lease x factor + 2 ms). Must be in `[0, 0.5)`. Defaults to 0.01.
        pub fn drift_factor(mut self, factor: f64) -> Self {
            self.options.drift_factor = factor;
            self
        }

        /// Whether acquisitions carry fencing tokens. A token is an ID drawn from a Redis
        /// stream (`XADD ... *`), one stream per cluster slot (`prefix:fence:{tag}`):
        /// larger than every ID the stream gave before, and seeded from the server's clock
        /// when the stream is new, so tokens keep increasing when the stream is lost (a
        /// restart without persistence, an eviction, its expiry) as long as the server's
        /// clock does not go back. A token is drawn on the first
        /// [`fencing_token`](dlm_core::LockGuard::fencing_token) of a hold, by a script that
        /// checks that the lock is still ours (an acquisition whose token is never read
        /// costs what an unfenced one does). Redlock: every node takes the client's
        /// proposal or draws, and when a quorum did not take it, a second round commits one
        /// above the quorum's streams. Off, `fencing_token()` is
        /// [`Unsupported`](dlm_core::BackendErrorKind::Unsupported). Defaults to `true`.
        pub fn fencing(mut self, on: bool) -> Self {
            self.options.fencing = on;
            self
        }

        /// How long a fencing stream is kept after the last draw from it (each draw
        /// refreshes it). Its expiry loses the stream on every Redlock node at once: tokens
        /// then rest on node clock offsets below `fence_ttl` (the README's "How tokens are
        /// made"). There is one stream per cluster slot whatever
        /// the number of lock names: at most 16,384 keys of about 400 bytes per prefix.
        /// A stream that expired is seeded again from the server's clock. At least 1 s.
        /// Defaults to 24 h.
        pub fn fence_ttl(mut self, ttl: std::time::Duration) -> Self {
            self.options.fence_ttl = ttl;
            self
        }

        /// Whether waiters are woken by release messages (one pub/sub connection and
        /// listener thread per server, started by the first wait) instead of polling.
        /// Without them, a waiter looks again when the holder's lease ends or after its
        /// backoff. Defaults to `true`.
        pub fn release_hints(mut self, on: bool) -> Self {
            self.options.hints = on;
            self
        }

        /// How to connect to `rediss://` servers: the CA to trust (default: the system's
        /// roots), a client certificate for mutual TLS, the name to verify. TLS itself is
        /// chosen by the URL (`rediss://`); options given with no `rediss://` URL are an
        /// error. Every connection to such a server (locks, release hints) uses TLS.
        pub fn tls(mut self, tls: crate::transport::TlsOptions) -> Self {
            self.options.tls = Some(tls);
            self
        }

        /// The largest random delay suggested to a waiter after an attempt that found the
        /// lock free but could not take it (a split vote), so that contenders spread out.
        /// Defaults to 20 ms.
        pub fn retry_jitter(mut self, jitter: std::time::Duration) -> Self {
            self.options.retry_jitter = jitter;
            self
        }
    };
}

impl RedisBackend {
    /// A builder for a backend on the server at `url`: `redis://[user:pass@]host:port[/db]`
    /// or `redis+unix:///path/to/socket`.
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder::new(url)
    }

    /// A backend on a Redis Cluster with the default settings, given one or more of its
    /// nodes (`redis://[user:pass@]host:port`, `rediss://` for TLS; every node is reached
    /// with the seeds' credentials and TLS settings). Every seed is asked for the cluster's slot
    /// map; a server without cluster mode and seeds of two clusters are refused.
    /// [`cluster_builder`](Self::cluster_builder) sets more.
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
    /// let backend = RedisBackend::cluster(&["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])?;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ClusterBuilder::build`].
    pub fn cluster<S: AsRef<str>>(seeds: &[S]) -> dlm_core::Result<Self> {
        RedisBackend::cluster_builder(seeds).build()
    }

    /// A builder for a backend on a Redis Cluster (see [`cluster`](Self::cluster)).
    pub fn cluster_builder<S: AsRef<str>>(seeds: &[S]) -> ClusterBuilder {
        ClusterBuilder::new(seeds)
    }

    /// A builder for a backend on the master of a Redis Sentinel deployment: the server
    /// that the `sentinels` (URLs `redis://[user:pass@]host:port`, with the sentinels' own
    /// credentials; `rediss://` when the deployment uses TLS, for the sentinels and the
    /// data nodes alike) name as the master of `master_name`. The data nodes' credentials
    /// and database are [`master_auth`](SentinelBuilder::master_auth) and
    /// [`master_db`](SentinelBuilder::master_db).
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
    /// let backend = RedisBackend::sentinel_builder(
    ///     "mymaster",
    ///     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    /// )
    /// .master_auth(None, "data-password")
    /// .build()?;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn sentinel_builder<S: AsRef<str>>(master_name: &str, sentinels: &[S]) -> SentinelBuilder {
        SentinelBuilder::new(master_name, sentinels)
    }

    /// A backend on the master of a Redis Sentinel deployment with the default settings
    /// (data nodes without a password; see [`sentinel_builder`](Self::sentinel_builder)).
    ///
    /// # Errors
    /// See [`SentinelBuilder::build`].
    pub fn sentinel<S: AsRef<str>>(master_name: &str, sentinels: &[S]) -> dlm_core::Result<Self> {
        RedisBackend::sentinel_builder(master_name, sentinels).build()
    }

    /// The backend for `url` with the default settings. No I/O happens here: a server that
    /// is down fails the calls that need it, not the construction.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL.
    pub fn new(url: &str) -> dlm_core::Result<Self> {
        RedisBackend::builder(url).build()
    }
}

impl Redlock {
    /// A builder for a Redlock over the masters at `urls` (see
    /// [`RedisBackend::builder`](crate::RedisBackend::builder) for the URL form).
    pub fn builder<S: AsRef<str>>(urls: &[S]) -> RedlockBuilder {
        RedlockBuilder::new(urls)
    }

    /// A Redlock over `urls` with the default settings.
    ///
    /// # Errors
    /// See [`RedlockBuilder::build`].
    pub fn new<S: AsRef<str>>(urls: &[S]) -> dlm_core::Result<Self> {
        Redlock::builder(urls).build()
    }
}

/// `wait_for_replicas`, on the builders of the single-master deployments.
macro_rules! replica_wait_setter {
    () => {
        /// Narrows the failover window: after each acquisition and each renewal, waits
        /// (`WAIT replicas timeout`, on the same connection) until at least `replicas`
        /// replicas acknowledged the write, or `timeout` passed. An acquisition fewer
        /// replicas acknowledged is undone (the key released) and reported as
        /// [`BackendErrorKind::NotReplicated`](dlm_core::BackendErrorKind::NotReplicated) (transient: `lock` retries it within the
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
        /// let backend = dlm_redis::RedisBackend::sentinel_builder("mymaster", &["redis://10.0.0.1:26379"])
        ///     .wait_for_replicas(1, Duration::from_millis(200))
        ///     .build()?;
        /// # Ok::<(), dlm_core::Error>(())
        /// ```
        pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
            self.options.replica_wait = Some(ReplicaWait { replicas, timeout });
            self
        }
    };
}

/// Configures a [`RedisBackend`] on one server. Created by [`RedisBackend::builder`].
///
/// The URL carries the server's credentials and database, so Sentinel's data-node
/// settings do not exist here:
///
/// ```compile_fail
/// dlm_redis::RedisBackend::builder("redis://10.0.0.1:6379").master_db(5);
/// ```
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    options: Options,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: not shown.
        f.debug_struct("RedisBackendBuilder")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    pub(crate) fn new(url: &str) -> Self {
        RedisBackendBuilder {
            url: url.to_owned(),
            options: Options::single(),
        }
    }

    option_setters!();
    replica_wait_setter!();

    /// Builds the backend. No I/O: the pool connects on first use.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL or setting.
    pub fn build(self) -> dlm_core::Result<RedisBackend> {
        let node = Node::for_urls(&self.options, std::slice::from_ref(&self.url))
            .map_err(invalid)?
            .pop()
            .expect("one URL gives one node");
        Ok(RedisBackend::assemble(
            Topology::One(Arc::new(node)),
            self.options,
        ))
    }
}

/// Configures a [`RedisBackend`] on the master of a Redis Sentinel deployment. Created by
/// [`RedisBackend::sentinel_builder`].
#[must_use]
pub struct SentinelBuilder {
    master_name: String,
    sentinels: Vec<String>,
    master: MasterAuth,
    options: Options,
}

impl fmt::Debug for SentinelBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URLs and the password are not shown.
        f.debug_struct("SentinelBuilder")
            .field("master_name", &self.master_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SentinelBuilder {
    pub(crate) fn new<S: AsRef<str>>(master_name: &str, sentinels: &[S]) -> Self {
        SentinelBuilder {
            master_name: master_name.to_owned(),
            sentinels: sentinels.iter().map(|s| s.as_ref().to_owned()).collect(),
            master: MasterAuth::default(),
            options: Options::single(),
        }
    }

    option_setters!();
    replica_wait_setter!();

    /// The ACL user (if any) and password of the data nodes. The sentinels' own
    /// credentials go in their URLs.
    pub fn master_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.master.username = username.map(str::to_owned);
        self.master.password = Some(password.to_owned());
        self
    }

    /// The database number on the master. Defaults to 0.
    pub fn master_db(mut self, db: i64) -> Self {
        self.master.db = Some(db);
        self
    }

    /// Builds the backend: every sentinel is asked for the master once.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL or setting, a master name
    /// the sentinels do not know, or sentinels that disagree about the master;
    /// [`dlm_core::Error::Backend`] when no sentinel answers.
    pub fn build(self) -> dlm_core::Result<RedisBackend> {
        let sentinel = Sentinel::connect(
            &self.master_name,
            &self.sentinels,
            &self.master,
            &self.options,
        )?;
        Ok(RedisBackend::assemble(
            Topology::Sentinel(sentinel),
            self.options,
        ))
    }
}

/// Configures a [`RedisBackend`] on a Redis Cluster. Created by
/// [`RedisBackend::cluster_builder`].
///
/// Only the settings that apply to a cluster exist here: the seed URLs carry the nodes'
/// credentials, so Sentinel's data-node settings do not compile.
///
/// ```compile_fail
/// dlm_redis::RedisBackend::cluster_builder(&["redis://10.0.0.1:6379"]).master_auth(None, "pw");
/// ```
#[must_use]
pub struct ClusterBuilder {
    seeds: Vec<String>,
    options: Options,
}

impl fmt::Debug for ClusterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The seed URLs may hold a password: not shown.
        f.debug_struct("ClusterBuilder")
            .field("seeds", &self.seeds.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ClusterBuilder {
    pub(crate) fn new<S: AsRef<str>>(seeds: &[S]) -> Self {
        ClusterBuilder {
            seeds: seeds.iter().map(|s| s.as_ref().to_owned()).collect(),
            options: Options::single(),
        }
    }

    option_setters!();
    replica_wait_setter!();

    /// Builds the backend: every seed is asked for the cluster's slot map.
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for a malformed URL or setting, a server
    /// without cluster mode, seeds of two clusters; [`dlm_core::Error::Backend`] when no
    /// seed answers.
    pub fn build(self) -> dlm_core::Result<RedisBackend> {
        let cluster = Cluster::connect(self.options.clone(), &self.seeds)?;
        Ok(RedisBackend::assemble(
            Topology::Cluster(cluster),
            self.options,
        ))
    }
}

/// Configures a [`Redlock`]. Created by [`Redlock::builder`].
#[must_use]
pub struct RedlockBuilder {
    urls: Vec<String>,
    options: Options,
    verify_distinct: bool,
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold passwords: only their number is shown.
        f.debug_struct("RedlockBuilder")
            .field("nodes", &self.urls.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedlockBuilder {
    pub(crate) fn new<S: AsRef<str>>(urls: &[S]) -> Self {
        RedlockBuilder {
            urls: urls.iter().map(|u| u.as_ref().to_owned()).collect(),
            options: Options::redlock(),
            verify_distinct: true,
        }
    }

    option_setters!();

    /// Whether `build` asks every reachable node for its `run_id` to reject one server
    /// listed twice under different addresses (one server must never count twice toward
    /// a quorum). Nodes that are down are not checked. Defaults to `true`.
    pub fn verify_distinct(mut self, on: bool) -> Self {
        self.verify_distinct = on;
        self
    }

    /// Builds the Redlock and starts its worker threads (`pool_size` per node).
    ///
    /// # Errors
    /// [`dlm_core::Error::InvalidArgument`] for no nodes, a malformed URL or setting, or
    /// one server listed twice (the same resolved address, or the same `run_id`).
    pub fn build(self) -> dlm_core::Result<Redlock> {
        if self.urls.is_empty() {
            return Err(invalid(dlm_core::InvalidArgument::new(
                "urls",
                "Redlock needs at least one node",
            )));
        }
        let nodes = Node::for_urls(&self.options, &self.urls).map_err(invalid)?;
        check_distinct_addresses(&nodes).map_err(invalid)?;
        if self.verify_distinct {
            check_distinct_servers(&nodes)?;
        }
        let n = nodes.len();
        if n % 2 == 0 {
            log::warn!(
                "Redlock over an even number of nodes ({n}) tolerates {} failed node(s), no more than {} nodes would: use an odd number",
                n - quorum(n),
                n - 1
            );
        }
        Ok(Redlock::assemble(nodes, self.options))
    }
}

fn check_distinct_addresses(nodes: &[Node]) -> Result<(), dlm_core::InvalidArgument> {
    let addrs: Vec<Vec<String>> = nodes.iter().map(|n| n.endpoint.socket_addrs()).collect();
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            if let Some(a) = addrs[i].iter().find(|a| addrs[j].contains(a)) {
                return Err(dlm_core::InvalidArgument::new(
                    "urls",
                    format!("nodes {i} and {j} are the same server ({a})"),
                ));
            }
        }
    }
    Ok(())
}

fn check_distinct_servers(nodes: &[Node]) -> dlm_core::Result<()> {
    let ids: Vec<Option<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes.iter().map(|n| s.spawn(move || n.run_id())).collect();
        handles
            .into_iter()
            .zip(nodes)
            .map(|(h, n)| match h.join() {
                Ok(Ok(id)) => Some(id),
                Ok(Err(e)) if e.kind() == BackendErrorKind::Auth => {
                    log::warn!("{}: cannot verify the node: {e}", n.endpoint);
                    None
                }
                Ok(Err(e)) => {
                    log::info!("{}: not reachable now, not verified: {e}", n.endpoint);
                    None
                }
                Err(_) => None,
            })
            .collect()
    });
    for i in 0..ids.len() {
        for j in i + 1..ids.len() {
            if ids[i].is_some() && ids[i] == ids[j] {
                return Err(invalid(dlm_core::InvalidArgument::new(
                    "urls",
                    format!("nodes {i} and {j} are the same server (same run_id)"),
                )));
            }
        }
    }
    Ok(())
}
