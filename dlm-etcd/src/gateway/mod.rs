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

    /// POSTs `body` to `path` (`/v3/kv/txn`, ...), on the preferred member, then on the
    /// others while a member cannot be reached or has no leader. A request that may have
    /// been applied (the connection broke or timed out after it was sent) is not sent
    /// again: its error is returned (transient: the front's retry then asks again, and
    /// every operation here is safe to repeat).
    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<Value, BackendError> {
        let text = body.to_string();
        self.failover(|i| self.post_to(i, path, &text))
    }

    /// POSTs `text` and returns the reply body as it comes (for the keep-alive stream's
    /// several replies), failing over as [`post`](Self::post) does.
    pub(crate) fn post_raw(&self, path: &str, text: &str) -> Result<String, BackendError> {
        self.failover(|i| self.send(i, path, text))
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
            Err(Outcome::Fail(e) | Outcome::TryNext(e)) => !matches!(
                e.kind(),
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout
            ),
        }
    }

    /// Runs `attempt` on the preferred member, then on the others while it says
    /// `TryNext`; a `Fail` is returned as it is (and moves the preference on when
    /// transient).
    fn failover<T>(
        &self,
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
                Err(Outcome::TryNext(e)) => {
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
