//! `PostgresBackendBuilder`: the settings, checked before any I/O.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlm_core::InvalidArgument;
use dlm_core::tls::TlsOptions;
use tokio_postgres::Config;
use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::backend::PostgresBackend;
use crate::conn::Connector;
use crate::resolved::Resolved;

/// The longest schema name: the notification channel (`dlm_` and the schema's name) must
/// fit PostgreSQL's 63-byte identifiers.
const MAX_SCHEMA_LEN: usize = 40;

/// The constructors: here, beside what they build.
impl PostgresBackend {
    /// A backend on the PostgreSQL server at `url`, with the default settings.
    ///
    /// `url` is a libpq connection URI: `postgresql://user:password@host:port/database`,
    /// with several `host:port` pairs for a primary and its standbys
    /// (`postgresql://u@db1:5432,db2:5432/app`: dlm connects to the one that accepts
    /// writes, `target_session_attrs=read-write`, so it follows a failover), and options
    /// such as `sslmode=require` and `connect_timeout=5`.
    ///
    /// # Errors
    /// `InvalidArgument` for a URL that is not a PostgreSQL URL, or a bad setting. No I/O
    /// is done here: a server that is down, a wrong password or a missing database fail
    /// the first call, with their own error kinds.
    pub fn new(url: &str) -> Result<Self, InvalidArgument> {
        Self::builder(url).build()
    }

    /// A builder for a backend on the PostgreSQL server at `url` (see [`new`](Self::new)).
    pub fn builder(url: &str) -> PostgresBackendBuilder {
        PostgresBackendBuilder {
            url: url.to_owned(),
            schema: "dlm".to_owned(),
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            pool_size: 10,
            tls: None,
            password: None,
            password_file: None,
            listen_url: None,
        }
    }
}

/// A password, never shown (`Debug` prints `***`).
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Settings of a [`PostgresBackend`]; [`build`](PostgresBackendBuilder::build) checks them.
#[derive(Clone, Debug)]
pub struct PostgresBackendBuilder {
    url: String,
    schema: String,
    connect_timeout: Duration,
    io_timeout: Duration,
    drift_factor: f64,
    pool_size: usize,
    tls: Option<TlsOptions>,
    password: Option<Secret>,
    password_file: Option<PathBuf>,
    listen_url: Option<String>,
}

impl PostgresBackendBuilder {
    /// The schema dlm keeps its tables, sequence and functions in (default `dlm`; lower-case
    /// letters, digits and `_`, at most 40 bytes). dlm creates it at first use when the
    /// role may; otherwise an administrator creates it (see the crate's documentation).
    pub fn schema(mut self, schema: &str) -> Self {
        self.schema = schema.to_owned();
        self
    }

    /// How long opening a connection may take, every host of the URL in turn (default
    /// 2 s). A URL's `connect_timeout` is the limit per host; this one bounds the whole.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a request may wait for its reply (default 1 s). A request that times
    /// out is a transient `Timeout`, and its connection is closed (its reply may still
    /// come).
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

    /// The most connections open at once (default 10), beside the one that listens for
    /// releases. A thread waiting for a lock holds none while it waits: connections are
    /// lent for one request at a time.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// How to use TLS: the CA to trust, a client certificate, the name to verify (see
    /// [`TlsOptions`]). With it, connections require TLS (`sslmode=require`, with the
    /// certificate verified). Without it, TLS is used only with `sslmode=require` in the
    /// URL, verified against the system's roots.
    pub fn tls(mut self, options: TlsOptions) -> Self {
        self.tls = Some(options);
        self
    }

    /// The password (it is never shown: not in `Debug` output, logs or error messages).
    /// It takes precedence over [`password_file`](Self::password_file), the URL's and
    /// `$PGPASSWORD`.
    pub fn password(mut self, secret: &str) -> Self {
        self.password = Some(Secret(secret.to_owned()));
        self
    }

    /// Reads the password from this file (its first line) when the backend is built.
    /// It takes precedence over the URL's and `$PGPASSWORD`.
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password_file = Some(path.into());
        self
    }

    /// Where to `LISTEN` for release hints, when it is not `url`: behind a connection
    /// pooler in transaction mode (PgBouncer), a `LISTEN` through the pooler hears
    /// nothing, so give the server's own address here (same user, password and TLS
    /// settings). Without hints, waiters still get the lock, by looking again when the
    /// holder's lease would end.
    pub fn listen_url(mut self, url: &str) -> Self {
        self.listen_url = Some(url.to_owned());
        self
    }

    /// Checks the settings and builds the backend. No network I/O (a password file and
    /// TLS files are read).
    ///
    /// # Errors
    /// `InvalidArgument` for a URL that is not `postgresql://` or `postgres://` or that
    /// libpq's rules refuse, a Unix-socket host, a bad schema, timeout, drift factor or
    /// pool size, an unreadable password or TLS file, or TLS settings with
    /// `sslmode=disable`.
    pub fn build(self) -> Result<PostgresBackend, InvalidArgument> {
        PostgresBackend::from_resolved(self.resolve()?)
    }

    fn resolve(mut self) -> Result<Resolved, InvalidArgument> {
        let listen = match self.listen_url.take() {
            Some(listen_url) => Some(
                PostgresBackendBuilder {
                    url: listen_url,
                    ..self.clone()
                }
                .resolve()
                .map_err(|e| InvalidArgument::new("listen_url", e.reason().to_owned()))?
                .connector,
            ),
            None => None,
        };
        let url = self.url.trim();
        if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
            let shown = url.split_once("://").map_or("", |(scheme, _)| scheme);
            return Err(InvalidArgument::new(
                "url",
                format!(
                    "a PostgreSQL URL starts with postgresql:// or postgres://{}",
                    if shown.is_empty() {
                        String::new()
                    } else {
                        format!(", not {shown}://")
                    }
                ),
            ));
        }
        let mut config = Config::from_str(url).map_err(|e| {
            InvalidArgument::new(
                "url",
                format!("not a PostgreSQL URL that libpq accepts: {e}"),
            )
        })?;
        if config.get_hosts().is_empty() {
            config.host("localhost");
        }
        let hosts = config.get_hosts().len();
        let ports = config.get_ports().len();
        if ports > 1 && ports != hosts {
            return Err(InvalidArgument::new(
                "url",
                format!("{ports} ports for {hosts} hosts: give one port, or one per host"),
            ));
        }
        let addrs = config.get_hostaddrs().len();
        if addrs > 0 && addrs != hosts {
            return Err(InvalidArgument::new(
                "url",
                format!("{addrs} hostaddr values for {hosts} hosts: give one per host"),
            ));
        }
        let mut servers = Vec::new();
        for (i, host) in config.get_hosts().iter().enumerate() {
            let port = config
                .get_ports()
                .get(i)
                .or(config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match host {
                Host::Tcp(h) => servers.push((h.clone(), port)),
                #[allow(unreachable_patterns)]
                _ => {
                    return Err(InvalidArgument::new(
                        "url",
                        "Unix-socket hosts are not supported: give host:port",
                    ));
                }
            }
        }
        if config.get_user().is_none_or(str::is_empty) {
            return Err(InvalidArgument::new(
                "url",
                "name the user: postgresql://USER@host:port/database",
            ));
        }
        if !(1..=MAX_SCHEMA_LEN).contains(&self.schema.len())
            || !self
                .schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            || self.schema.as_bytes()[0].is_ascii_digit()
        {
            return Err(InvalidArgument::new(
                "schema",
                format!(
                    "must be 1 to {MAX_SCHEMA_LEN} bytes of lower-case letters, digits and _, not starting with a digit"
                ),
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
        let password = match (&self.password, &self.password_file) {
            (Some(p), _) => Some(p.0.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    InvalidArgument::new(
                        "password_file",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                let password = text.lines().next().unwrap_or("");
                if password.is_empty() {
                    return Err(InvalidArgument::new(
                        "password_file",
                        format!("{} holds no password on its first line", path.display()),
                    ));
                }
                Some(password.to_owned())
            }
            (None, None) => None,
        };
        if let Some(p) = password {
            config.password(p);
        } else if config.get_password().is_none()
            && let Ok(p) = std::env::var("PGPASSWORD")
            && !p.is_empty()
        {
            config.password(p);
        }
        let tls = match (&self.tls, config.get_ssl_mode()) {
            (Some(_), SslMode::Disable) => {
                return Err(InvalidArgument::new(
                    "tls",
                    "TLS settings were given, but the URL says sslmode=disable",
                ));
            }
            (Some(options), _) => {
                config.ssl_mode(SslMode::Require);
                Some(options.clone())
            }
            (None, SslMode::Require) => Some(TlsOptions::new()),
            (None, _) => {
                // `prefer` (the default) would try TLS only with a TLS connector: plain.
                config.ssl_mode(SslMode::Disable);
                None
            }
        };
        let tls = match tls {
            Some(options) => Some(MakeRustlsConnect::new(
                (*options.load("the PostgreSQL server")?).clone(),
            )),
            None => None,
        };
        if !url.contains("target_session_attrs=") {
            config.target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
        if config.get_application_name().is_none() {
            config.application_name("dlm");
        }
        // Each host gets the whole budget unless the URL says otherwise.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.connect_timeout);
        }
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(10));
        let connector = Connector {
            config,
            tls,
            connect_timeout: self.connect_timeout,
            io_timeout: self.io_timeout,
            servers: servers
                .iter()
                .map(|(h, p)| {
                    if h.contains(':') {
                        format!("[{h}]:{p}")
                    } else {
                        format!("{h}:{p}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
            hosts: servers,
        };
        Ok(Resolved {
            listen: listen.unwrap_or_else(|| connector.clone()),
            connector,
            schema: self.schema,
            drift_factor: self.drift_factor,
            pool_size: self.pool_size,
        })
    }
}
