//! `EtcdBackendBuilder`: the settings, checked before any I/O.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::InvalidArgument;
use parking_lot::Mutex;

use crate::backend::EtcdBackend;
use crate::gateway::{Credentials, Gateway, Secret, Timeouts};
use crate::inner::Inner;
use crate::leases::Leases;
use dlm_core::tls::TlsOptions;

/// The constructors: here, beside what they build, so that the backend's own code does
/// not depend on its builder.
impl EtcdBackend {
    /// A backend on the etcd members at `urls` (`http://host:port`, the client URLs; one
    /// is enough, more give failover), with the default settings.
    ///
    /// # Errors
    /// `InvalidArgument` for a URL that is not `http://host:port` (no I/O is done here:
    /// a member that is down fails calls, not construction).
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Self, InvalidArgument> {
        Self::builder(urls).build()
    }

    /// A builder for a backend on the etcd members at `urls`.
    pub fn builder<S: AsRef<str>>(urls: &[S]) -> EtcdBackendBuilder {
        EtcdBackendBuilder {
            urls: urls.iter().map(|u| u.as_ref().to_owned()).collect(),
            prefix: "dlm/".to_owned(),
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            pool_size: 16,
            tls: None,
            user: None,
            password: None,
        }
    }
}

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
    pub(crate) user: Option<String>,
    /// Never shown: its `Debug` is `"***"`.
    pub(crate) password: Option<Secret>,
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
    /// is a transient `Timeout`, and the next request goes to the next member. Each HTTP
    /// request to one member has a deadline of the connect timeout plus this one, for the
    /// whole exchange, on a new connection or on one already open to a member that has
    /// stopped answering (a request that then goes to another member, or first asks for an
    /// auth token, takes one such deadline per request).
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

    /// The etcd user to authenticate as (etcd's `/v3/auth/authenticate`), with
    /// [`password`](Self::password). A URL's userinfo (`http://user:pass@host:port`,
    /// percent-encoded) gives them too; these take precedence over it.
    pub fn user(mut self, name: &str) -> Self {
        self.user = Some(name.to_owned());
        self
    }

    /// The password of [`user`](Self::user). It is never shown: not in `Debug` output,
    /// logs or error messages.
    pub fn password(mut self, secret: &str) -> Self {
        self.password = Some(Secret(secret.to_owned()));
        self
    }

    /// Checks the settings and builds the backend. No I/O.
    ///
    /// # Errors
    /// `InvalidArgument` for no URL, a URL that is not `http://host:port` or
    /// `https://host:port`, the same URL twice, a bad prefix or timeout, TLS options
    /// without an `https://` member, TLS files that cannot be read, URLs naming different
    /// users or passwords, or a user without a password (or a password without a user).
    pub fn build(self) -> Result<EtcdBackend, InvalidArgument> {
        if self.urls.is_empty() {
            return Err(InvalidArgument::new(
                "urls",
                "at least one etcd member URL is needed",
            ));
        }
        let mut members = Vec::new();
        let mut from_urls: Option<(String, Option<String>)> = None;
        for u in &self.urls {
            let (m, userinfo) = parse_member(u)?;
            if members.contains(&m) {
                return Err(InvalidArgument::new("urls", format!("{m} is listed twice")));
            }
            if let Some(info) = userinfo {
                match &from_urls {
                    Some(known) if *known != info => {
                        return Err(InvalidArgument::new(
                            "urls",
                            format!("{m} names another user or password than an earlier URL"),
                        ));
                    }
                    _ => from_urls = Some(info),
                }
            }
            members.push(m);
        }
        let (url_user, url_password) = from_urls.unzip();
        let user = self.user.clone().or(url_user);
        let password = self.password.clone().or(url_password.flatten().map(Secret));
        let credentials = match (user, password) {
            (None, None) => None,
            (Some(user), Some(password)) if !user.is_empty() => {
                Some(Credentials { user, password })
            }
            (Some(_), Some(_)) => {
                return Err(InvalidArgument::new("user", "must not be empty"));
            }
            (Some(_), None) => {
                return Err(InvalidArgument::new(
                    "password",
                    "a user was given without a password",
                ));
            }
            (None, Some(_)) => {
                return Err(InvalidArgument::new(
                    "user",
                    "a password was given without a user (etcd has no default user)",
                ));
            }
        };
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
            Some(
                self.tls
                    .clone()
                    .unwrap_or_default()
                    .load("an etcd member")?,
            )
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
                gateway: Arc::new(Gateway::new(
                    members,
                    timeouts,
                    self.pool_size,
                    tls,
                    credentials,
                )),
                key_prefix,
                drift_factor: self.drift_factor,
                leases: Mutex::new(Leases::default()),
                hints: Mutex::new(None),
            }),
        })
    }
}

/// A user and a password from a URL's userinfo (the password may be absent).
type UserInfo = (String, Option<String>);

/// `http://[user[:password]@]host:port` or `https://...` (a trailing `/` allowed),
/// checked in plain words: the member's URL without its userinfo, and the userinfo
/// percent-decoded. Errors never echo a URL that has userinfo (it may hold a password).
fn parse_member(url: &str) -> Result<(String, Option<UserInfo>), InvalidArgument> {
    let shown = if url.contains('@') {
        "a URL with credentials".to_owned()
    } else {
        format!("{url:?}")
    };
    let bad = |why: &str| InvalidArgument::new("urls", format!("{shown}: {why}"));
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(bad("must start with http:// or https://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (userinfo, rest) = match rest.rsplit_once('@') {
        None => (None, rest),
        Some((info, rest)) => {
            let (user, password) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            let decode = |s: &str| {
                percent_decode(s)
                    .ok_or_else(|| bad("its user or password is badly percent-encoded"))
            };
            let user = decode(user)?;
            if user.is_empty() {
                return Err(bad(
                    "names a password without a user (etcd has no default user)",
                ));
            }
            let password = password.map(decode).transpose()?;
            (Some((user, password)), rest)
        }
    };
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
    Ok((format!("{scheme}://{rest}"), userinfo))
}

/// `%XX` escapes decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_urls_are_checked_in_plain_words() {
        assert_eq!(
            parse_member("http://127.0.0.1:2379/").unwrap(),
            ("http://127.0.0.1:2379".to_owned(), None)
        );
        assert_eq!(
            parse_member("https://etcd-1:2379").unwrap(),
            ("https://etcd-1:2379".to_owned(), None)
        );
        assert_eq!(
            parse_member("http://al%40ice:p%3As@h:1").unwrap(),
            (
                "http://h:1".to_owned(),
                Some(("al@ice".to_owned(), Some("p:s".to_owned())))
            )
        );
        assert_eq!(
            parse_member("http://bob@h:1").unwrap().1,
            Some(("bob".to_owned(), None))
        );
        for (bad, why) in [
            ("127.0.0.1:2379", "must start with http:// or https://"),
            ("ftp://h:2379", "must start with http://"),
            ("http://h", "has no port"),
            ("http://h:0", "bad port"),
            ("http://:secret@h:1", "without a user"),
            ("http://u:%zz@h:1", "percent-encoded"),
            ("http://h:1/v3", "without a path"),
        ] {
            let e = parse_member(bad).unwrap_err();
            assert!(e.reason().contains(why), "{bad}: {e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }

    #[test]
    fn credentials_come_from_the_builder_or_the_urls_and_are_never_shown() {
        let b = EtcdBackend::builder(&["http://h:1"])
            .user("u")
            .password("hunter2");
        assert!(!format!("{b:?}").contains("hunter2"), "{b:?}");
        let backend = b.build().unwrap();
        assert!(!format!("{backend:?}").contains("hunter2"));
        let built = EtcdBackend::new(&["http://u:hunter2@h:1"]).unwrap();
        assert!(!format!("{built:?}").contains("hunter2"));
        assert_eq!(built.members(), ["http://h:1"]);
        // The builder's password completes a URL's user.
        EtcdBackend::builder(&["http://u@h:1"])
            .password("p")
            .build()
            .unwrap();
        for (b, why) in [
            (
                EtcdBackend::builder(&["http://u@h:1"]),
                "without a password",
            ),
            (
                EtcdBackend::builder(&["http://h:1"]).password("hunter2"),
                "without a user",
            ),
            (
                EtcdBackend::builder(&["http://u:hunter2@h:1", "http://v:hunter2@h:2"]),
                "another user",
            ),
        ] {
            let e = b.build().unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }
}
