//! A small synchronous client of etcd's v3 HTTP/JSON gateway: POST a JSON request to
//! `/v3/...` on a member, read the JSON reply; fail over between members.
//!
//! The gateway's JSON is protobuf's JSON mapping: keys and values are base64, 64-bit
//! integers are strings, fields at their default value (false, 0, empty) are left out.
//! Errors come back as an HTTP error status with `{"error", "message", "code"}`, `code`
//! being a gRPC status code.
//!
//! Here: the members, the failover and the request itself; `auth` (the token),
//! `members` (one cluster), `diagnose` (what a failure means: TLS mix-ups, a port that is
//! not etcd, etcd's error codes), `json` (the gateway's field encodings).

mod auth;
mod diagnose;
mod json;
mod members;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

use auth::Auth;
pub(crate) use auth::{Credentials, Secret};
pub(crate) use diagnose::is_lease_not_found;
use diagnose::{io_error, not_etcd, status_error, transport_error};

use crate::tls::{describe, tls_cause};
pub(crate) use json::{b64, bad_reply, int, revision, unb64};

/// Connect and I/O timeouts of every request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
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
    /// Not sent (no connection): the next member may take it.
    TryNext(BackendError),
    /// Answered `UNAVAILABLE` (gRPC code 14): no leader, but also "request timed out",
    /// "leader changed" or "server stopped", after which a change may still be applied.
    /// A read goes to the next member; a change is returned as it is (as etcd's own
    /// client does: it sends a change again only when it was never sent).
    Unavailable(BackendError),
    /// May have been applied, or is a verdict: returned as it is.
    Fail(BackendError),
}

impl Outcome {
    fn into_error(self) -> BackendError {
        match self {
            Outcome::TryNext(e) | Outcome::Unavailable(e) | Outcome::Fail(e) => e,
        }
    }
}

/// Whether a request may be sent to another member after one answered `UNAVAILABLE`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// It changes nothing (a read, a keep-alive, a token): safe to send again.
    Again,
    /// It may change the store: sent again only when it was never sent.
    Once,
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
        // The whole request's deadline too: ureq sets `timeout_read` on a new connection
        // only, and clears it when the connection goes back to the pool, so a request on a
        // reused connection to a stopped member would wait with no bound.
        let agent = agent
            .timeout_connect(timeouts.connect)
            .timeout_read(timeouts.io)
            .timeout_write(timeouts.io)
            .timeout(timeouts.connect + timeouts.io)
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

    /// POSTs `body`, a request that may change the store (`/v3/kv/txn` with a put or a
    /// delete, a lease grant), to `path` on the preferred member, then on the others while
    /// a member cannot be reached. A request that may have been applied is never sent
    /// again as if it had not been: not when the connection broke or timed out after it
    /// was sent, and not when the member answered `UNAVAILABLE` (code 14), which etcd also
    /// says after a change it may still apply ("request timed out", "leader changed").
    /// Its error is returned, transient: the front then handles a step that may have been
    /// applied (it undoes an acquisition, sends a release again, retries a renewal) and
    /// asks again.
    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<Value, BackendError> {
        let text = body.to_string();
        self.failover(Sent::Once, |i| self.post_to(i, path, &text))
    }

    /// POSTs `body`, a request that changes nothing (a range, a transaction of ranges, a
    /// lease's time to live), as [`post`](Self::post) does, and also to the next member
    /// when one answers `UNAVAILABLE` (no leader).
    pub(crate) fn post_read(&self, path: &str, body: &Value) -> Result<Value, BackendError> {
        let text = body.to_string();
        self.failover(Sent::Again, |i| self.post_to(i, path, &text))
    }

    /// POSTs `text` and returns the reply body as it comes (for the keep-alive stream's
    /// several replies), failing over as [`post_read`](Self::post_read) does: a keep-alive
    /// sent twice keeps its leases alive twice, which changes nothing.
    pub(crate) fn post_raw(&self, path: &str, text: &str) -> Result<String, BackendError> {
        self.failover(Sent::Again, |i| self.send(i, path, text))
    }

    /// Whether member `i` serves the cluster: a linearizable read of `key` (which the
    /// member confirms with the leader) answered within the request deadline, whatever it
    /// says (a refusal such as permission denied is an answer; no leader, no connection or
    /// no reply is not). A stopped member accepts connections and says nothing; one cut
    /// off from the leader cannot confirm the read.
    pub(crate) fn answers(&self, i: usize, key: &[u8]) -> bool {
        let body = serde_json::json!({
            "key": b64(key),
            "keys_only": true,
            "limit": "1",
        });
        match self.send(i, "/v3/kv/range", &body.to_string()) {
            Ok(_) => true,
            Err(o) => !matches!(
                o.into_error().kind(),
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout
            ),
        }
    }

    /// Runs `attempt` on the preferred member, then on the others while it says
    /// `TryNext` (or `Unavailable`, for a request that may be `sent` again); a `Fail` is
    /// returned as it is (and moves the preference on when transient).
    fn failover<T>(
        &self,
        sent: Sent,
        attempt: impl Fn(usize) -> Result<T, Outcome>,
    ) -> Result<T, BackendError> {
        self.check_members()?;
        let first = self.preferred();
        let mut last = None;
        for k in 0..self.members.len() {
            let i = (first + k) % self.members.len();
            match attempt(i) {
                Ok(v) => return Ok(v),
                Err(Outcome::Fail(e)) => {
                    if e.is_transient() {
                        self.skip(i);
                    }
                    return Err(e);
                }
                Err(Outcome::Unavailable(e)) if sent == Sent::Once => {
                    self.skip(i);
                    return Err(e);
                }
                Err(Outcome::TryNext(e) | Outcome::Unavailable(e)) => {
                    self.skip(i);
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one member"))
    }

    /// One request to member `i`, its reply parsed and its cluster checked.
    fn post_to(&self, i: usize, path: &str, text: &str) -> Result<Value, Outcome> {
        let body = self.send(i, path, text)?;
        match serde_json::from_str::<Value>(&body) {
            Ok(v) if v.is_object() => self.same_cluster(i, &v).map(|()| v).map_err(Outcome::Fail),
            _ => Err(Outcome::Fail(not_etcd(
                &self.members[i],
                path,
                "its reply is not JSON",
            ))),
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
}
