//! A small synchronous client of etcd's v3 HTTP/JSON gateway: POST a JSON request to
//! `/v3/...` on a member, read the JSON reply; fail over between members.
//!
//! The gateway's JSON is protobuf's JSON mapping: keys and values are base64, 64-bit
//! integers are strings, fields at their default value (false, 0, empty) are left out.
//! Errors come back as an HTTP error status with `{"error", "message", "code"}`, `code`
//! being a gRPC status code.

use std::error::Error as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

use crate::tls::{describe, tls_cause};

/// Connect and I/O timeouts of every request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
}

/// A password: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// The user and password a backend authenticates with.
#[derive(Debug)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: Secret,
}

/// Credentials and the token etcd gave for them.
#[derive(Debug)]
struct Auth {
    credentials: Credentials,
    /// The current token; `Some("")` when etcd said authentication is not enabled (no
    /// header is sent). Held while a new one is asked for, so that threads that find it
    /// stale at once ask etcd once.
    token: parking_lot::Mutex<Option<Arc<str>>>,
}

/// The members and a pooled HTTP agent.
#[derive(Debug)]
pub(crate) struct Gateway {
    agent: ureq::Agent,
    members: Vec<String>,
    /// The member requests go to first; moves on when it cannot be reached.
    preferred: AtomicUsize,
    pub(crate) timeouts: Timeouts,
    /// The cluster every member must belong to (`header.cluster_id`; 0: not seen yet).
    cluster_id: AtomicU64,
    /// The first-use check that the members answering belong to one cluster: `Some(why)`
    /// when they do not (then every request fails with it).
    members_checked: OnceLock<Option<String>>,
    /// The TLS configuration of `https://` members (the agent has it too; the watch
    /// stream uses it).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// User/password authentication, when configured.
    auth: Option<Auth>,
}

/// A byte stream both ways (a TCP or TLS connection).
pub(crate) trait ReadWrite: std::io::Read + std::io::Write + Send {}
impl<T: std::io::Read + std::io::Write + Send> ReadWrite for T {}

/// What one request to one member came to.
enum Outcome {
    Reply(Value),
    /// Not sent, or refused before it could apply (no connection, no leader): the next
    /// member may take it.
    TryNext(BackendError),
    /// May have been applied, or is a verdict: returned as it is.
    Fail(BackendError),
}

impl Gateway {
    pub(crate) fn new(
        members: Vec<String>,
        timeouts: Timeouts,
        max_idle: usize,
        tls: Option<Arc<rustls::ClientConfig>>,
        credentials: Option<Credentials>,
    ) -> Self {
        let mut agent = ureq::AgentBuilder::new();
        if let Some(config) = &tls {
            agent = agent.tls_config(config.clone());
        }
        let agent = agent
            .timeout_connect(timeouts.connect)
            .timeout_read(timeouts.io)
            .timeout_write(timeouts.io)
            .max_idle_connections(max_idle * members.len().max(1))
            .max_idle_connections_per_host(max_idle)
            .redirects(0)
            .user_agent(concat!("dlm-etcd/", env!("CARGO_PKG_VERSION")))
            .build();
        Gateway {
            agent,
            members,
            preferred: AtomicUsize::new(0),
            timeouts,
            cluster_id: AtomicU64::new(0),
            members_checked: OnceLock::new(),
            tls,
            auth: credentials.map(|credentials| Auth {
                credentials,
                token: parking_lot::Mutex::new(None),
            }),
        }
    }

    /// A connection to member `i` for a stream the agent does not carry (the watch): the
    /// stream (TLS for an `https://` member, handshake made on first use) and the TCP
    /// socket under it (to shut it down from another thread), with `host:port`.
    pub(crate) fn connect(
        &self,
        i: usize,
    ) -> std::io::Result<(Box<dyn ReadWrite>, std::net::TcpStream, &str)> {
        use std::net::{TcpStream, ToSocketAddrs};
        let member = &self.members[i];
        let (tls, host) = match member.strip_prefix("https://") {
            Some(host) => (true, host),
            None => (false, member.trim_start_matches("http://")),
        };
        let addr = host
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let tcp = TcpStream::connect_timeout(&addr, self.timeouts.connect)?;
        let raw = tcp.try_clone()?;
        let stream: Box<dyn ReadWrite> = match (&self.tls, tls) {
            (Some(config), true) => Box::new(crate::tls::client(config, host, tcp)?),
            _ => Box::new(tcp),
        };
        Ok((stream, raw, host))
    }

    /// The members' base URLs (`http://host:port`), as given.
    pub(crate) fn members(&self) -> &[String] {
        &self.members
    }

    /// The member requests go to first.
    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.members.len()
    }

    /// Moves the preference past `i` (it failed), unless someone already did.
    pub(crate) fn skip(&self, i: usize) {
        let next = (i + 1) % self.members.len();
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// POSTs `body` to `path` (`/v3/kv/txn`, ...), on the preferred member, then on the
    /// others while a member cannot be reached or has no leader. A request that may have
    /// been applied (the connection broke or timed out after it was sent) is not sent
    /// again: its error is returned (transient: the front's retry then asks again, and
    /// every operation here is safe to repeat).
    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<Value, BackendError> {
        self.check_members()?;
        let text = body.to_string();
        let first = self.preferred();
        let mut last = None;
        for k in 0..self.members.len() {
            let i = (first + k) % self.members.len();
            match self.post_to(i, path, &text) {
                Outcome::Reply(v) => return Ok(v),
                Outcome::Fail(e) => {
                    if e.is_transient() {
                        self.skip(i);
                    }
                    return Err(e);
                }
                Outcome::TryNext(e) => {
                    self.skip(i);
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one member"))
    }

    /// POSTs `text` to member `i` and returns the reply body as it comes (for the
    /// keep-alive stream's several replies).
    pub(crate) fn post_raw(&self, path: &str, text: &str) -> Result<String, BackendError> {
        self.check_members()?;
        let first = self.preferred();
        let mut last = None;
        for k in 0..self.members.len() {
            let i = (first + k) % self.members.len();
            match self.send(i, path, text) {
                Ok(body) => return Ok(body),
                Err(Outcome::Fail(e)) => {
                    if e.is_transient() {
                        self.skip(i);
                    }
                    return Err(e);
                }
                Err(Outcome::TryNext(e)) => {
                    self.skip(i);
                    last = Some(e);
                }
                Err(Outcome::Reply(_)) => unreachable!("send returns no reply as an error"),
            }
        }
        Err(last.expect("at least one member"))
    }

    /// Once, at first use: asks every member for its status (at once, each within the
    /// timeouts) and fails if those that answer are not all of one cluster. A member that
    /// does not answer now is checked by [`same_cluster`](Self::same_cluster) on its
    /// first reply.
    fn check_members(&self) -> Result<(), BackendError> {
        let why = self.members_checked.get_or_init(|| {
            if self.members.len() < 2 {
                return None;
            }
            let ids: Vec<Option<u64>> = std::thread::scope(|scope| {
                let asks: Vec<_> = (0..self.members.len())
                    .map(|i| {
                        scope.spawn(move || {
                            let body =
                                self.send_as(i, "/v3/maintenance/status", "{}", None).ok()?;
                            let v: Value = serde_json::from_str(&body).ok()?;
                            cluster_id(&v)
                        })
                    })
                    .collect();
                asks.into_iter().map(|a| a.join().ok().flatten()).collect()
            });
            let mut first: Option<(usize, u64)> = None;
            for (i, id) in ids.iter().enumerate() {
                let Some(id) = *id else { continue };
                match first {
                    None => first = Some((i, id)),
                    Some((j, known)) if known != id => {
                        return Some(foreign(&self.members[i], id, &self.members[j], known));
                    }
                    Some(_) => {}
                }
            }
            if let Some((_, id)) = first {
                self.cluster_id.store(id, Ordering::Relaxed);
            }
            None
        });
        match why {
            None => Ok(()),
            Some(why) => Err(BackendError::new(BackendErrorKind::Protocol, why.clone())),
        }
    }

    /// Fails when member `i`'s reply comes from another cluster than the first reply seen.
    fn same_cluster(&self, i: usize, reply: &Value) -> Result<(), BackendError> {
        let Some(id) = cluster_id(reply) else {
            return Ok(());
        };
        match self
            .cluster_id
            .compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(known) if known == id => Ok(()),
            Err(known) => Err(BackendError::new(
                BackendErrorKind::Protocol,
                foreign(&self.members[i], id, "the other members", known),
            )),
        }
    }

    fn post_to(&self, i: usize, path: &str, text: &str) -> Outcome {
        let body = match self.send(i, path, text) {
            Ok(body) => body,
            Err(outcome) => return outcome,
        };
        match serde_json::from_str::<Value>(&body) {
            Ok(v) if v.is_object() => match self.same_cluster(i, &v) {
                Ok(()) => Outcome::Reply(v),
                Err(e) => Outcome::Fail(e),
            },
            _ => Outcome::Fail(not_etcd(&self.members[i], path, "its reply is not JSON")),
        }
    }

    /// The token to send to member `i` (asked of it when there is none yet); `None`
    /// without credentials or when etcd has authentication disabled.
    pub(crate) fn token(&self, i: usize) -> Result<Option<Arc<str>>, BackendError> {
        self.token_or_outcome(i).map_err(|o| match o {
            Outcome::TryNext(e) | Outcome::Fail(e) => e,
            Outcome::Reply(_) => unreachable!("no reply as an error"),
        })
    }

    /// Forgets `used` if it is still the current token (etcd refused it): the next
    /// request asks for a new one.
    pub(crate) fn forget_token(&self, used: Option<&Arc<str>>) {
        if let (Some(auth), Some(used)) = (&self.auth, used) {
            let mut token = auth.token.lock();
            if token.as_ref().is_some_and(|t| Arc::ptr_eq(t, used)) {
                *token = None;
            }
        }
    }

    fn token_or_outcome(&self, i: usize) -> Result<Option<Arc<str>>, Outcome> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let mut token = auth.token.lock();
        if token.is_none() {
            let body = serde_json::json!({
                "name": auth.credentials.user,
                "password": auth.credentials.password.0,
            })
            .to_string();
            let who = &auth.credentials.user;
            let got = match self.send_as(i, "/v3/auth/authenticate", &body, None) {
                Ok(reply) => serde_json::from_str::<Value>(&reply)
                    .ok()
                    .and_then(|v| v.get("token")?.as_str().map(Arc::<str>::from))
                    .ok_or_else(|| {
                        Outcome::Fail(not_etcd(
                            &self.members[i],
                            "/v3/auth/authenticate",
                            "its reply has no token",
                        ))
                    })?,
                Err(Outcome::Fail(e)) if e.message().ends_with("authentication is not enabled") => {
                    Arc::from("")
                }
                Err(Outcome::Fail(e)) if e.kind() == BackendErrorKind::Auth => {
                    return Err(Outcome::Fail(BackendError::new(
                        BackendErrorKind::Auth,
                        format!("{} (authenticating as user {who:?})", e.message()),
                    )));
                }
                Err(other) => return Err(other),
            };
            *token = Some(got);
        }
        Ok(token.clone().filter(|t| !t.is_empty()))
    }

    /// Sends with the current token; when etcd says the token is invalid or stale (it
    /// expired, the user's password changed, the auth store moved on), asks for a new
    /// one and sends once more.
    fn send(&self, i: usize, path: &str, text: &str) -> Result<String, Outcome> {
        if self.auth.is_none() {
            return self.send_as(i, path, text, None);
        }
        let token = self.token_or_outcome(i)?;
        match self.send_as(i, path, text, token.as_deref()) {
            Err(Outcome::Fail(e)) if stale_token(&e) => {
                log::debug!("dlm-etcd: {}: getting a new auth token", self.members[i]);
                self.forget_token(token.as_ref());
                let token = self.token_or_outcome(i)?;
                self.send_as(i, path, text, token.as_deref())
            }
            other => other,
        }
    }

    fn send_as(
        &self,
        i: usize,
        path: &str,
        text: &str,
        token: Option<&str>,
    ) -> Result<String, Outcome> {
        let member = &self.members[i];
        let url = format!("{member}{path}");
        let mut request = self
            .agent
            .post(&url)
            .set("Content-Type", "application/json");
        if let Some(token) = token {
            request = request.set("Authorization", token);
        }
        let reply = request.send_string(text);
        match reply {
            Ok(resp) => resp
                .into_string()
                .map_err(|e| Outcome::Fail(io_error(member, &e))),
            Err(ureq::Error::Status(code, resp)) => {
                // What could be read: etcd's error replies end with a gRPC trailer that
                // ureq's chunked reader refuses after the JSON.
                let mut bytes = Vec::new();
                let _ = std::io::Read::read_to_end(&mut resp.into_reader(), &mut bytes);
                let body = String::from_utf8_lossy(&bytes);
                Err(status_error(member, path, code, &body))
            }
            Err(ureq::Error::Transport(t))
                if tls_cause(&t).is_some() || self.tls_refused(i, &t) =>
            {
                let why = match tls_cause(&t) {
                    Some(e) => describe(e),
                    None if self.speaks_plain_http(i) => {
                        "the member answers plain HTTP on this port: use http://".to_owned()
                    }
                    None => "the member closed the connection during the TLS handshake (it refused our client certificate?)".to_owned(),
                };
                Err(Outcome::Fail(BackendError::new(
                    BackendErrorKind::Tls,
                    format!("{member}: TLS: {why}"),
                )))
            }
            Err(ureq::Error::Transport(t)) => match transport_error(member, &t) {
                // A connection closed without an HTTP reply: a member that went down,
                // or a server that is not HTTP at all (a Redis port closes the connection
                // on a POST). Ask it once in RESP to tell them apart.
                Outcome::Fail(e) if e.kind() == BackendErrorKind::Unavailable => {
                    Err(Outcome::Fail(self.not_http(i).unwrap_or(e)))
                }
                other => Err(other),
            },
        }
    }

    /// Whether `t` is an `https://` member closing the connection during the TLS
    /// handshake (ureq's "tls connection init failed" over an unexpected end of file).
    fn tls_refused(&self, i: usize, t: &ureq::Transport) -> bool {
        self.members[i].starts_with("https://")
            && t.kind() == ureq::ErrorKind::ConnectionFailed
            && t.source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|e| e.kind() == std::io::ErrorKind::UnexpectedEof)
    }

    /// `Some(Tls error)` when member `i` (an `https://` URL) refuses a TLS connection of
    /// ours with an alert (our client certificate missing or refused: with TLS 1.3 the
    /// member says so only after the handshake, so the request that failed may have seen
    /// a closed connection, not the alert); `None` otherwise. The probe makes the
    /// handshake and waits a quarter of the connect timeout for the alert.
    fn tls_refusal(&self, i: usize) -> Option<BackendError> {
        use std::io::Read;
        let (mut s, tcp, _) = self.connect(i).ok()?;
        tcp.set_read_timeout(Some(self.timeouts.connect / 4)).ok()?;
        tcp.set_write_timeout(Some(self.timeouts.connect)).ok()?;
        let err = s.read(&mut [0u8; 64]).err()?;
        let tls = tls_cause(&err)?;
        Some(BackendError::new(
            BackendErrorKind::Tls,
            format!("{}: TLS: {}", self.members[i], describe(tls)),
        ))
    }

    /// Whether member `i` (an `https://` URL) answers a plain HTTP request on its port:
    /// asked only after it closed a TLS handshake, to tell a plain port from a refused
    /// client certificate.
    fn speaks_plain_http(&self, i: usize) -> bool {
        use std::io::{Read, Write};
        use std::net::{TcpStream, ToSocketAddrs};
        let probe = || -> std::io::Result<bool> {
            let host = self.members[i].trim_start_matches("https://");
            let addr = host
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let mut s = TcpStream::connect_timeout(&addr, self.timeouts.connect)?;
            s.set_read_timeout(Some(self.timeouts.connect))?;
            s.set_write_timeout(Some(self.timeouts.connect))?;
            write!(s, "GET /version HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
            let mut head = [0u8; 5];
            s.read_exact(&mut head)?;
            Ok(&head == b"HTTP/")
        };
        probe().unwrap_or(false)
    }

    /// `Some(Protocol error)` when member `i` answers a RESP `PING` with something that
    /// is not HTTP (`+PONG`, `-NOAUTH ...`: a Redis server); `None` when it does not
    /// answer or answers in HTTP, as etcd does (it may just have gone down).
    fn not_http(&self, i: usize) -> Option<BackendError> {
        use std::io::{Read, Write};
        use std::net::{TcpStream, ToSocketAddrs};
        let member = &self.members[i];
        if member.starts_with("https://") {
            return self.tls_refusal(i);
        }
        let addr = member
            .strip_prefix("http://")?
            .to_socket_addrs()
            .ok()?
            .next()?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeouts.connect).ok()?;
        s.set_read_timeout(Some(self.timeouts.connect)).ok()?;
        s.set_write_timeout(Some(self.timeouts.connect)).ok()?;
        s.write_all(b"PING\r\n").ok()?;
        let mut buf = [0u8; 64];
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) if crate::tls::speaks_tls(&addr, self.timeouts.connect) => {
                return Some(BackendError::new(
                    BackendErrorKind::Tls,
                    format!("{member}: the member speaks TLS on this port: use https://"),
                ));
            }
            r => r.ok()?,
        };
        let reply = String::from_utf8_lossy(&buf[..n]);
        let first = reply.lines().next().unwrap_or("").trim();
        if n == 0 || first.starts_with("HTTP/") {
            return None;
        }
        let what = if first.starts_with('+') || first.starts_with('-') {
            "a Redis server (it answers in RESP)"
        } else {
            "not an HTTP server"
        };
        Some(not_etcd(
            member,
            "PING",
            &format!("{what}: it answered {first:?}"),
        ))
    }
}

/// A reply's `header.cluster_id` (a decimal string in the JSON).
fn cluster_id(reply: &Value) -> Option<u64> {
    reply
        .pointer("/header/cluster_id")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .filter(|&id| id != 0)
}

/// The message for a member of another cluster.
fn foreign(member: &str, id: u64, other: &str, known: u64) -> String {
    format!(
        "{member} belongs to another etcd cluster (cluster_id {id:x}) than {other} \
         (cluster_id {known:x}): list the members of one cluster"
    )
}

/// `member` (a URL) does not speak etcd's v3 gateway.
fn not_etcd(member: &str, path: &str, why: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("{member} is not an etcd v3 JSON gateway ({path}: {why})"),
    )
}

fn io_error(member: &str, e: &std::io::Error) -> BackendError {
    let kind = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => BackendErrorKind::Timeout,
        _ => BackendErrorKind::Unavailable,
    };
    BackendError::new(kind, format!("{member}: {e}"))
}

fn transport_error(member: &str, t: &ureq::Transport) -> Outcome {
    use ureq::ErrorKind as K;
    let msg = format!("{member}: {t}");
    match t.kind() {
        // Nothing was sent: another member may serve it.
        K::Dns | K::ConnectionFailed => {
            Outcome::TryNext(BackendError::new(BackendErrorKind::Unavailable, msg))
        }
        K::Io => {
            let timed_out = t
                .source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    )
                });
            let kind = if timed_out {
                BackendErrorKind::Timeout
            } else {
                BackendErrorKind::Unavailable
            };
            Outcome::Fail(BackendError::new(kind, msg))
        }
        K::BadStatus | K::BadHeader | K::TooManyRedirects => Outcome::Fail(BackendError::new(
            BackendErrorKind::Protocol,
            format!("{member} does not answer in HTTP as etcd's gateway does ({t})"),
        )),
        K::InvalidUrl | K::UnknownScheme => {
            Outcome::Fail(BackendError::new(BackendErrorKind::Other, msg))
        }
        _ => Outcome::Fail(BackendError::new(BackendErrorKind::Other, msg)),
    }
}

/// An HTTP error status: etcd's JSON error (a gRPC code), or not etcd at all.
fn status_error(member: &str, path: &str, http: u16, body: &str) -> Outcome {
    // The first JSON value: an error reply may be followed by the gateway's gRPC
    // trailer (`Grpc-Trailer-Content-Type: ...`) in the body as read.
    let first = serde_json::Deserializer::from_str(body)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok);
    let Some((code, message)) = first.and_then(|v| {
        let code = v.get("code")?.as_i64()?;
        let message = v
            .get("message")
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        Some((code, message))
    }) else {
        if body.contains("HTTP request to an HTTPS server") {
            return Outcome::Fail(BackendError::new(
                BackendErrorKind::Tls,
                format!("{member}: the member speaks TLS on this port: use https://"),
            ));
        }
        return Outcome::Fail(not_etcd(member, path, &format!("HTTP {http}")));
    };
    let msg = format!("{member}: {message}");
    if message.ends_with("user name is empty") {
        return Outcome::Fail(BackendError::new(
            BackendErrorKind::Auth,
            format!("{msg} (etcd has authentication enabled: give a user and a password)"),
        ));
    }
    if message.contains("authentication failed")
        || message.ends_with("revision of auth store is old")
    {
        return Outcome::Fail(BackendError::new(BackendErrorKind::Auth, msg));
    }
    let kind = match code {
        // UNAVAILABLE: no leader, not ready, ...; the request was not applied.
        14 => return Outcome::TryNext(BackendError::new(BackendErrorKind::Unavailable, msg)),
        // DEADLINE_EXCEEDED: "request timed out" (may still apply).
        4 => BackendErrorKind::Timeout,
        // CANCELED
        1 => BackendErrorKind::Timeout,
        16 => BackendErrorKind::Auth,
        7 => BackendErrorKind::Permission,
        8 => BackendErrorKind::OutOfMemory,
        3 | 12 => BackendErrorKind::Protocol,
        _ => BackendErrorKind::Other,
    };
    Outcome::Fail(BackendError::new(kind, msg))
}

/// Base64 of `bytes` (keys and values in the gateway's JSON).
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The bytes of a base64 field.
pub(crate) fn unb64(v: &Value) -> Option<Vec<u8>> {
    STANDARD.decode(v.as_str()?).ok()
}

/// Whether etcd refused the token a request carried (not the credentials): a new token
/// may do.
fn stale_token(e: &BackendError) -> bool {
    let m = e.message();
    m.ends_with("invalid auth token")
        || m.ends_with("revision of auth store is old")
        || m.ends_with("user name is empty")
}

/// A 64-bit integer field (a string in the gateway's JSON; a missing field is 0).
pub(crate) fn int(v: &Value, field: &str) -> Result<i64, BackendError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s.parse().map_err(|_| bad_reply(field)),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad_reply(field)),
        Some(_) => Err(bad_reply(field)),
    }
}

/// A reply without the field a request needs.
pub(crate) fn bad_reply(field: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("etcd's reply has no valid `{field}`"),
    )
}

/// The header's revision of a reply.
pub(crate) fn revision(reply: &Value) -> Result<i64, BackendError> {
    int(
        reply.get("header").ok_or_else(|| bad_reply("header"))?,
        "revision",
    )
}

/// Whether `e` is etcd's "requested lease not found".
pub(crate) fn is_lease_not_found(e: &BackendError) -> bool {
    e.message().ends_with("requested lease not found")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_are_read_from_strings_and_missing_ones_are_zero() {
        let v = json!({"a": "42", "b": 7, "c": "x"});
        assert_eq!(int(&v, "a").unwrap(), 42);
        assert_eq!(int(&v, "b").unwrap(), 7);
        assert_eq!(int(&v, "missing").unwrap(), 0);
        assert!(int(&v, "c").is_err());
    }

    #[test]
    fn etcd_errors_map_to_kinds() {
        let kind = |code: i64| match status_error(
            "m",
            "/p",
            500,
            &format!(r#"{{"error":"e","message":"e","code":{code}}}"#),
        ) {
            Outcome::Fail(e) | Outcome::TryNext(e) => e.kind(),
            Outcome::Reply(_) => unreachable!(),
        };
        assert_eq!(kind(14), BackendErrorKind::Unavailable);
        assert_eq!(kind(4), BackendErrorKind::Timeout);
        assert_eq!(kind(16), BackendErrorKind::Auth);
        assert_eq!(kind(7), BackendErrorKind::Permission);
        let with_trailer = status_error(
            "m",
            "/v3/kv/txn",
            403,
            "{\"error\":\"etcdserver: permission denied\",\"message\":\"etcdserver: permission denied\",\"code\":7}Grpc-Trailer-Content-Type: application/grpc\r\n",
        );
        assert!(
            matches!(with_trailer, Outcome::Fail(e) if e.kind() == BackendErrorKind::Permission)
        );
        assert!(matches!(
            status_error("m", "/v3/kv/txn", 404, "404 page not found"),
            Outcome::Fail(e) if e.kind() == BackendErrorKind::Protocol
        ));
    }
}
