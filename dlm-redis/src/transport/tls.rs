//! TLS for `rediss://` servers, with rustls: the handshake within the connect deadline,
//! what its failures mean, and the probe that tells a plain port from a TLS one. The
//! settings ([`TlsOptions`](dlm_core::tls::TlsOptions)) and their loading are dlm-core's
//! (`dlm_core::tls`), shared with dlm-etcd.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use redis::{ErrorKind, RedisError, RedisResult};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

pub(crate) use dlm_core::tls::speaks_tls;

/// Whether the server at `addr` answers a plain `PING` with a RESP reply: asked only after
/// a TLS handshake timed out, to tell "this is a plain port" (a Redis plain port waits for
/// the end of a line that a TLS hello never sends) from a stopped server.
pub(crate) fn speaks_resp(addr: &std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    use std::io::{Read, Write};
    let probe = || -> std::io::Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut tcp = std::net::TcpStream::connect_timeout(addr, timeout)?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        tcp.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut first = [0u8; 1];
        Ok(tcp.read(&mut first)? == 1 && b"+-".contains(&first[0]))
    };
    probe().unwrap_or(false)
}

/// What a TLS failure means, in words, for an error message (certificate errors name
/// the problem; nothing secret is in them).
pub(crate) fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("the server did not answer with TLS (a plain-TCP port? use redis://): {e}")
        }
        _ => e.to_string(),
    }
}

/// Runs the TLS handshake on `tcp`, done by `deadline`. A server that has not said a
/// word by half the time left is asked, on a second connection within the rest, whether
/// it speaks plain RESP (a plain Redis port waits for the end of a line, so it never
/// answers a ClientHello): then the error says to use `redis://`, within the connect
/// timeout, instead of a timeout.
/// Where a TLS connection goes: the loaded configuration and the name to verify.
#[derive(Clone, Debug)]
pub(crate) struct TlsTarget {
    pub(crate) config: Arc<ClientConfig>,
    pub(crate) name: ServerName<'static>,
}

pub(crate) fn handshake(
    mut tcp: TcpStream,
    target: &TlsTarget,
    deadline: Instant,
) -> RedisResult<StreamOwned<ClientConnection, TcpStream>> {
    let mut conn = ClientConnection::new(target.config.clone(), target.name.clone())
        .map_err(|e| tls_error(&e))?;
    // Asked before the handshake: a reset connection has no peer any more.
    let peer = tcp.peer_addr().ok();
    let first_word_by = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
    let mut heard = false;
    while conn.is_handshaking() {
        let until = if heard { deadline } else { first_word_by };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(handshake_timeout(peer, deadline));
        }
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        match conn.complete_io(&mut tcp) {
            Ok((read, _)) => heard |= read > 0,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "TLS",
                    "the server closed the connection during the TLS handshake (not a TLS port, or it refused our client certificate)".to_owned(),
                )));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(handshake_timeout(peer, deadline));
            }
            // A plain port that answered the ClientHello and closed before reading all of
            // it resets the connection: the same mix-up as a handshake left unanswered
            // (a server going down resets too, and stays a transport failure).
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(plain_port(peer, deadline).unwrap_or_else(|| io_error(e)));
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// A handshake that got no answer: a plain Redis port (it waits for the end of a line),
/// or a server that answers nothing at all (stopped), which stays a timeout.
fn handshake_timeout(peer: Option<SocketAddr>, deadline: Instant) -> RedisError {
    plain_port(peer, deadline).unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out").into()
    })
}

/// The TLS mix-up error when `peer` answers plain RESP (asked before `deadline`).
fn plain_port(peer: Option<SocketAddr>, deadline: Instant) -> Option<RedisError> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero() && peer.is_some_and(|a| speaks_resp(&a, left))).then(|| {
        RedisError::from((
            ErrorKind::Client,
            "TLS",
            "the server does not speak TLS on this port (it answers plain RESP): use a redis:// URL, or its TLS port".to_owned(),
        ))
    })
}

/// A TLS failure as a `RedisError` that `conn::map_error` types as TLS.
pub(crate) fn tls_error(e: &rustls::Error) -> RedisError {
    RedisError::from((ErrorKind::Client, "TLS", describe(e)))
}

/// An I/O error, or the TLS failure inside it.
pub(crate) fn io_error(e: io::Error) -> RedisError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => tls_error(tls),
        None => e.into(),
    }
}
