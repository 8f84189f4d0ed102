//! What a failed request means: etcd's error codes, transport failures, and the probes
//! that tell a TLS mix-up, a refused client certificate or a port that is not etcd (a
//! Redis server) from a member that is down.

use std::error::Error as _;

use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

use super::{Gateway, Outcome};
use crate::tls::{describe, tls_cause};

impl Gateway {
    /// Whether `t` is an `https://` member closing the connection during the TLS
    /// handshake (ureq's "tls connection init failed" over an unexpected end of file), or
    /// resetting it there because the port speaks plain HTTP (a plain server that answers
    /// the ClientHello with a 400 and closes before reading all of it resets the
    /// connection instead: which of the two a client sees is a race).
    pub(super) fn tls_refused(&self, i: usize, t: &ureq::Transport) -> bool {
        if !self.members[i].starts_with("https://") || t.kind() != ureq::ErrorKind::ConnectionFailed
        {
            return false;
        }
        match t
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind)
        {
            Some(std::io::ErrorKind::UnexpectedEof) => true,
            // A member going down resets connections too: only a plain port is a TLS
            // mix-up; anything else stays a transport failure.
            Some(std::io::ErrorKind::ConnectionReset) => self.speaks_plain_http(i),
            _ => false,
        }
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
    pub(super) fn speaks_plain_http(&self, i: usize) -> bool {
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
    pub(super) fn not_http(&self, i: usize) -> Option<BackendError> {
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

/// `member` (a URL) does not speak etcd's v3 gateway.
pub(super) fn not_etcd(member: &str, path: &str, why: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("{member} is not an etcd v3 JSON gateway ({path}: {why})"),
    )
}

pub(super) fn io_error(member: &str, e: &std::io::Error) -> BackendError {
    let kind = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => BackendErrorKind::Timeout,
        _ => BackendErrorKind::Unavailable,
    };
    BackendError::new(kind, format!("{member}: {e}"))
}

pub(super) fn transport_error(member: &str, t: &ureq::Transport) -> Outcome {
    use ureq::ErrorKind as K;
    let msg = format!("{member}: {t}");
    match t.kind() {
        // Nothing was sent: another member may serve it.
        K::Dns | K::ConnectionFailed => {
            Outcome::TryNext(BackendError::new(BackendErrorKind::Unavailable, msg).never_sent())
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
pub(super) fn status_error(member: &str, path: &str, http: u16, body: &str) -> Outcome {
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
        // UNAVAILABLE: no leader, not ready, but also "request timed out", "leader
        // changed", "server stopped": a change may still be applied.
        14 => return Outcome::Unavailable(BackendError::new(BackendErrorKind::Unavailable, msg)),
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

/// Whether `e` is etcd's "requested lease not found".
pub(crate) fn is_lease_not_found(e: &BackendError) -> bool {
    e.message().ends_with("requested lease not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_map_to_kinds() {
        let kind = |code: i64| {
            status_error(
                "m",
                "/p",
                500,
                &format!(r#"{{"error":"e","message":"e","code":{code}}}"#),
            )
            .into_error()
            .kind()
        };
        assert_eq!(kind(14), BackendErrorKind::Unavailable);
        // A change answered UNAVAILABLE may still apply: it is not the next member's.
        assert!(matches!(
            status_error(
                "m",
                "/p",
                503,
                r#"{"error":"etcdserver: request timed out","message":"etcdserver: request timed out","code":14}"#
            ),
            Outcome::Unavailable(_)
        ));
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
