//! One connection to the server, used synchronously: `tokio-postgres`'s protocol, run by
//! the caller's thread over a blocking socket of dlm's own, every request bounded by a
//! deadline of its own. No runtime and no timer: the thread waits for the server in a
//! blocking read, bounded by the socket's read timeout (`io.rs`). Opening one: every host
//! of the URL in turn, TLS, authentication and the session check.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind};
use tokio_postgres::config::{LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Row, SimpleQueryMessage, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

pub(crate) use crate::failure::{Failure, within};
use crate::io::{Driver, Io, Socket};

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
        // The builder checked them: TCP hosts only, one port or one per host, no hostaddr
        // or one per host.
        let addrs = config.get_hostaddrs();
        let mut order: Vec<usize> = (0..self.hosts.len()).collect();
        if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
            use rand::seq::SliceRandom;
            order.shuffle(&mut rand::rng());
        }
        let mut last = None;
        for i in order {
            let (hostname, port) = (self.hosts[i].0.as_str(), self.hosts[i].1);
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
        let socket = io.socket();
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
                    return Err(Failure::Session(
                        BackendErrorKind::ReadOnly,
                        "database does not allow writes",
                    ));
                }
                Some("off") if attrs == TargetSessionAttrs::ReadOnly => {
                    return Err(Failure::Session(
                        BackendErrorKind::Unavailable,
                        "database is not read only",
                    ));
                }
                Some(_) => {}
                None => {
                    return Err(Failure::Session(
                        BackendErrorKind::Protocol,
                        "unexpected message from server",
                    ));
                }
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

    /// A request's answer; a failure that leaves the connection unusable marks it broken.
    fn answered<T>(
        &mut self,
        answer: Result<T, Failure>,
        timeout: Duration,
    ) -> Result<T, BackendError> {
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
        self.answered(answer, timeout)
    }
}
