//! Settings shared by both Redis backends, and their builders.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::InvalidArgument;

use crate::conn::{Endpoint, ParsedUrl, Timeouts};
use crate::protocol::ReplicaWait;
use crate::transport::TlsOptions;

/// Settings of a Redis backend, set through its builder.
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

/// How long a slot's fencing stream is kept after the last draw from it.
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
            Some(tls_options.load("the Redis server")?)
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
}

/// A loaded TLS configuration and the options it was loaded from.
pub(crate) type Tls = Option<(Arc<rustls::ClientConfig>, TlsOptions)>;

/// Turns a construction failure into the crate's error type.
pub(crate) fn invalid(e: InvalidArgument) -> dlm_core::Error {
    dlm_core::Error::InvalidArgument(e)
}
