//! `EtcdBackendBuilder`: the settings, checked before any I/O.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::InvalidArgument;
use parking_lot::Mutex;

use crate::backend::{EtcdBackend, Inner};
use crate::gateway::{Gateway, Timeouts};
use crate::leases::Leases;
use crate::tls::TlsOptions;

/// Settings of an [`EtcdBackend`]; [`build`](EtcdBackendBuilder::build) checks them.
#[derive(Clone, Debug)]
pub struct EtcdBackendBuilder {
    pub(crate) urls: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) pool_size: usize,
    pub(crate) tls: Option<TlsOptions>,
}

impl EtcdBackendBuilder {
    /// The prefix of every key (default `dlm/`; a lock's key is `{prefix}lock/{name}`).
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How long connecting to a member may take (default 1 s). A member that cannot be
    /// reached is skipped for the next one.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a request may wait for its reply (default 1 s); a request that times out
    /// is a transient `Timeout`, and the next request goes to the next member.
    pub fn io_timeout(mut self, t: Duration) -> Self {
        self.io_timeout = t;
        self
    }

    /// The clock-drift allowance as a fraction of the lease (default 0.01): a lease's
    /// validity is `lease - (lease x factor + 2 ms)` from before the request was sent.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Idle connections kept per member (default 16).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// How to reach `https://` members: the CA to trust, a client certificate for mutual
    /// TLS, the name to verify (see [`TlsOptions`]). Without it, an `https://` member's
    /// certificate is checked against the system's roots and the URL's host.
    pub fn tls(mut self, options: TlsOptions) -> Self {
        self.tls = Some(options);
        self
    }

    /// Checks the settings and builds the backend. No I/O.
    ///
    /// # Errors
    /// `InvalidArgument` for no URL, a URL that is not `http://host:port` or
    /// `https://host:port`, the same URL twice, a bad prefix or timeout, TLS options
    /// without an `https://` member, or TLS files that cannot be read.
    pub fn build(self) -> Result<EtcdBackend, InvalidArgument> {
        if self.urls.is_empty() {
            return Err(InvalidArgument::new(
                "urls",
                "at least one etcd member URL is needed",
            ));
        }
        let mut members = Vec::new();
        for u in &self.urls {
            let m = parse_member(u)?;
            if members.contains(&m) {
                return Err(InvalidArgument::new("urls", format!("{m} is listed twice")));
            }
            members.push(m);
        }
        if self.prefix.is_empty()
            || self.prefix.len() > 64
            || self.prefix.chars().any(char::is_control)
        {
            return Err(InvalidArgument::new(
                "prefix",
                "must be 1 to 64 bytes without control characters",
            ));
        }
        if self.connect_timeout.is_zero() || self.io_timeout.is_zero() {
            return Err(InvalidArgument::new("timeout", "must be positive"));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(InvalidArgument::new("drift_factor", "must be in [0, 0.5)"));
        }
        if self.pool_size == 0 {
            return Err(InvalidArgument::new("pool_size", "must be at least 1"));
        }
        let tls = if members.iter().any(|m| m.starts_with("https://")) {
            Some(self.tls.clone().unwrap_or_default().load()?)
        } else if self.tls.is_some() {
            return Err(InvalidArgument::new(
                "tls",
                "TLS options were given but no URL is https://: use https://host:port",
            ));
        } else {
            None
        };
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            io: self.io_timeout,
        };
        let mut key_prefix = self.prefix.into_bytes();
        key_prefix.extend_from_slice(b"lock/");
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                gateway: Gateway::new(members, timeouts, self.pool_size, tls),
                key_prefix,
                drift_factor: self.drift_factor,
                leases: Mutex::new(Leases::default()),
                watcher: Mutex::new(None),
            }),
        })
    }
}

/// `http://host:port` or `https://host:port` (a trailing `/` allowed), checked in plain
/// words.
fn parse_member(url: &str) -> Result<String, InvalidArgument> {
    let bad = |why: &str| InvalidArgument::new("urls", format!("{url:?}: {why}"));
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(bad("must start with http:// or https://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    if rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(bad("must be http(s)://host:port, without a path"));
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("has a bad port"))?;
    Ok(format!("{scheme}://{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_urls_are_checked_in_plain_words() {
        assert_eq!(
            parse_member("http://127.0.0.1:2379/").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            parse_member("https://etcd-1:2379").unwrap(),
            "https://etcd-1:2379"
        );
        for (bad, why) in [
            ("127.0.0.1:2379", "must start with http:// or https://"),
            ("ftp://h:2379", "must start with http://"),
            ("http://h", "has no port"),
            ("http://h:0", "bad port"),
            ("http://u:p@h:1", "credentials"),
            ("http://h:1/v3", "without a path"),
        ] {
            let e = parse_member(bad).unwrap_err();
            assert!(e.reason().contains(why), "{bad}: {e}");
        }
    }
}
