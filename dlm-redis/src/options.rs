//! Settings shared by both Redis backends, and their builders.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::InvalidArgument;
use scheduled_thread_pool::ScheduledThreadPool;

use crate::conn::{Endpoint, ParsedUrl, Timeouts};
use crate::node::{Keys, Node};
use crate::transport::TlsOptions;

/// Settings of a Redis backend; set through [`RedisBackendBuilder`](crate::RedisBackendBuilder)
/// or [`RedlockBuilder`](crate::RedlockBuilder).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) prefix: String,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) retry_jitter: Duration,
    pub(crate) fencing: bool,
    pub(crate) fence_ttl: Duration,
    pub(crate) hints: bool,
    pub(crate) tls: Option<TlsOptions>,
    /// `WAIT` after each acquisition and renewal (single server, Sentinel, Cluster).
    pub(crate) replica_wait: Option<ReplicaWait>,
}

/// `WAIT replicas timeout` after each write of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// How long a slot's fencing stream is kept after the last acquisition that used it.
pub(crate) const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(24 * 3600);

impl Options {
    pub(crate) fn single() -> Self {
        Options {
            prefix: "dlm".into(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            retry_jitter: Duration::from_millis(20),
            fencing: true,
            fence_ttl: DEFAULT_FENCE_TTL,
            hints: true,
            tls: None,
            replica_wait: None,
        }
    }

    pub(crate) fn redlock() -> Self {
        Options {
            connect_timeout: Duration::from_millis(100),
            io_timeout: Duration::from_millis(100),
            ..Options::single()
        }
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidArgument> {
        let p = &self.prefix;
        if p.is_empty() || p.len() > 64 {
            return Err(InvalidArgument::new("prefix", "must be 1 to 64 bytes"));
        }
        if p.chars().any(|c| c.is_control() || c == '{' || c == '}') {
            return Err(InvalidArgument::new(
                "prefix",
                "must not contain braces or control characters",
            ));
        }
        if self.pool_size == 0 {
            return Err(InvalidArgument::new("pool_size", "must be at least 1"));
        }
        if self.connect_timeout.is_zero() || self.io_timeout.is_zero() {
            return Err(InvalidArgument::new("timeout", "must be positive"));
        }
        if self.fence_ttl < Duration::from_secs(1) {
            return Err(InvalidArgument::new("fence_ttl", "must be at least 1 s"));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(InvalidArgument::new("drift_factor", "must be in [0, 0.5)"));
        }
        if let Some(w) = self.replica_wait {
            if w.replicas == 0 {
                return Err(InvalidArgument::new(
                    "wait_for_replicas",
                    "at least 1 replica (0 waits for nothing)",
                ));
            }
            if w.timeout.is_zero() || w.timeout >= self.io_timeout {
                return Err(InvalidArgument::new(
                    "wait_for_replicas",
                    format!(
                        "the timeout must be positive and shorter than io_timeout ({:?}), which bounds every reply (WAIT 0 would block for ever)",
                        self.io_timeout
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn timeouts(&self) -> Timeouts {
        Timeouts {
            connect: self.connect_timeout,
            io: self.io_timeout,
        }
    }

    /// The clock-drift allowance for a lease of `ttl`: `ttl * drift_factor + 2 ms`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// The release-hint listeners for `nodes` (started on the first wait), if enabled.
    pub(crate) fn hints(&self, nodes: &[Node]) -> Option<crate::hints::Hints> {
        self.hints_at(nodes.iter().map(|n| n.endpoint.clone()).collect())
    }

    /// The release-hint listeners for `endpoints` (one each), if enabled.
    pub(crate) fn hints_at(&self, endpoints: Vec<Endpoint>) -> Option<crate::hints::Hints> {
        self.hints
            .then(|| crate::hints::Hints::new(&self.prefix, endpoints, self.timeouts()))
    }

    pub(crate) fn nodes(&self, urls: &[String]) -> Result<Vec<Node>, InvalidArgument> {
        self.validate()?;
        Ok(self
            .endpoints(urls)?
            .0
            .into_iter()
            .map(|e| self.node(e))
            .collect())
    }

    /// The endpoints of `urls`, and the TLS configuration (loaded once for every
    /// `rediss://` URL) with its options, if any URL asks for TLS.
    pub(crate) fn endpoints(
        &self,
        urls: &[String],
    ) -> Result<(Vec<Endpoint>, Tls), InvalidArgument> {
        let parsed = urls
            .iter()
            .map(|u| ParsedUrl::parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        let tls_options = self.tls.clone().unwrap_or_default();
        let config = if parsed.iter().any(|p| p.tls) {
            Some(tls_options.load()?)
        } else if self.tls.is_some() {
            return Err(InvalidArgument::new(
                "tls",
                "TLS options were given but no URL is rediss://: use rediss://host:port",
            ));
        } else {
            None
        };
        let endpoints = parsed
            .into_iter()
            .map(|p| Endpoint::new(p, config.as_ref().map(|c| (c, &tls_options))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((endpoints, config.map(|c| (c, tls_options))))
    }

    /// A node for `endpoint`, with its own pool.
    pub(crate) fn node(&self, endpoint: Endpoint) -> Node {
        // One maintenance thread per server: r2d2 opens new connections on it, and a
        // paused server (handshake done by the kernel, then silence) holds it for a whole
        // connect timeout, which must not stall the other servers' pools.
        let threads = Arc::new(
            ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("dlm-redis-pool")
                // The pool's only timed job is the idle-connection reaper: when the pool is
                // gone, stop at once instead of waiting for its next run.
                .on_drop_behavior(
                    scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                )
                .build(),
        );
        Node::new(
            endpoint,
            Keys::new(self.prefix.clone(), self.fence_ttl),
            self.timeouts(),
            self.pool_size,
            threads,
        )
    }
}

/// A loaded TLS configuration and the options it was loaded from.
pub(crate) type Tls = Option<(Arc<rustls::ClientConfig>, TlsOptions)>;

/// Turns a construction failure into the crate's error type.
pub(crate) fn invalid(e: InvalidArgument) -> dlm_core::Error {
    dlm_core::Error::InvalidArgument(e)
}

/// The setters both builders share.
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
        /// clock does not go back. Single instance: the draw is in one `MULTI`/`EXEC`
        /// transaction with the `SET NX` that takes the lock (tokens increase, skipping the
        /// IDs of attempts that found the lock taken). Redlock: every node draws with the
        /// `SET`, and a second round commits `max(draws of the acquired quorum) + 1` to
        /// those nodes (one more request per node). Defaults to `true`.
        pub fn fencing(mut self, on: bool) -> Self {
            self.options.fencing = on;
            self
        }

        /// How long a fencing stream is kept after the last acquisition that used it
        /// (each acquisition refreshes it). There is one stream per cluster slot whatever
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
        pub fn tls(mut self, tls: crate::TlsOptions) -> Self {
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
pub(crate) use option_setters;
