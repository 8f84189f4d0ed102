//! The lock connections' transport: a socket with a reused read buffer and a small RESP2
//! reader.
//!
//! Every lock request is encoded by `protocol/requests.rs` straight into bytes; this
//! reads the replies. The `redis` crate's reader zeroes an 8 KiB buffer and runs a general parser
//! combinator for every reply, which was about half of the client's instructions per lock
//! cycle. The replies here are few and small (status, integer, bulk string, short arrays),
//! so a direct reader is short. It still yields `redis::Value` and `redis::RedisError`, so
//! error classification is shared with the rest of the crate, and it implements
//! `redis::ConnectionLike` for the rare commands built with `redis::cmd` (script loads,
//! `INFO`, `CONFIG GET`). The pub/sub listener (`hints.rs`) reads its messages with it
//! too: every connection dlm opens is a `Wire`, plain or TLS.
//!
//! The connection speaks RESP2 (no `HELLO`), authenticates with `AUTH` and selects the
//! URL's database. Any I/O error, timeout or malformed reply closes it for good: a late
//! reply could otherwise answer the next request.
//!
//! TLS (`rediss://`) is rustls's `StreamOwned` over the TCP socket: the handshake runs in
//! `connect` within the connect timeout, and every read takes all the plaintext rustls has
//! already decrypted, so that `poll` on the socket (Redlock's fan-out) never waits for
//! bytes that were read from the socket earlier.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};

use super::resp::{MAX_DEPTH, Resp, parse, protocol_error};
use super::tls::{TlsTarget, handshake, io_error};
use rustls::{ClientConnection, StreamOwned};

/// The read buffer's size; it grows for a larger reply ...
const BUFFER: usize = 4096;
/// ... and is put back to `BUFFER` after one beyond this.
const BUFFER_KEPT: usize = 64 * 1024;
/// The shortest wait of [`Wire::read_some_within`] (a read timeout of zero would mean
/// none).
const MIN_WAIT: Duration = Duration::from_micros(50);

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
            Stream::Tls(s) => s.sock.as_fd(),
        }
    }
}

impl Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(bytes),
            Stream::Unix(s) => s.write_all(bytes),
            Stream::Tls(s) => {
                s.write_all(bytes)?;
                s.flush()
            }
        }
    }

    /// Plaintext rustls has decrypted and not yet handed out (0 for a plain stream).
    fn buffered(&mut self) -> io::Result<usize> {
        match self {
            Stream::Tls(s) => match s.conn.process_new_packets() {
                Ok(state) => Ok(state.plaintext_bytes_to_read()),
                Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            },
            _ => Ok(0),
        }
    }

    fn set_read_timeout(&self, d: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(d)),
            Stream::Tls(s) => s.sock.set_read_timeout(Some(d)),
            Stream::Unix(s) => s.set_read_timeout(Some(d)),
        }
    }

    fn set_timeouts(&self, io: Duration) -> io::Result<()> {
        self.set_read_timeout(io)?;
        match self {
            Stream::Tcp(s) => s.set_write_timeout(Some(io)),
            Stream::Tls(s) => s.sock.set_write_timeout(Some(io)),
            Stream::Unix(s) => s.set_write_timeout(Some(io)),
        }
    }
}

/// Whether `e` is a TLS failure (made by [`tls_error`]).
pub(crate) fn is_tls_error(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Client && e.to_string().starts_with("TLS")
}

/// One connection to one server.
pub(crate) struct Wire {
    stream: Stream,
    /// Received bytes not yet parsed are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    db: i64,
    open: bool,
    /// Replies owed to requests sent (see [`owed`](Wire::owed)).
    owed: usize,
    /// The configured I/O timeout: how long a blocking read waits.
    io: Duration,
    /// The socket's read timeout now: `io`, or the bound of the last
    /// [`read_some_within`](Wire::read_some_within) (set again only when it changes).
    reading: Duration,
}

impl Wire {
    /// Connects (each resolved address in turn, within `connect` each), sets the I/O
    /// timeouts, authenticates and selects the database.
    pub(crate) fn connect(
        info: &ConnectionInfo,
        tls: Option<&TlsTarget>,
        connect: Duration,
        io: Duration,
    ) -> RedisResult<Wire> {
        let mut plain_addr = None;
        // Connecting and the TLS handshake share one deadline: the connect timeout.
        let deadline = Instant::now() + connect;
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut last = None;
                let mut stream = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        last = Some(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "connection timed out",
                        ));
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left) {
                        Ok(s) => {
                            stream = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = match (stream, last) {
                    (Some(s), _) => s,
                    (None, Some(e)) => return Err(e.into()),
                    (None, None) => {
                        return Err(RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "the host name resolved to no address",
                        )));
                    }
                };
                s.set_nodelay(true)?;
                match tls {
                    Some(target) => Stream::Tls(Box::new(handshake(s, target, deadline)?)),
                    None => {
                        plain_addr = s.peer_addr().ok();
                        Stream::Tcp(s)
                    }
                }
            }
            ConnectionAddr::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
            _ => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "only redis:// and unix:// addresses are supported",
                )));
            }
        };
        stream.set_timeouts(io)?;
        let mut wire = Wire {
            stream,
            buf: vec![0; BUFFER],
            start: 0,
            end: 0,
            db: info.redis_settings().db(),
            open: true,
            owed: 0,
            io,
            reading: io,
        };
        match wire.hello(info) {
            // A plain connection dropped at its first request: a TLS port says nothing
            // and resets. Asked again with a TLS hello, to say so instead of "reset".
            Err(e)
                if e.is_connection_dropped()
                    && plain_addr.is_some_and(|a| super::tls::speaks_tls(&a, connect)) =>
            {
                Err(RedisError::from((
                    ErrorKind::Client,
                    "TLS",
                    "the server speaks TLS on this port: use a rediss:// URL".to_owned(),
                )))
            }
            Err(e) => Err(e),
            Ok(()) => Ok(wire),
        }
    }

    /// The first requests of a connection: `AUTH` and `SELECT` as the URL asks, or a
    /// `PING`, so that a server that cannot serve us is found here, not by a lock request.
    fn hello(&mut self, info: &ConnectionInfo) -> RedisResult<()> {
        let wire = self;
        let settings = info.redis_settings();
        if settings.password().is_none() && settings.db() == 0 {
            let mut ping = Resp::new();
            ping.command(1).arg(b"PING");
            wire.request(&ping.0)?.extract_error()?;
            return Ok(());
        }
        if let Some(password) = settings.password() {
            let mut auth = Resp::new();
            match settings.username() {
                Some(user) => auth.command(3).arg(b"AUTH").arg(user.as_bytes()),
                None => auth.command(2).arg(b"AUTH"),
            }
            .arg(password.as_bytes());
            match wire.request(&auth.0)?.extract_error() {
                Ok(Value::Okay) => {}
                // A server older than 6.0 has no users: the password alone (as redis-rs).
                Err(e)
                    if settings.username().is_some()
                        && e.detail().is_some_and(|d| {
                            d.contains("wrong number of arguments for 'auth' command")
                        }) =>
                {
                    let mut auth = Resp::new();
                    auth.command(2).arg(b"AUTH").arg(password.as_bytes());
                    match wire.request(&auth.0)?.extract_error() {
                        Ok(Value::Okay) => {}
                        Ok(other) => return Err(auth_failed(format!("{other:?}"))),
                        Err(e) => return Err(auth_failed(super::resp::words(&e))),
                    }
                }
                // Whatever the server said (WRONGPASS, "no password is set", Redis 5's
                // "invalid password"), the credentials were refused: never retried. Its
                // words are kept.
                Err(e) => return Err(auth_failed(super::resp::words(&e))),
                Ok(other) => return Err(auth_failed(format!("{other:?}"))),
            }
        }
        if settings.db() != 0 {
            let mut select = Resp::new();
            select
                .command(2)
                .arg(b"SELECT")
                .arg(settings.db().to_string().as_bytes());
            wire.request(&select.0)?.extract_error()?;
        }
        Ok(())
    }

    /// Writes one or more encoded requests, which get `replies` replies in all.
    pub(crate) fn send(&mut self, bytes: &[u8], replies: usize) -> RedisResult<()> {
        self.check_open()?;
        if self.start != self.end || self.owed != 0 {
            // Bytes nobody asked for, or the replies of an earlier request, would answer
            // this one.
            self.open = false;
            return Err(protocol_error("unexpected data from the server"));
        }
        // Closed until the write completes: an error, or a panic midway, leaves it so
        // (and the pool discards it).
        self.open = false;
        self.stream.write_all(bytes).map_err(io_error)?;
        self.open = true;
        self.owed = replies;
        Ok(())
    }

    /// How many replies to requests already sent have not been read: a connection that
    /// owes any cannot take a new request (the pool discards it, see `Manager`).
    pub(crate) fn owed(&self) -> usize {
        self.owed
    }

    /// Reads one reply. A server error is a value (`Value::ServerError`), so that the
    /// replies to pipelined requests can all be read; anything else that goes wrong
    /// closes the connection.
    pub(crate) fn receive(&mut self) -> RedisResult<Value> {
        loop {
            if let Some(value) = self.try_receive()? {
                return Ok(value);
            }
            self.read_some()?;
        }
    }

    /// One reply if the bytes received so far hold a whole one; `None` (no I/O) when
    /// more must be read first (see [`read_some`](Self::read_some)).
    pub(crate) fn try_receive(&mut self) -> RedisResult<Option<Value>> {
        self.check_open()?;
        if matches!(self.buf.get(self.start), Some(0x15 | 0x16)) && self.start < self.end {
            // A TLS record (alert or handshake), never the first byte of a RESP reply.
            self.open = false;
            return Err(RedisError::from((
                ErrorKind::Client,
                "TLS",
                "the server answered with TLS: use a rediss:// URL".to_owned(),
            )));
        }
        let parsed = match parse(&self.buf[self.start..self.end], MAX_DEPTH) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.open = false;
                return Err(e);
            }
        };
        let Some((value, used)) = parsed else {
            return Ok(None);
        };
        self.start += used;
        self.owed = self.owed.saturating_sub(1);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > BUFFER_KEPT {
                // A large reply grew the buffer: a pooled connection does not keep it.
                self.buf = vec![0; BUFFER];
            }
        }
        Ok(Some(value))
    }

    /// Reads what the socket has (blocking until at least one byte, the end of the
    /// stream, or the read timeout). After `poll` reported the socket readable it
    /// returns at once. An error closes the connection.
    pub(crate) fn read_some(&mut self) -> RedisResult<()> {
        self.check_open()?;
        self.fill().inspect_err(|_| self.open = false)
    }

    /// Reads what the socket has, waiting at most `within` (at least [`MIN_WAIT`]; a
    /// socket read timeout, which the kernel rounds up to its timer tick):
    /// `false` when nothing came in that time, and the connection stays usable (a read
    /// timeout consumes nothing; rustls keeps a partial record). Redlock's fan-out reads
    /// its oldest unanswered request so. An error closes the connection.
    pub(crate) fn read_some_within(&mut self, within: Duration) -> RedisResult<bool> {
        self.check_open()?;
        let within = within.max(MIN_WAIT);
        let first = self.set_reading(within).and_then(|()| self.read_once());
        match first {
            Ok(()) => {}
            Err(e)
                // The read timeout (EAGAIN). `TimedOut` (ETIMEDOUT) is TCP giving up on
                // the connection: an error like any other.
                if e.kind() == io::ErrorKind::WouldBlock =>
            {
                return Ok(false);
            }
            Err(e) => {
                self.open = false;
                return Err(io_error(e));
            }
        }
        self.drain_buffered()
            .inspect_err(|_| self.open = false)
            .map(|()| true)
    }

    /// For pub/sub: the next message, or `None` when the read timeout passed with nothing
    /// new (the connection stays open: a quiet channel is not a failure).
    pub(crate) fn next_message(&mut self) -> RedisResult<Option<Value>> {
        if let Some(value) = self.try_receive()? {
            return Ok(Some(value));
        }
        self.check_open()?;
        match self.fill() {
            Ok(()) => self.try_receive(),
            Err(e) if e.is_timeout() => Ok(None),
            Err(e) => {
                self.open = false;
                Err(e)
            }
        }
    }

    /// Sends one request and reads its reply.
    fn request(&mut self, bytes: &[u8]) -> RedisResult<Value> {
        self.send(bytes, 1)?;
        self.receive()
    }

    /// Makes room for at least `more` bytes after `end`.
    fn room(&mut self, more: usize) {
        if self.buf.len() - self.end >= more {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < more {
            let len = (self.end + more).max(self.buf.len() * 2);
            self.buf.resize(len, 0);
        }
    }

    /// Reads more bytes (at least one; for TLS, also every decrypted byte rustls holds).
    fn fill(&mut self) -> RedisResult<()> {
        self.set_reading(self.io)
            .and_then(|()| self.read_once())
            .map_err(io_error)?;
        self.drain_buffered()
    }

    /// Takes every decrypted byte rustls holds (none for a plain stream): those reads
    /// never wait.
    fn drain_buffered(&mut self) -> RedisResult<()> {
        loop {
            let buffered = self.stream.buffered().map_err(io_error)?;
            if buffered == 0 {
                return Ok(());
            }
            self.room(buffered);
            self.read_once().map_err(io_error)?;
        }
    }

    /// Sets the socket's read timeout to `d` unless it is that already.
    fn set_reading(&mut self, d: Duration) -> io::Result<()> {
        if self.reading != d {
            self.stream.set_read_timeout(d)?;
            self.reading = d;
        }
        Ok(())
    }

    /// One read from the stream, making room first.
    fn read_once(&mut self) -> io::Result<()> {
        self.room(1);
        loop {
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn check_open(&self) -> RedisResult<()> {
        if self.open {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection was closed after an error",
            )
            .into())
        }
    }
}

impl std::os::fd::AsFd for Wire {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl redis::ConnectionLike for Wire {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send(cmd, 1)?;
        self.receive()
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.send(cmd, offset + count)?;
        let mut values = Vec::with_capacity(count);
        let mut skipped_error = None;
        for i in 0..offset + count {
            let value = self.receive()?;
            if i >= offset {
                values.push(value);
            } else if let Err(e) = value.extract_error() {
                // e.g. a command MULTI refused to queue: the transaction did not run.
                skipped_error.get_or_insert(e);
            }
        }
        match skipped_error {
            Some(e) => Err(e),
            None => Ok(values),
        }
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        matches!(
            self.req_packed_command(b"*1\r\n$4\r\nPING\r\n"),
            Ok(Value::SimpleString(_))
        )
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

impl Wire {
    /// Whether an idle connection was closed by the server (a restart, `CLIENT KILL`, a
    /// demotion by Sentinel, its idle timeout) or holds bytes nobody asked for: one
    /// zero-timeout `poll`, so that a pooled connection is not handed out to fail its
    /// first request. A plain stream that is readable while idle is unusable (EOF or an
    /// unsolicited reply). A TLS stream can be readable with session tickets, so only the
    /// peer's shutdown counts there.
    pub(crate) fn closed_while_idle(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let tls = matches!(self.stream, Stream::Tls(_));
        let watch = PollFlags::IN | PollFlags::RDHUP;
        let mut fds = [PollFd::new(&self.stream, watch)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&zero)) {
            Ok(0) => false,
            Ok(_) => {
                let r = fds[0].revents();
                let gone = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
                r.intersects(gone) || (!tls && r.contains(PollFlags::IN))
            }
            Err(_) => true,
        }
    }
}

/// Refused credentials, with what the server said (`WRONGPASS ...`).
fn auth_failed(server_said: String) -> RedisError {
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "the server refused the credentials",
        server_said,
    ))
}
