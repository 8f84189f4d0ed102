//! Where a server is: a URL, parsed, or an address a topology finds on each connect.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use dlm_core::{BackendError, InvalidArgument};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use rustls::ClientConfig;

use super::errors::map_error;
use crate::transport::{TlsOptions, TlsTarget, Wire};

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
    /// An address found anew on each connect (Sentinel's master, any node of a cluster);
    /// `info` then holds the credentials and database.
    locator: Option<Arc<dyn Locate>>,
}

/// An address a topology finds anew on each connect: the master the sentinels name, any
/// node of a cluster that answers. What an [`Endpoint`] needs from the layer above it.
pub(crate) trait Locate: Send + Sync {
    /// A connection to where it points now, and the generation of that address.
    fn connect(&self, t: Timeouts) -> Result<(Wire, u64), BackendError>;

    /// Changes when the address does: connections of an older one are not reused.
    fn generation(&self) -> u64 {
        0
    }

    /// After a transient failure of a request made in `generation`: whether it points
    /// elsewhere now (asked again if need be).
    fn moved_since(&self, _generation: u64, _t: Timeouts) -> bool {
        false
    }

    /// A request failed with `err`: the error to report. A locator may cast doubt on its
    /// address here (Sentinel asks again after a timeout or a demoted master's refusal).
    fn failed(&self, err: BackendError) -> BackendError {
        err
    }
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
            locator: None,
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
            locator: None,
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

    /// The address `locator` finds on each connect, with the credentials and database of
    /// `info`; `display` names it in logs and errors.
    pub(crate) fn located(
        info: ConnectionInfo,
        display: String,
        locator: Arc<dyn Locate>,
    ) -> Endpoint {
        Endpoint {
            info,
            tls: None,
            display,
            locator: Some(locator),
        }
    }

    /// The generation of the address: it changes when a located address does (Sentinel's
    /// master), and connections of an older one must not be reused. Always 0 for a fixed
    /// address.
    pub(crate) fn generation(&self) -> u64 {
        self.locator.as_ref().map_or(0, |l| l.generation())
    }

    /// After a transient failure of a request made in `generation`, whether the address
    /// is another now. Always `false` for a fixed address.
    pub(crate) fn moved_since(&self, generation: u64, t: Timeouts) -> bool {
        self.locator
            .as_ref()
            .is_some_and(|l| l.moved_since(generation, t))
    }

    /// A redis error on a connection to this endpoint, typed (see [`map_error`]); a
    /// located address may cast doubt on itself (see [`Locate::failed`]).
    pub(crate) fn error(&self, e: &redis::RedisError) -> BackendError {
        let err = map_error(e, &self.display);
        match &self.locator {
            Some(l) => l.failed(err),
            None => err,
        }
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
        if let Some(l) = &self.locator {
            return l.connect(t);
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
