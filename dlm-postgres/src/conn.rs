//! One connection to the server, used synchronously: `tokio-postgres`'s protocol, run by
//! the caller's thread over a blocking socket of dlm's own, every request bounded by a
//! deadline of its own. No runtime and no timer: the thread waits for the server in a
//! blocking read, bounded by the socket's read timeout. What a failure means, as a
//! [`BackendError`].

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind};
use rustix::io::Errno;
use rustix::net::RecvFlags;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Row, SimpleQueryMessage, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How to open connections: the server's settings as parsed, the TLS to use, deadlines.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) config: Config,
    /// `None`: plain TCP (or, with `sslmode=require` and no TLS settings, the system's
    /// roots: see the builder).
    pub(crate) tls: Option<MakeRustlsConnect>,
    /// The whole connection's deadline (every host in turn, TLS and authentication).
    pub(crate) connect_timeout: Duration,
    /// A request's deadline, from its send to its reply.
    pub(crate) io_timeout: Duration,
    /// The servers, for messages (`host:port, ...`).
    pub(crate) servers: String,
    /// The same, as (host, port) pairs.
    pub(crate) hosts: Vec<(String, u16)>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("servers", &self.servers)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// How requests are sent: their deadline, and whether statements are prepared (shared by
/// a backend's connections; turned off for good when a pooler loses them).
pub(crate) struct How<'a> {
    pub(crate) timeout: Duration,
    pub(crate) prepare: &'a AtomicBool,
}

/// The half of a connection that talks to the server (`tokio_postgres::Connection`), run
/// by the caller's thread beside each request.
type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// A connection, driven only while a request is under way, by the thread that sent it.
pub(crate) struct Conn {
    client: Client,
    /// `None` once it ended (the server closed the connection, or it failed).
    driver: Option<Driver>,
    io: Io,
    /// A request failed in a way that leaves the connection unusable (a timeout: its
    /// reply may still come).
    broken: bool,
    /// The statements prepared on this connection, by the address of their SQL (the
    /// backend's `Statements`, which outlive its connections: no hashing of the text).
    prepared: HashMap<usize, Statement>,
}

/// The most a read takes from the socket at once.
const READ_CHUNK: usize = 4096;

/// A connection's socket, shared by the protocol (which reads and writes it, as
/// [`Socket`]) and the thread that waits on it ([`Io`]).
struct Shared {
    stream: TcpStream,
    inbox: parking_lot::Mutex<Inbox>,
}

/// What a wait read from the socket and the protocol has not taken yet.
struct Inbox {
    buf: Box<[u8; READ_CHUNK]>,
    /// The bytes not taken yet: `buf[start..end]`.
    start: usize,
    end: usize,
    /// The socket had nothing more when last read (a read found nothing, or took less than
    /// it asked for): a read that does not wait would find nothing, so it is not made, and
    /// the protocol's read is `Pending` until a wait reads again.
    drained: bool,
    /// What a wait found instead of data: the end of the stream (`Ok`) or an error; the
    /// protocol's next read gets it.
    ended: Option<io::Result<()>>,
}

/// A connection's socket as the protocol sees it. A read takes what a wait read, else
/// what has arrived, and never waits (`MSG_DONTWAIT`; nothing yet is `Pending`, and the
/// waiting is [`Io::run`]'s); a write blocks, bounded by the socket's send timeout (the
/// I/O timeout).
struct Socket(Arc<Shared>);

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut inbox = self.0.inbox.lock();
        if inbox.start < inbox.end {
            let n = (inbox.end - inbox.start).min(buf.remaining());
            let from = inbox.start;
            buf.put_slice(&inbox.buf[from..from + n]);
            inbox.start += n;
            return Poll::Ready(Ok(()));
        }
        if let Some(ended) = inbox.ended.take() {
            return Poll::Ready(ended);
        }
        if inbox.drained {
            return Poll::Pending;
        }
        let want = buf.remaining().min(READ_CHUNK);
        let unfilled = buf.initialize_unfilled_to(want);
        loop {
            return match rustix::net::recv(&self.0.stream, &mut *unfilled, RecvFlags::DONTWAIT) {
                Ok((n, _)) => {
                    inbox.drained = n < want;
                    buf.advance(n);
                    Poll::Ready(Ok(()))
                }
                Err(Errno::AGAIN) => {
                    inbox.drained = true;
                    Poll::Pending
                }
                Err(Errno::INTR) => continue,
                Err(e) => Poll::Ready(Err(e.into())),
            };
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match (&self.0.stream).write(buf) {
            // A signal cut the write short: written again on the next turn of
            // `Io::run`, which looks at the deadline first.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server took no more data within the I/O timeout",
            ))),
            written => Poll::Ready(written),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(match self.0.stream.shutdown(std::net::Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

/// Set by a wake-up: something other than the socket (the channel between the client and
/// its connection) has more to do, so [`Io::run`] polls again instead of waiting.
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// What runs a connection's futures on the caller's thread: its socket, waited on when
/// nothing else is to be done, and the wake-up flag.
struct Io {
    shared: Arc<Shared>,
    /// The read timeout set on the socket: the longest one wait for the server lasts. Set
    /// again when a deadline is longer than it or shorter by more than a tenth, so a
    /// request usually sets nothing.
    waits: Option<Duration>,
    woken: Arc<Woken>,
    waker: Waker,
}

impl Io {
    fn new(stream: TcpStream) -> Io {
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let inbox = Inbox {
            buf: Box::new([0; READ_CHUNK]),
            start: 0,
            end: 0,
            drained: false,
            ended: None,
        };
        Io {
            shared: Arc::new(Shared {
                stream,
                inbox: parking_lot::Mutex::new(inbox),
            }),
            waits: None,
            waker: Waker::from(woken.clone()),
            woken,
        }
    }

    /// Runs `request` to its end or to `deadline`, polling `driver` (the connection's
    /// half that reads and writes the socket) beside it; when neither can go on, waits for
    /// the server to send.
    fn run<T>(
        &mut self,
        driver: &mut Option<Driver>,
        deadline: Instant,
        request: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Failure> {
        let mut request = pin!(request);
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            self.woken.0.store(false, Ordering::Relaxed);
            poll_driver(driver, &mut cx);
            if let Poll::Ready(answer) = request.as_mut().poll(&mut cx) {
                return answer.map_err(|e| {
                    // A socket that failed because the deadline passed (a write that timed
                    // out) is a timeout.
                    if e.as_db_error().is_none() && Instant::now() >= deadline {
                        Failure::TimedOut
                    } else {
                        Failure::Postgres(e)
                    }
                });
            }
            // Checked on every turn, not only before a wait: a future that wakes itself
            // again and again (a signal interrupting a write) ends at the deadline too.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::TimedOut);
            }
            if !self.woken.0.load(Ordering::Acquire) {
                self.wait(left).map_err(Failure::Socket)?;
            }
        }
    }

    /// Lets `driver` read what the server sent meanwhile (its closing, for one), without
    /// waiting.
    fn poke(&mut self, driver: &mut Option<Driver>) {
        // What was drained then may have come since.
        self.shared.inbox.lock().drained = false;
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            self.woken.0.store(false, Ordering::Relaxed);
            poll_driver(driver, &mut cx);
            if driver.is_none() || !self.woken.0.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// Waits until the server sends (or closes, or the socket fails), and keeps what it
    /// read for the protocol's next read. At most `left` and a ninth: the socket's read
    /// timeout is set again when `left` is longer than it or shorter by more than a tenth.
    fn wait(&mut self, left: Duration) -> io::Result<()> {
        let mut inbox = self.shared.inbox.lock();
        if inbox.start < inbox.end || inbox.ended.is_some() {
            // The protocol has not taken what is there yet (it waits for its other half).
            return Ok(());
        }
        let want = left.max(Duration::from_millis(1));
        if self.waits.is_none_or(|w| want > w || want < w.mul_f64(0.9)) {
            self.shared.stream.set_read_timeout(Some(want))?;
            self.waits = Some(want);
        }
        match rustix::net::recv(&self.shared.stream, &mut inbox.buf[..], RecvFlags::empty()) {
            Ok((0, _)) => inbox.ended = Some(Ok(())),
            Ok((n, _)) => (inbox.start, inbox.end, inbox.drained) = (0, n, n < READ_CHUNK),
            // The wait ran out, or a signal cut it short: the caller looks at its deadline
            // (a wait begun again with the whole read timeout could outlast it without end
            // under a stream of signals).
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(e) => inbox.ended = Some(Err(e.into())),
        }
        Ok(())
    }
}

/// The addresses of `host`, within `deadline`. A name is resolved on a thread of its own,
/// since the system's resolver has no deadline: one that hangs leaves that thread behind
/// until it answers, not the caller.
fn resolve(host: &str, port: u16, deadline: Instant) -> Result<Vec<SocketAddr>, Failure> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if Instant::now() >= deadline {
        return Err(Failure::TimedOut);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let name = host.to_owned();
    let resolver = std::thread::Builder::new()
        .name("dlm-postgres-resolve".into())
        .spawn(move || {
            let _ = tx.send(
                (name.as_str(), port)
                    .to_socket_addrs()
                    .map(Iterator::collect),
            );
        })
        .map_err(Failure::Socket)?;
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(resolved) => {
            // It has answered: its end is a moment away.
            let _ = resolver.join();
            resolved.map_err(Failure::Socket)
        }
        Err(_) => Err(Failure::TimedOut),
    }
}

/// Polls the connection's driver once; drops it when it has ended.
fn poll_driver(driver: &mut Option<Driver>, cx: &mut Context<'_>) {
    if let Some(d) = driver
        && let Poll::Ready(end) = d.as_mut().poll(cx)
    {
        if let Err(e) = end {
            log::debug!("dlm-postgres: a connection ended: {e}");
        }
        *driver = None;
    }
}

impl Connector {
    /// Opens a connection, within the connect timeout. Never applies anything.
    pub(crate) fn connect(&self) -> Result<Conn, BackendError> {
        let deadline = Instant::now() + self.connect_timeout;
        self.connect_by(deadline).map_err(|f| match f {
            Failure::TimedOut => self
                .sniff()
                .unwrap_or_else(|| f.connecting(&self.servers, self.connect_timeout)),
            f => f.connecting(&self.servers, self.connect_timeout),
        })
    }

    /// Each host in turn (in random order with `load_balance_hosts=random`), each of its
    /// addresses, until one gives a connection: the last failure otherwise.
    fn connect_by(&self, deadline: Instant) -> Result<Conn, Failure> {
        let config = &self.config;
        let (hosts, addrs, ports) = (
            config.get_hosts(),
            config.get_hostaddrs(),
            config.get_ports(),
        );
        let mut order: Vec<usize> = (0..hosts.len().max(addrs.len())).collect();
        if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
            use rand::seq::SliceRandom;
            order.shuffle(&mut rand::rng());
        }
        let mut last = None;
        for i in order {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let hostname = match hosts.get(i) {
                Some(Host::Tcp(h)) => h.as_str(),
                _ => "",
            };
            let mut targets: Vec<SocketAddr> = match addrs.get(i) {
                Some(ip) => vec![SocketAddr::new(*ip, port)],
                None => match resolve(hostname, port, deadline) {
                    Ok(a) => a,
                    Err(f) => {
                        last = Some(f);
                        continue;
                    }
                },
            };
            if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
                use rand::seq::SliceRandom;
                targets.shuffle(&mut rand::rng());
            }
            for addr in targets {
                let by = config
                    .get_connect_timeout()
                    .map_or(deadline, |t| deadline.min(Instant::now() + *t));
                match self.connect_to(addr, hostname, by) {
                    Ok(conn) => return Ok(conn),
                    Err(f) => last = Some(f),
                }
                if Instant::now() >= deadline {
                    return Err(Failure::TimedOut);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Failure::Socket(io::Error::new(
                io::ErrorKind::InvalidInput,
                "could not resolve any addresses",
            ))
        }))
    }

    /// One connection to `addr`: the socket and its options, TLS, authentication, and
    /// the check that the session is what `target_session_attrs` asks for.
    fn connect_to(
        &self,
        addr: SocketAddr,
        hostname: &str,
        deadline: Instant,
    ) -> Result<Conn, Failure> {
        let config = &self.config;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::TimedOut);
        }
        let stream = TcpStream::connect_timeout(&addr, left).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut => Failure::TimedOut,
            _ => Failure::Socket(e),
        })?;
        stream.set_nodelay(true).map_err(Failure::Socket)?;
        stream
            .set_write_timeout(Some(self.io_timeout))
            .map_err(Failure::Socket)?;
        if config.get_keepalives() {
            use rustix::net::sockopt;
            sockopt::set_socket_keepalive(&stream, true)
                .and_then(|()| sockopt::set_tcp_keepidle(&stream, config.get_keepalives_idle()))
                .and_then(|()| {
                    config
                        .get_keepalives_interval()
                        .map_or(Ok(()), |i| sockopt::set_tcp_keepintvl(&stream, i))
                })
                .and_then(|()| {
                    config
                        .get_keepalives_retries()
                        .map_or(Ok(()), |n| sockopt::set_tcp_keepcnt(&stream, n))
                })
                .map_err(|e| Failure::Socket(e.into()))?;
        }
        // Linux's (as tokio-postgres sets it): elsewhere the setting is not applied.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(t) = config.get_tcp_user_timeout() {
            let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX);
            rustix::net::sockopt::set_tcp_user_timeout(&stream, ms)
                .map_err(|e| Failure::Socket(e.into()))?;
        }
        let mut io = Io::new(stream);
        let socket = Socket(io.shared.clone());
        let mut driver: Option<Driver>;
        let client = match &self.tls {
            None => {
                let (client, connection) =
                    io.run(&mut None, deadline, config.connect_raw(socket, NoTls))?;
                driver = Some(Box::pin(connection));
                client
            }
            Some(tls) => {
                let tls = MakeTlsConnect::<Socket>::make_tls_connect(&mut tls.clone(), hostname)
                    .map_err(|e| Failure::Tls(e.to_string()))?;
                let (client, connection) =
                    io.run(&mut None, deadline, config.connect_raw(socket, tls))?;
                driver = Some(Box::pin(connection));
                client
            }
        };
        let attrs = config.get_target_session_attrs();
        if attrs != TargetSessionAttrs::Any {
            let answer = io.run(
                &mut driver,
                deadline,
                client.simple_query("SHOW transaction_read_only"),
            )?;
            let read_only = answer.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            });
            match read_only.as_deref() {
                Some("on") if attrs == TargetSessionAttrs::ReadWrite => {
                    return Err(Failure::Session("database does not allow writes"));
                }
                Some("off") if attrs == TargetSessionAttrs::ReadOnly => {
                    return Err(Failure::Session("database is not read only"));
                }
                Some(_) => {}
                None => return Err(Failure::Session("unexpected message from server")),
            }
        }
        Ok(Conn {
            client,
            driver,
            io,
            broken: false,
            prepared: HashMap::new(),
        })
    }
}
/// How long [`Connector::sniff`] waits for each server.
const SNIFF_TIMEOUT: Duration = Duration::from_millis(300);

impl Connector {
    /// After a connection attempt that timed out: whether a server accepted the
    /// connection and is not PostgreSQL but Redis (which waits, silent, for the end of a
    /// line that PostgreSQL's start-up message never has). Asks each with `PING`.
    fn sniff(&self) -> Option<BackendError> {
        use std::io::{Read, Write};
        for (host, port) in &self.hosts {
            let by = Instant::now() + SNIFF_TIMEOUT;
            let Some(addr) = resolve(host, *port, by)
                .ok()
                .and_then(|a| a.into_iter().next())
            else {
                continue;
            };
            let Ok(mut stream) = TcpStream::connect_timeout(&addr, SNIFF_TIMEOUT) else {
                continue;
            };
            let _ = stream.set_read_timeout(Some(SNIFF_TIMEOUT));
            let _ = stream.set_write_timeout(Some(SNIFF_TIMEOUT));
            let mut reply = [0u8; 1];
            if stream.write_all(b"PING\r\n").is_ok()
                && stream.read_exact(&mut reply).is_ok()
                && matches!(reply[0], b'+' | b'-')
            {
                return Some(
                    BackendError::new(
                        BackendErrorKind::Protocol,
                        format!(
                            "the server at {host}:{port} does not speak PostgreSQL's protocol: it answers as Redis does (is it the right port?)"
                        ),
                    )
                    .never_sent(),
                );
            }
        }
        None
    }
}

impl Conn {
    /// Whether the connection can take a request: not broken, and (after reading what the
    /// server may have sent meanwhile, such as its closing) not closed.
    pub(crate) fn is_usable(&mut self) -> bool {
        if self.broken {
            return false;
        }
        self.io.poke(&mut self.driver);
        !self.is_broken()
    }

    /// Whether a request broke the connection, or the connection saw it close.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken || self.driver.is_none() || self.client.is_closed()
    }

    /// Runs one statement with typed parameters, within `timeout`: prepared on this
    /// connection the first time (one round trip more, once), and then only bound and
    /// executed, while `prepare` holds; an unnamed statement otherwise (parsed and
    /// planned by the server every time, but nothing left on the session).
    ///
    /// Behind a connection pooler in transaction mode (PgBouncer before 1.21), a prepared
    /// statement may be missing from the server connection a request lands on, or another
    /// client's may have its name: the server refuses the request before running it, and
    /// `prepare` is turned off for good (for every connection of the backend) and the
    /// request sent again, unnamed.
    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        how: &How<'_>,
    ) -> Result<Vec<Row>, BackendError> {
        let (timeout, prepare) = (how.timeout, how.prepare);
        if prepare.load(Ordering::Relaxed) {
            match self.query_prepared(sql, params, timeout) {
                Err(Failure::Postgres(e))
                    if e.code().is_some_and(|c| {
                        *c == SqlState::INVALID_SQL_STATEMENT_NAME
                            || *c == SqlState::DUPLICATE_PSTATEMENT
                    }) =>
                {
                    if prepare.swap(false, Ordering::Relaxed) {
                        log::warn!(
                            "dlm-postgres: a prepared statement was not where it was prepared \
                             (a connection pooler in transaction mode?): statements are sent \
                             unprepared from now on ({e})"
                        );
                    }
                    self.prepared.clear();
                }
                answer => return self.answered(answer, timeout),
            }
        }
        let answer = self.io.run(
            &mut self.driver,
            Instant::now() + timeout,
            self.client.query_typed(sql, params),
        );
        self.answered(answer, timeout)
    }

    fn query_prepared(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        timeout: Duration,
    ) -> Result<Vec<Row>, Failure> {
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        let key = sql.as_ptr() as usize;
        let statement = match self.prepared.get(&key) {
            Some(s) => s.clone(),
            None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = self.io.run(
                    &mut self.driver,
                    Instant::now() + timeout,
                    self.client.prepare_typed(sql, &types),
                )?;
                self.prepared.insert(key, statement.clone());
                statement
            }
        };
        let answer = self.io.run(
            &mut self.driver,
            Instant::now() + timeout,
            self.client.query(&statement, &values),
        );
        if answer.is_err() {
            // A statement the server no longer has, or whose plan changed: prepared again
            // next time.
            self.prepared.remove(&key);
        }
        answer
    }

    fn answered(
        &mut self,
        answer: Result<Vec<Row>, Failure>,
        timeout: Duration,
    ) -> Result<Vec<Row>, BackendError> {
        answer.map_err(|f| {
            if f.leaves_broken() {
                self.broken = true;
            }
            f.requesting(timeout)
        })
    }

    /// Runs `sql` (several statements: one transaction) as a simple query.
    pub(crate) fn batch(&mut self, sql: &str, timeout: Duration) -> Result<(), BackendError> {
        let answer = self.io.run(
            &mut self.driver,
            Instant::now() + timeout,
            self.client.batch_execute(sql),
        );
        answer.map_err(|f| {
            if f.leaves_broken() {
                self.broken = true;
            }
            f.requesting(timeout)
        })
    }
}

/// A request that did not come back with an answer.
pub(crate) enum Failure {
    /// Its deadline passed.
    TimedOut,
    /// The server or the connection said why.
    Postgres(tokio_postgres::Error),
    /// The socket, before the protocol began or while waiting for the server.
    Socket(io::Error),
    /// The TLS settings could not be used for this server (its name).
    Tls(String),
    /// The session is not what `target_session_attrs` asks for (or its answer made no
    /// sense).
    Session(&'static str),
}

/// `future`, bounded by `timeout`, on a `tokio` runtime (the listening connection's: see
/// `hints.rs`; requests run in `Io::run`).
pub(crate) async fn within<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, future).await {
        Ok(answer) => answer.map_err(Failure::Postgres),
        Err(_) => Err(Failure::TimedOut),
    }
}

impl Failure {
    fn leaves_broken(&self) -> bool {
        match self {
            Failure::TimedOut | Failure::Socket(_) | Failure::Tls(_) | Failure::Session(_) => true,
            Failure::Postgres(e) => e.as_db_error().is_none() || e.is_closed(),
        }
    }

    /// What a failed connection attempt means. Nothing was applied.
    pub(crate) fn connecting(self, servers: &str, deadline: Duration) -> BackendError {
        let at = format!("connecting to PostgreSQL at {servers}");
        let (kind, what) = match self {
            Failure::TimedOut => (
                BackendErrorKind::Timeout,
                format!("{at} took more than {deadline:?}"),
            ),
            Failure::Socket(e) => (
                BackendErrorKind::Unavailable,
                format!("{at}: error connecting to server: {e}"),
            ),
            Failure::Tls(e) => (
                BackendErrorKind::Tls,
                format!("{at}: error performing TLS handshake: {e}"),
            ),
            Failure::Session(what) => return Self::classified(servers, what.to_owned(), None),
            Failure::Postgres(e) => {
                let code = e.as_db_error().map(|db| db.code());
                return Self::classified(servers, chain(&e), code);
            }
        };
        BackendError::new(kind, what).never_sent()
    }

    /// A failed connection attempt's error, from its text (`chain`) and the server's
    /// error code if it sent one.
    fn classified(servers: &str, chain: String, code: Option<&SqlState>) -> BackendError {
        let kind = if let Some(code) = code {
            db_kind(code)
        } else if chain.contains("database does not allow writes") {
            BackendErrorKind::ReadOnly
        } else if chain.contains("error performing TLS handshake")
            || chain.contains("server does not support TLS")
        {
            BackendErrorKind::Tls
        } else if chain.contains("authentication error") || chain.contains("password missing") {
            BackendErrorKind::Auth
        } else if chain.contains("unexpected message from server") {
            BackendErrorKind::Protocol
        } else {
            BackendErrorKind::Unavailable
        };
        let what = match kind {
            BackendErrorKind::ReadOnly => format!(
                "no server at {servers} accepts writes (a standby, or target_session_attrs asks for one): {chain}"
            ),
            BackendErrorKind::Protocol => format!(
                "the server at {servers} does not speak PostgreSQL's protocol (is it the right port?): {chain}"
            ),
            _ => format!("connecting to PostgreSQL at {servers}: {chain}"),
        };
        BackendError::new(kind, what).never_sent()
    }

    /// What a failed request means. A statement the server refused with an error was
    /// rolled back (every request is one transaction): never applied. One that timed out
    /// or lost its connection may have been.
    pub(crate) fn requesting(self, timeout: Duration) -> BackendError {
        match self {
            Failure::TimedOut => BackendError::new(
                BackendErrorKind::Timeout,
                format!("PostgreSQL did not answer within {timeout:?}"),
            ),
            Failure::Postgres(e) => {
                let chain = chain(&e);
                match e.as_db_error() {
                    // A fatal error ends the session: the server may have committed the
                    // statement before it (an administrator's pg_terminate_backend).
                    Some(db) if db.severity() == "FATAL" || db.severity() == "PANIC" => {
                        BackendError::new(db_kind(db.code()), format!("PostgreSQL: {chain}"))
                    }
                    Some(db) => {
                        BackendError::new(db_kind(db.code()), format!("PostgreSQL: {chain}"))
                            .never_sent()
                    }
                    None => BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("PostgreSQL connection: {chain}"),
                    ),
                }
            }
            Failure::Socket(e) => BackendError::new(
                BackendErrorKind::Unavailable,
                format!("PostgreSQL connection: {e}"),
            ),
            Failure::Tls(e) => BackendError::new(BackendErrorKind::Tls, format!("PostgreSQL: {e}")),
            Failure::Session(what) => {
                BackendError::new(BackendErrorKind::Unavailable, format!("PostgreSQL: {what}"))
            }
        }
    }
}

/// The error and its causes, in one line.
fn chain(e: &tokio_postgres::Error) -> String {
    let mut s = match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if e.as_db_error().is_none() {
            s.push_str(": ");
            s.push_str(&cause.to_string());
        }
        source = cause.source();
    }
    s
}

/// The kind of a server's error code.
pub(crate) fn db_kind(code: &SqlState) -> BackendErrorKind {
    let c = code.code();
    if *code == SqlState::INVALID_PASSWORD || c.starts_with("28") {
        BackendErrorKind::Auth
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        BackendErrorKind::Permission
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        BackendErrorKind::ReadOnly
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        BackendErrorKind::Busy
    } else if *code == SqlState::PROTOCOL_VIOLATION {
        // A pooler refusing a start-up parameter, a server refusing what it was sent:
        // not an outage, and no retry changes it.
        BackendErrorKind::Protocol
    } else if *code == SqlState::QUERY_CANCELED {
        BackendErrorKind::Timeout
    } else if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") {
        // Connection exceptions, operator intervention (shutdown, terminated backend,
        // starting up), insufficient resources.
        BackendErrorKind::Unavailable
    } else {
        BackendErrorKind::Other
    }
}
