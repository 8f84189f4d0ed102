//! One connection to the server, used synchronously: a `tokio-postgres` client on a
//! private single-threaded runtime, every request bounded by a deadline of its own. What
//! a failure means, as a [`BackendError`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind};
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Row, Statement};
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

/// A connection. Its runtime drives the connection only while a request is under way.
pub(crate) struct Conn {
    runtime: Runtime,
    pub(crate) client: Client,
    /// A request failed in a way that leaves the connection unusable (a timeout: its
    /// reply may still come).
    broken: bool,
    /// The statements prepared on this connection, by the address of their SQL (the
    /// backend's `Statements`, which outlive its connections: no hashing of the text).
    prepared: HashMap<usize, Statement>,
}

impl Connector {
    /// Opens a connection, within the connect timeout. Never applies anything.
    pub(crate) fn connect(&self) -> Result<Conn, BackendError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                BackendError::new(
                    BackendErrorKind::Other,
                    format!("cannot start a connection's runtime: {e}"),
                )
                .never_sent()
            })?;
        let deadline = self.connect_timeout;
        let client = match &self.tls {
            None => runtime.block_on(async {
                let (client, connection) = within(deadline, self.config.connect(NoTls)).await?;
                tokio::spawn(connection);
                Ok::<_, Failure>(client)
            }),
            Some(tls) => runtime.block_on(async {
                let (client, connection) =
                    within(deadline, self.config.connect(tls.clone())).await?;
                tokio::spawn(connection);
                Ok::<_, Failure>(client)
            }),
        }
        .map_err(|f| match f {
            Failure::TimedOut => self
                .sniff()
                .unwrap_or_else(|| f.connecting(&self.servers, deadline)),
            f => f.connecting(&self.servers, deadline),
        })?;
        Ok(Conn {
            runtime,
            client,
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
        use std::net::{TcpStream, ToSocketAddrs};
        for (host, port) in &self.hosts {
            let Some(addr) = (host.as_str(), *port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
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
    /// Whether the connection can take a request: not broken, and (after letting the
    /// runtime read what the server may have sent meanwhile, such as its closing) not
    /// closed.
    pub(crate) fn is_usable(&mut self) -> bool {
        if self.broken {
            return false;
        }
        // The first yield lets the runtime poll its I/O driver (without waiting), which
        // wakes the connection's task if the server closed the socket; the second lets
        // that task run and end.
        self.runtime.block_on(async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        });
        !self.client.is_closed()
    }

    /// Whether a request broke the connection, or the connection task saw it close.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken || self.client.is_closed()
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
        let client = &self.client;
        let answer = self
            .runtime
            .block_on(within(timeout, client.query_typed(sql, params)));
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
                let client = &self.client;
                let statement = self
                    .runtime
                    .block_on(within(timeout, client.prepare_typed(sql, &types)))?;
                self.prepared.insert(key, statement.clone());
                statement
            }
        };
        let client = &self.client;
        let answer = self
            .runtime
            .block_on(within(timeout, client.query(&statement, &values)));
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
        let client = &self.client;
        let answer = self
            .runtime
            .block_on(within(timeout, client.batch_execute(sql)));
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
}

/// `future`, bounded by `timeout`.
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
            Failure::TimedOut => true,
            Failure::Postgres(e) => e.as_db_error().is_none() || e.is_closed(),
        }
    }

    /// What a failed connection attempt means. Nothing was applied.
    pub(crate) fn connecting(self, servers: &str, deadline: Duration) -> BackendError {
        let e = match self {
            Failure::TimedOut => {
                return BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("connecting to PostgreSQL at {servers} took more than {deadline:?}"),
                )
                .never_sent();
            }
            Failure::Postgres(e) => e,
        };
        let chain = chain(&e);
        let kind = if let Some(db) = e.as_db_error() {
            db_kind(db.code())
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
