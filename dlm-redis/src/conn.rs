//! Connections: URL handling, the r2d2 manager with timeouts, error mapping.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use dlm_core::{BackendError, BackendErrorKind, InvalidArgument};
use redis::{ConnectionAddr, ConnectionLike, ErrorKind, ServerErrorKind};

use crate::wire::Wire;

/// Settings shared by every connection to one server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
}

/// One server's address, parsed from a URL. `Display` never shows credentials.
#[derive(Clone)]
pub(crate) struct Endpoint {
    client: redis::Client,
    /// `host:port/db` or `unix:path/db`: what logs and errors show.
    display: String,
}

impl Endpoint {
    pub(crate) fn parse(url: &str) -> Result<Endpoint, InvalidArgument> {
        // Never echo the URL: it may hold a password.
        let client = redis::Client::open(url).map_err(|e| {
            InvalidArgument::new("url", format!("not a valid redis URL ({:?})", e.kind()))
        })?;
        let info = client.get_connection_info();
        let display = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                format!("{host}:{port}/{}", info.redis_settings().db())
            }
            ConnectionAddr::Unix(path) => {
                format!("unix:{}/{}", path.display(), info.redis_settings().db())
            }
            // Lock connections speak plain TCP or unix sockets (see wire.rs), whatever
            // features of the redis crate another dependency enables.
            ConnectionAddr::TcpTls { .. } => {
                return Err(InvalidArgument::new(
                    "url",
                    "TLS (rediss://) is not supported; use redis:// or unix://",
                ));
            }
            _ => {
                return Err(InvalidArgument::new(
                    "url",
                    "only redis:// and unix:// addresses are supported",
                ));
            }
        };
        Ok(Endpoint { client, display })
    }

    /// The socket addresses this endpoint resolves to, for spotting one server listed
    /// twice under different names. Unix sockets resolve to nothing here.
    pub(crate) fn socket_addrs(&self) -> Vec<String> {
        match self.client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => (host.as_str(), *port)
                .to_socket_addrs()
                .map(|a| a.map(|a: SocketAddr| a.to_string()).collect())
                .unwrap_or_default(),
            ConnectionAddr::Unix(path) => vec![format!("unix:{}", path.display())],
            _ => Vec::new(),
        }
    }

    /// A connection of the `redis` crate (for pub/sub), with the same timeouts.
    pub(crate) fn connect(&self, t: Timeouts) -> Result<redis::Connection, BackendError> {
        let con = self
            .client
            .get_connection_with_timeout(t.connect)
            .map_err(|e| map_error(&e, &self.display))?;
        con.set_read_timeout(Some(t.io))
            .and_then(|()| con.set_write_timeout(Some(t.io)))
            .map_err(|e| map_error(&e, &self.display))?;
        Ok(con)
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
        let t = self.timeouts;
        let con = Wire::connect(self.endpoint.client.get_connection_info(), t.connect, t.io)
            .map_err(|e| map_error(&e, &self.endpoint.display))?;
        Ok(Conn { con, broken: false })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), BackendError> {
        redis::cmd("PING")
            .query::<()>(&mut conn.con)
            .map_err(|e| map_error(&e, &self.endpoint.display))
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        // A connection that still owes replies (given up on before they came) would answer
        // its next request with them.
        conn.broken || !conn.con.is_open() || conn.con.owed() > 0
    }
}

/// Maps a redis error to a typed backend error. The message names the server, never
/// credentials.
pub(crate) fn map_error(e: &redis::RedisError, server: &str) -> BackendError {
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
    // The redis error's text can quote the command's arguments in some versions; keep
    // only the code so that tokens never reach a message.
    let code = e.code().unwrap_or("");
    BackendError::new(kind, format!("{server}: {code}{}", short_detail(e)))
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

/// The error detail, cut short, for the message (server errors do not echo arguments).
fn short_detail(e: &redis::RedisError) -> String {
    match e.detail() {
        Some(d) if e.code().is_some() => {
            let d: String = d.chars().take(120).collect();
            format!(" {d}")
        }
        _ => format!("{:?}", e.kind()),
    }
}
