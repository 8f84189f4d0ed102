//! Pooled connections: the r2d2 manager with timeouts, and connections that remember when
//! they can no longer be trusted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind};
use parking_lot::Mutex;
use redis::ConnectionLike;

use super::endpoint::{Endpoint, Timeouts};
use crate::transport::Wire;

/// A pooled connection that remembers when it can no longer be trusted: after a timeout
/// or I/O error a late reply may still be in flight, so the connection is discarded.
pub(crate) struct Conn {
    pub(crate) con: Wire,
    pub(crate) broken: bool,
    /// The endpoint's generation when it was made (see [`Endpoint::generation`]).
    generation: u64,
    /// When it was last given back to the pool (or made).
    idle_since: Instant,
}

/// How long a pooled connection must have been idle before a checkout looks whether the
/// server closed it. A busy connection is not looked at: the `poll` cost 3-4% of
/// uncontended throughput on one server (bench, 2 cores), and a server closes
/// connections (a restart, `CLIENT KILL`, a Sentinel demotion) on a scale of
/// milliseconds or more.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(1);

impl Conn {
    /// Whether this idle connection must not be used: the server closed it, or (Sentinel)
    /// it goes to an address that is no longer the master's.
    pub(crate) fn is_stale(&self, endpoint: &Endpoint) -> bool {
        self.is_outdated(endpoint)
            || (self.idle_since.elapsed() >= IDLE_CHECK_AFTER && self.con.closed_while_idle())
    }

    /// Whether it was made for an address the endpoint has moved away from (Sentinel).
    fn is_outdated(&self, endpoint: &Endpoint) -> bool {
        self.generation != endpoint.generation()
    }
}

/// The r2d2 manager: connects with a connect timeout and sets read and write timeouts
/// (the redis crate's own manager sets none, so a paused server hangs a checkout forever).
/// Lock connections are [`Wire`]s.
#[derive(Debug)]
pub(crate) struct Manager {
    pub(crate) endpoint: Endpoint,
    pub(crate) timeouts: Timeouts,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = BackendError;

    fn connect(&self) -> Result<Conn, BackendError> {
        let (con, generation) = self.endpoint.connect_in_generation(self.timeouts)?;
        Ok(Conn {
            con,
            broken: false,
            generation,
            idle_since: Instant::now(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), BackendError> {
        redis::cmd("PING")
            .query::<()>(&mut conn.con)
            .map_err(|e| self.endpoint.error(&e))
    }

    /// Called by r2d2 when a connection is given back, and only then: the start of its
    /// idle time is noted here.
    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.idle_since = Instant::now();
        // A connection that still owes replies (given up on before they came) would answer
        // its next request with them.
        conn.broken
            || !conn.con.is_open()
            || conn.con.owed() > 0
            || conn.is_outdated(&self.endpoint)
    }
}

/// What the pool's connection attempts have shown: whether the server is down (its last
/// connection attempt failed and none has succeeded since), and the kind of that failure.
/// r2d2 keeps only the text of the last connect error; the kind lets a failed checkout
/// report `Auth` (never retried) rather than a transient `Unavailable`.
#[derive(Debug, Default, Clone)]
struct Connects(Arc<ConnectState>);

#[derive(Debug, Default)]
struct ConnectState {
    /// The last connect failure: its kind and its message (whose words are the OS's, the
    /// resolver's or the server's).
    last: Mutex<Option<(BackendErrorKind, String)>>,
    down: AtomicBool,
    /// How many connection attempts have failed, ever.
    failures: AtomicUsize,
}

impl r2d2::HandleError<BackendError> for Connects {
    fn handle_error(&self, error: BackendError) {
        log::debug!("redis connection failed: {error}");
        *self.0.last.lock() = Some((error.kind(), error.message().to_owned()));
        self.0.down.store(true, Ordering::Release);
        self.0.failures.fetch_add(1, Ordering::AcqRel);
    }
}

impl Connects {
    /// The kind of error for a call that found no connection: the last connect failure's
    /// kind when it was a refusal of the credentials or (if `timeouts` is set) a timeout,
    /// otherwise `Unavailable`.
    fn failure(&self, timeouts: bool) -> BackendErrorKind {
        match *self.0.last.lock() {
            Some((
                kind @ (BackendErrorKind::Auth
                | BackendErrorKind::Permission
                | BackendErrorKind::Tls),
                _,
            )) => kind,
            Some((BackendErrorKind::Timeout, _)) if timeouts => BackendErrorKind::Timeout,
            _ => BackendErrorKind::Unavailable,
        }
    }

    /// How many connection attempts have failed so far.
    fn failures(&self) -> usize {
        self.0.failures.load(Ordering::Acquire)
    }

    /// The last connect failure, as it was reported.
    fn last_error(&self) -> Option<BackendError> {
        self.0
            .last
            .lock()
            .as_ref()
            .map(|(kind, message)| BackendError::new(*kind, message.clone()))
    }
}

impl r2d2::HandleEvent for Connects {
    fn handle_acquire(&self, _: r2d2::event::AcquireEvent) {
        self.0.down.store(false, Ordering::Release);
        *self.0.last.lock() = None;
    }
}

/// The slices in which a checkout waits for a new connection (see `Node::checkout`).
const CHECKOUT_SLICE: Duration = Duration::from_millis(10);

/// How much longer than the connect timeout a checkout waits for the verdict of the
/// connection attempt it started (which has the connect timeout for itself, and starts
/// a little after the checkout on the pool's thread).
const CHECKOUT_GRACE: Duration = Duration::from_millis(50);

/// The connections to one server: an r2d2 pool whose checkouts give up as soon as a
/// connection attempt has failed, and which knows when the server is down.
pub(crate) struct Pool {
    pool: r2d2::Pool<Manager>,
    connects: Connects,
    connect_timeout: Duration,
    endpoint: Endpoint,
}

impl Pool {
    /// A pool that connects lazily: a server that is down at start does not fail
    /// construction, it fails the checkouts that need it.
    pub(crate) fn new(
        endpoint: Endpoint,
        timeouts: Timeouts,
        size: u32,
        thread_pool: Arc<scheduled_thread_pool::ScheduledThreadPool>,
    ) -> Pool {
        let connects = Connects::default();
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(timeouts.connect)
            .error_handler(Box::new(connects.clone()))
            .event_handler(Box::new(connects.clone()))
            .thread_pool(thread_pool)
            .build_unchecked(Manager {
                endpoint: endpoint.clone(),
                timeouts,
            });
        Pool {
            pool,
            connects,
            connect_timeout: timeouts.connect,
            endpoint,
        }
    }

    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The most connections it keeps.
    pub(crate) fn max_size(&self) -> u32 {
        self.pool.max_size()
    }

    /// The pool's counts, for `Debug`.
    pub(crate) fn state(&self) -> r2d2::State {
        self.pool.state()
    }

    /// A pooled connection, or a new one within the connect timeout. r2d2's `get` waits
    /// the whole timeout even when every connection attempt is refused at once (a server
    /// that died, a master a failover left behind); so the wait is taken in short slices,
    /// and ends as soon as an attempt made meanwhile has failed.
    ///
    /// A failed attempt is reported as it is (the connect error names the server and
    /// says why in the OS's, the resolver's or the server's words; a TLS port spoken to
    /// in plain text says so): one clause per layer, never r2d2's "timed out waiting for
    /// connection" wrapped around it.
    pub(crate) fn checkout(&self) -> Result<r2d2::PooledConnection<Manager>, BackendError> {
        let start = Instant::now();
        let failures = self.connects.failures();
        let limit = self.connect_timeout + CHECKOUT_GRACE;
        loop {
            let left = limit.saturating_sub(start.elapsed());
            match self.pool.get_timeout(left.min(CHECKOUT_SLICE)) {
                Ok(conn) => return Ok(conn),
                Err(_) if self.connects.failures() != failures => {
                    return Err(self.connects.last_error().unwrap_or_else(|| {
                        BackendError::new(
                            BackendErrorKind::Unavailable,
                            format!("{}: the connection attempt failed", self.endpoint()),
                        )
                    }));
                }
                Err(_) if left <= CHECKOUT_SLICE => {
                    return Err(BackendError::new(
                        self.connects.failure(true),
                        format!(
                            "{}: no connection within {:?}",
                            self.endpoint(),
                            self.connect_timeout
                        ),
                    ));
                }
                Err(_) => {}
            }
        }
    }

    /// An idle pooled connection, if one is ready (never connects, never waits).
    pub(crate) fn idle(&self) -> Option<r2d2::PooledConnection<Manager>> {
        self.pool.try_get()
    }

    /// An error at once, without waiting, when the server is down: its last connection
    /// attempt failed (refused, timed out, or refused the credentials), none has
    /// succeeded since, and no connection is idle. The pool keeps trying to connect in
    /// the background (every half connect timeout at most), and the first success ends
    /// this; meanwhile a call costs nothing instead of a whole connect timeout.
    pub(crate) fn down(&self) -> Option<BackendError> {
        if !self.connects.0.down.load(Ordering::Acquire) || self.pool.state().idle_connections > 0 {
            return None;
        }
        Some(BackendError::new(
            // A down server answers at once: no timeout to report.
            self.connects.failure(false),
            match self.connects.last_error() {
                Some(last) => format!(
                    "{} (the last connection attempt; retrying in the background)",
                    last.message()
                ),
                None => format!(
                    "{}: down (the last connection attempt failed; retrying in the background)",
                    self.endpoint()
                ),
            },
        ))
    }
}
