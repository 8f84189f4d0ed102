//! Connections: URL handling, the r2d2 manager with timeouts, error mapping.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::{BackendError, BackendErrorKind, InvalidArgument};
use redis::{
    ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, IntoConnectionInfo, ServerErrorKind,
};
use rustls::ClientConfig;

use crate::cluster::Cluster;
use crate::sentinel::Discovery;
use crate::tls::TlsOptions;
use crate::wire::{TlsTarget, Wire, is_tls_error};

/// Settings shared by every connection to one server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
}

/// One server's address, parsed from a URL. `Display` never shows credentials.
#[derive(Clone)]
pub(crate) struct Endpoint {
    info: ConnectionInfo,
    /// For `rediss://`: the TLS configuration and the name to verify.
    tls: Option<TlsTarget>,
    /// `host:port/db` or `unix:path/db`: what logs and errors show.
    display: String,
    /// Sentinel mode: the address is whichever master the sentinels name (`info` holds
    /// the credentials and database).
    sentinel: Option<Arc<Discovery>>,
    /// Redis Cluster's release-hint listener: whichever node of the cluster answers.
    cluster: Option<Arc<Cluster>>,
}

/// A URL, parsed: whether it asks for TLS, and the rest.
pub(crate) struct ParsedUrl {
    pub(crate) tls: bool,
    info: ConnectionInfo,
}

/// What the URLs accept, for error messages.
const URL_FORMS: &str =
    "redis://[[user]:password@]host[:port][/db], rediss://... (TLS) or unix:///path/to/socket";

impl ParsedUrl {
    /// Parses a server URL. Errors say what is wrong in plain words and never echo the URL
    /// (it may hold a password).
    pub(crate) fn parse(url: &str) -> Result<ParsedUrl, InvalidArgument> {
        let bad = |why: String| InvalidArgument::new("url", why);
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(bad(format!(
                "no scheme (\"redis://\"); expected {URL_FORMS}"
            )));
        };
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "redis" | "valkey" | "unix" | "redis+unix" => false,
            "rediss" | "valkeys" => true,
            other
                if other.len() <= 16
                    && other
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'+') =>
            {
                return Err(bad(format!(
                    "unknown scheme {other:?}; expected {URL_FORMS}"
                )));
            }
            _ => return Err(bad(format!("unknown scheme; expected {URL_FORMS}"))),
        };
        let mut parsed = url::Url::parse(url).map_err(|e| bad(format!("not a valid URL: {e}")))?;
        if parsed.scheme() != "unix" && parsed.scheme() != "redis+unix" {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(bad(format!("no host; expected {URL_FORMS}")));
            }
            if !matches!(parsed.path(), "" | "/")
                && parsed.path().trim_matches('/').parse::<u32>().is_err()
            {
                return Err(bad("the path must be a database number (\"/0\")".into()));
            }
        }
        match parsed.fragment() {
            None => {}
            Some("insecure") => {
                return Err(bad(
                    "#insecure is not honoured: to skip certificate checks, say so with TlsOptions::dangerously_skip_verification".into(),
                ));
            }
            Some(_) => return Err(bad("a URL fragment (#...) means nothing here".into())),
        }
        if tls {
            // The redis crate parses the rest; it knows `rediss` only with its own TLS
            // features, which dlm does not use (TLS is rustls, in wire.rs).
            parsed
                .set_scheme("redis")
                .map_err(|()| bad("cannot read the URL".into()))?;
        }
        let info = parsed
            .as_str()
            .into_connection_info()
            .map_err(|e| bad(format!("{e}; expected {URL_FORMS}")))?;
        match info.addr() {
            ConnectionAddr::Tcp(..) | ConnectionAddr::Unix(_) => Ok(ParsedUrl { tls, info }),
            _ => Err(bad(format!("unsupported address; expected {URL_FORMS}"))),
        }
    }
}

impl Endpoint {
    /// An endpoint for a parsed URL; `tls` is the backend's TLS configuration, needed
    /// (and only used) when the URL is `rediss://`.
    pub(crate) fn new(
        url: ParsedUrl,
        tls: Option<(&Arc<ClientConfig>, &TlsOptions)>,
    ) -> Result<Endpoint, InvalidArgument> {
        let info = url.info;
        let db = info.redis_settings().db();
        let (display, target) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let target = match (url.tls, tls) {
                    (true, Some((config, options))) => Some(TlsTarget {
                        config: config.clone(),
                        name: options.name_to_verify(host)?,
                    }),
                    (true, None) => {
                        return Err(InvalidArgument::new("tls", "no TLS configuration loaded"));
                    }
                    (false, _) => None,
                };
                let scheme = if url.tls { "rediss://" } else { "" };
                (format!("{scheme}{host}:{port}/{db}"), target)
            }
            ConnectionAddr::Unix(path) => (format!("unix:{}/{db}", path.display()), None),
            _ => unreachable!("ParsedUrl::parse accepts TCP and unix addresses only"),
        };
        Ok(Endpoint {
            info,
            tls: target,
            display,
            sentinel: None,
            cluster: None,
        })
    }

    /// This endpoint's credentials, database and TLS at another address (a cluster node
    /// named by the cluster); `tls` is the configuration of this endpoint's URL.
    pub(crate) fn moved_to(
        &self,
        host: &str,
        port: u16,
        tls: Option<(&Arc<ClientConfig>, &TlsOptions)>,
    ) -> Result<Endpoint, InvalidArgument> {
        let info = self
            .info
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
        let target = match (&self.tls, tls) {
            (Some(_), Some((config, options))) => Some(TlsTarget {
                config: config.clone(),
                name: options.name_to_verify(host)?,
            }),
            (Some(_), None) => {
                return Err(InvalidArgument::new("tls", "no TLS configuration loaded"));
            }
            (None, _) => None,
        };
        let scheme = if target.is_some() { "rediss://" } else { "" };
        let db = info.redis_settings().db();
        Ok(Endpoint {
            display: format!("{scheme}{host}:{port}/{db}"),
            info,
            tls: target,
            sentinel: None,
            cluster: None,
        })
    }

    /// The host of a TCP endpoint.
    pub(crate) fn host(&self) -> Option<String> {
        match self.info.addr() {
            ConnectionAddr::Tcp(host, _) => Some(host.clone()),
            _ => None,
        }
    }

    /// `host:port` of a TCP endpoint.
    pub(crate) fn host_port(&self) -> Option<String> {
        match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => Some(format!("{host}:{port}")),
            _ => None,
        }
    }

    /// Any node of `cluster` that answers (the release-hint listener's endpoint). The
    /// address, credentials and TLS come from the cluster's nodes on each connect.
    pub(crate) fn any_cluster_node(cluster: Arc<Cluster>) -> Endpoint {
        Endpoint {
            info: "redis://127.0.0.1/"
                .into_connection_info()
                .expect("a valid URL"),
            tls: None,
            display: "redis cluster (any node)".into(),
            sentinel: None,
            cluster: Some(cluster),
        }
    }

    /// The master that `discovery`'s sentinels name, whichever server that is now.
    pub(crate) fn sentinel(discovery: Arc<Discovery>) -> Endpoint {
        Endpoint {
            info: discovery.template().clone(),
            tls: None,
            display: format!("master {:?} (sentinel)", discovery.master_name()),
            sentinel: Some(discovery),
            cluster: None,
        }
    }

    /// The generation of the address: with Sentinel, it changes when the master does, and
    /// connections of an older one must not be reused. Always 0 otherwise.
    pub(crate) fn generation(&self) -> u64 {
        self.sentinel.as_ref().map_or(0, |d| d.generation())
    }

    /// Sentinel: after a transient failure of a request made in `generation`, whether the
    /// sentinels now name another master (asked again if need be). Always `false` for
    /// a fixed address.
    pub(crate) fn moved_since(&self, generation: u64, t: Timeouts) -> bool {
        self.sentinel
            .as_ref()
            .is_some_and(|d| d.moved_since(generation, t))
    }

    /// A redis error on a connection to this endpoint, typed. With Sentinel, a failure
    /// casts doubt on the master's address (the next connection asks the sentinels
    /// again), and `READONLY` (the server was demoted) is `Unavailable`: retried, by then
    /// against the new master.
    pub(crate) fn error(&self, e: &redis::RedisError) -> BackendError {
        let err = map_error(e, &self.display);
        if let Some(d) = &self.sentinel {
            match err.kind() {
                BackendErrorKind::ReadOnly => {
                    d.suspect();
                    return BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("{err}: no longer the master; asking the sentinels again"),
                    );
                }
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout => d.suspect(),
                _ => {}
            }
        }
        err
    }

    /// The socket addresses this endpoint resolves to, for spotting one server listed
    /// twice under different names. Unix sockets resolve to nothing here.
    pub(crate) fn socket_addrs(&self) -> Vec<String> {
        match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.as_str(), *port)
                .to_socket_addrs()
                .map(|a| a.map(|a: SocketAddr| a.to_string()).collect())
                .unwrap_or_default(),
            ConnectionAddr::Unix(path) => vec![format!("unix:{}", path.display())],
            _ => Vec::new(),
        }
    }

    /// A new connection (plain or TLS, as the URL says), authenticated, with `t`'s
    /// timeouts.
    pub(crate) fn connect(&self, t: Timeouts) -> Result<Wire, BackendError> {
        self.connect_in_generation(t).map(|(con, _)| con)
    }

    /// [`connect`](Self::connect), and the address's generation it was made in.
    pub(crate) fn connect_in_generation(&self, t: Timeouts) -> Result<(Wire, u64), BackendError> {
        if let Some(d) = &self.sentinel {
            return d.connect(t);
        }
        if let Some(c) = &self.cluster {
            return c.connect_any(t).map(|con| (con, 0));
        }
        Wire::connect(&self.info, self.tls.as_ref(), t.connect, t.io)
            .map(|con| (con, 0))
            .map_err(|e| map_error(&e, &self.display))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint({})", self.display)
    }
}

/// A pooled connection that remembers when it can no longer be trusted: after a timeout
/// or I/O error a late reply may still be in flight, so the connection is discarded.
pub(crate) struct Conn {
    pub(crate) con: Wire,
    pub(crate) broken: bool,
    /// The endpoint's generation when it was made (see [`Endpoint::generation`]).
    generation: u64,
    /// When it was last given back to the pool (or made).
    idle_since: Instant,
}

/// How long a pooled connection must have been idle before a checkout looks whether the
/// server closed it. A busy connection is not looked at: the `poll` cost 3-4% of
/// uncontended throughput on one server (bench, 2 cores), and a server closes
/// connections (a restart, `CLIENT KILL`, a Sentinel demotion) on a scale of
/// milliseconds or more.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(1);

impl Conn {
    /// Whether this idle connection must not be used: the server closed it, or (Sentinel)
    /// it goes to an address that is no longer the master's.
    pub(crate) fn is_stale(&self, endpoint: &Endpoint) -> bool {
        self.is_outdated(endpoint)
            || (self.idle_since.elapsed() >= IDLE_CHECK_AFTER && self.con.closed_while_idle())
    }

    /// Whether it was made for an address the endpoint has moved away from (Sentinel).
    fn is_outdated(&self, endpoint: &Endpoint) -> bool {
        self.generation != endpoint.generation()
    }
}

/// The r2d2 manager: connects with a connect timeout and sets read and write timeouts
/// (the redis crate's own manager sets none, so a paused server hangs a checkout forever).
/// Lock connections are [`Wire`]s.
#[derive(Debug)]
pub(crate) struct Manager {
    pub(crate) endpoint: Endpoint,
    pub(crate) timeouts: Timeouts,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = BackendError;

    fn connect(&self) -> Result<Conn, BackendError> {
        let (con, generation) = self.endpoint.connect_in_generation(self.timeouts)?;
        Ok(Conn {
            con,
            broken: false,
            generation,
            idle_since: Instant::now(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), BackendError> {
        redis::cmd("PING")
            .query::<()>(&mut conn.con)
            .map_err(|e| self.endpoint.error(&e))
    }

    /// Called by r2d2 when a connection is given back, and only then: the start of its
    /// idle time is noted here.
    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.idle_since = Instant::now();
        // A connection that still owes replies (given up on before they came) would answer
        // its next request with them.
        conn.broken
            || !conn.con.is_open()
            || conn.con.owed() > 0
            || conn.is_outdated(&self.endpoint)
    }
}

/// Maps a redis error to a typed backend error. The message names the server, never
/// credentials.
pub(crate) fn map_error(e: &redis::RedisError, server: &str) -> BackendError {
    if is_tls_error(e) {
        // Made by wire.rs from rustls's error: certificate and protocol facts only.
        return BackendError::new(
            BackendErrorKind::Tls,
            format!("{server}: {}", e.detail().unwrap_or_default()),
        );
    }
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        BackendErrorKind::Unavailable
    } else {
        match e.kind() {
            ErrorKind::AuthenticationFailed => BackendErrorKind::Auth,
            ErrorKind::Server(ServerErrorKind::BusyLoading) => BackendErrorKind::Busy,
            ErrorKind::Server(ServerErrorKind::ReadOnly) => BackendErrorKind::ReadOnly,
            ErrorKind::Server(ServerErrorKind::NoPerm) => BackendErrorKind::Permission,
            ErrorKind::Server(ServerErrorKind::MasterDown)
            | ErrorKind::Server(ServerErrorKind::TryAgain)
            | ErrorKind::Server(ServerErrorKind::ClusterDown) => BackendErrorKind::Unavailable,
            _ => classify_code(e.code().unwrap_or_default(), e.detail().unwrap_or_default()),
        }
    };
    BackendError::new(kind, format!("{server}: {}", words(e)))
}

fn classify_code(code: &str, detail: &str) -> BackendErrorKind {
    match code {
        "NOAUTH" | "WRONGPASS" => BackendErrorKind::Auth,
        "NOPERM" => BackendErrorKind::Permission,
        "OOM" => BackendErrorKind::OutOfMemory,
        "BUSY" | "LOADING" => BackendErrorKind::Busy,
        "READONLY" => BackendErrorKind::ReadOnly,
        "WRONGTYPE" => BackendErrorKind::UnexpectedKey,
        "ERR" if detail.contains("max number of clients") => BackendErrorKind::Unavailable,
        "ERR" if detail.contains("OOM") => BackendErrorKind::OutOfMemory,
        "ERR"
            if detail.contains("NOPERM")
                || detail.contains("no permissions")
                // Redis 7.0 inside a script: "The user executing the script can't run
                // this command", "... can't access at least one of the keys", "... publish".
                || detail.contains("user executing the script can't") =>
        {
            BackendErrorKind::Permission
        }
        _ => BackendErrorKind::Protocol,
    }
}

/// What a redis error says, in the words of whoever said it: a server's error code and
/// text (cut at 120 characters; server errors do not echo arguments), the operating
/// system's words for an I/O error (`Connection refused (os error 111)`, the resolver's
/// `failed to lookup address information: ...`), or the description dlm's transport
/// gave (the server's own words for refused credentials). Never the redis crate's
/// decorations (` - Io`, the kind's name).
pub(crate) fn words(e: &redis::RedisError) -> String {
    if let Some(code) = e.code() {
        let detail: String = e.detail().unwrap_or_default().chars().take(120).collect();
        return format!("{code} {detail}").trim_end().to_owned();
    }
    if e.is_io_error() || e.is_timeout() {
        return e.to_string();
    }
    // "description - Kind" or "description - Kind: detail".
    let text = e.to_string();
    let description = text.split(" - ").next().unwrap_or_default();
    match e.detail() {
        Some(detail) if !detail.is_empty() => detail.to_owned(),
        _ => description.to_owned(),
    }
}
