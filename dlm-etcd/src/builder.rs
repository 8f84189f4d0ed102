//! `EtcdBackendBuilder`: the settings, checked before any I/O.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::InvalidArgument;
use parking_lot::Mutex;

use crate::backend::{EtcdBackend, Inner};
use crate::gateway::{Gateway, Timeouts};
use crate::leases::Leases;

/// Settings of an [`EtcdBackend`]; [`build`](EtcdBackendBuilder::build) checks them.
#[derive(Clone, Debug)]
pub struct EtcdBackendBuilder {
    pub(crate) urls: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) pool_size: usize,
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

    /// Checks the settings and builds the backend. No I/O.
    ///
    /// # Errors
    /// `InvalidArgument` for no URL, a URL that is not `http://host:port` (`https://` is
    /// not supported yet), the same URL twice, a bad prefix or timeout.
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
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            io: self.io_timeout,
        };
        let mut key_prefix = self.prefix.into_bytes();
        key_prefix.extend_from_slice(b"lock/");
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                gateway: Gateway::new(members, timeouts, self.pool_size),
                key_prefix,
                drift_factor: self.drift_factor,
                leases: Mutex::new(Leases::default()),
                watcher: Mutex::new(None),
            }),
        })
    }
}

/// `http://host:port` (a trailing `/` allowed), checked in plain words.
fn parse_member(url: &str) -> Result<String, InvalidArgument> {
    let bad = |why: &str| InvalidArgument::new("urls", format!("{url:?}: {why}"));
    let rest = if let Some(rest) = url.strip_prefix("http://") {
        rest
    } else if url.starts_with("https://") {
        return Err(bad(
            "https:// is not supported yet by dlm-etcd (use http://)",
        ));
    } else {
        return Err(bad("must start with http://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    if rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(bad("must be http://host:port, without a path"));
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("has a bad port"))?;
    Ok(format!("http://{rest}"))
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
        for (bad, why) in [
            ("127.0.0.1:2379", "must start with http://"),
            ("https://h:2379", "https:// is not supported yet"),
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
