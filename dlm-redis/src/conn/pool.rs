//! Pooled connections: the r2d2 manager with timeouts, and connections that remember when
//! they can no longer be trusted.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
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

    /// It is given back: notes the start of its idle time, and whether it must be
    /// discarded. A connection that still owes replies (given up on before they came)
    /// would answer its next request with them.
    fn given_back(&mut self, endpoint: &Endpoint) -> bool {
        self.idle_since = Instant::now();
        self.broken || !self.con.is_open() || self.con.owed() > 0 || self.is_outdated(endpoint)
    }
}

/// The r2d2 manager: connects with a connect timeout and sets read and write timeouts
/// (the redis crate's own manager sets none, so a paused server hangs a checkout forever).
/// Lock connections are [`Wire`]s.
#[derive(Debug, Clone)]
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
        conn.given_back(&self.endpoint)
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
        self.succeeded();
    }
}

impl Connects {
    /// A connection attempt succeeded: the server is up.
    fn succeeded(&self) {
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
/// connection attempt has failed, and which knows when the server is down; and, before
/// it, the connection the pool's first checkout made on its caller's thread.
///
/// r2d2 makes its connections on a maintenance thread, so a program's first request
/// waited for a thread to start and for a hand-off to it and back; a short-lived program
/// (a `dlm run`) paid that on its critical path, for one connection. So the first
/// checkout connects itself (the same connect, with the same timeouts and errors) and the
/// pool keeps that connection apart, handing it out before r2d2's; the r2d2 pool and its
/// thread are made when a checkout finds that connection busy or gone (a second thread
/// at once, a broken connection, a failed first attempt, which r2d2 then retries in the
/// background). With `pool_size` 1 the r2d2 pool does it all, as before.
pub(crate) struct Pool {
    /// Made on first need (see [`Pool::shared`]).
    pool: OnceLock<r2d2::Pool<Manager>>,
    manager: Manager,
    size: u32,
    own: Arc<OwnSlot>,
    connects: Connects,
    connect_timeout: Duration,
    endpoint: Endpoint,
}

/// The connection made by a pool's first checkout, while it is idle.
struct OwnSlot {
    endpoint: Endpoint,
    state: Mutex<Own>,
}

#[derive(Default)]
struct Own {
    /// Whether the first checkout has connected (or tried): it is done once.
    tried: bool,
    idle: Option<Conn>,
}

/// A connection checked out of a [`Pool`]: r2d2's, or the pool's own (see [`Pool`]).
/// Either goes back to where it came from when dropped, unless it must be discarded.
pub(crate) enum Pooled {
    Shared(r2d2::PooledConnection<Manager>),
    Own(OwnConn),
}

/// The pool's own connection, checked out.
pub(crate) struct OwnConn {
    conn: Option<Conn>,
    slot: Arc<OwnSlot>,
}

impl Drop for OwnConn {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && !conn.given_back(&self.slot.endpoint)
        {
            self.slot.state.lock().idle = Some(conn);
        }
    }
}

impl Deref for Pooled {
    type Target = Conn;

    fn deref(&self) -> &Conn {
        match self {
            Pooled::Shared(c) => c,
            Pooled::Own(c) => c.conn.as_ref().expect("present until dropped"),
        }
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        match self {
            Pooled::Shared(c) => c,
            Pooled::Own(c) => c.conn.as_mut().expect("present until dropped"),
        }
    }
}

impl Pool {
    /// A pool that connects lazily: a server that is down at start does not fail
    /// construction, it fails the checkouts that need it.
    pub(crate) fn new(endpoint: Endpoint, timeouts: Timeouts, size: u32) -> Pool {
        Pool {
            pool: OnceLock::new(),
            manager: Manager {
                endpoint: endpoint.clone(),
                timeouts,
            },
            size,
            own: Arc::new(OwnSlot {
                endpoint: endpoint.clone(),
                state: Mutex::new(Own::default()),
            }),
            connects: Connects::default(),
            connect_timeout: timeouts.connect,
            endpoint,
        }
    }

    /// The r2d2 pool, made (with its maintenance thread) on first need.
    fn shared(&self) -> &r2d2::Pool<Manager> {
        self.pool.get_or_init(|| {
            // One maintenance thread per server: r2d2 opens new connections on it, and a
            // paused server (handshake done by the kernel, then silence) holds it for a
            // whole connect timeout, which must not stall the other servers' pools.
            let threads = Arc::new(
                scheduled_thread_pool::ScheduledThreadPool::builder()
                    .num_threads(1)
                    .thread_name_pattern("dlm-redis-pool")
                    // The pool's only timed job is the idle-connection reaper: when the
                    // pool is gone, stop at once instead of waiting for its next run.
                    .on_drop_behavior(
                        scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                    )
                    .build(),
            );
            r2d2::Pool::builder()
                .max_size(self.size)
                .min_idle(Some(0))
                .test_on_check_out(false)
                .connection_timeout(self.connect_timeout)
                .error_handler(Box::new(self.connects.clone()))
                .event_handler(Box::new(self.connects.clone()))
                .thread_pool(threads)
                .build_unchecked(self.manager.clone())
        })
    }

    /// The pool's own connection, if it is idle.
    fn own_idle(&self) -> Option<Pooled> {
        let conn = self.own.state.lock().idle.take()?;
        Some(Pooled::Own(OwnConn {
            conn: Some(conn),
            slot: self.own.clone(),
        }))
    }

    /// The first checkout's connection, made on the caller's thread: `None` when it was
    /// made (or tried) already. A failed attempt is reported as r2d2's would be, and
    /// r2d2 then goes on trying in the background (see [`Pool::down`]).
    fn first_connection(&self) -> Option<Result<Pooled, BackendError>> {
        if self.size < 2 {
            return None;
        }
        {
            let mut own = self.own.state.lock();
            if own.tried {
                return None;
            }
            own.tried = true;
        }
        use r2d2::ManageConnection;
        Some(match self.manager.connect() {
            Ok(conn) => {
                self.connects.succeeded();
                Ok(Pooled::Own(OwnConn {
                    conn: Some(conn),
                    slot: self.own.clone(),
                }))
            }
            Err(e) => {
                use r2d2::HandleError;
                self.connects.handle_error(e.duplicate());
                // Starts r2d2's attempts (none is idle: it connects in the background).
                let _ = self.shared().get_timeout(Duration::ZERO);
                Err(e)
            }
        })
    }

    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The most connections r2d2 keeps (the pool's own is one more).
    pub(crate) fn max_size(&self) -> u32 {
        self.size
    }

    /// The pool's counts, for `Debug`: (r2d2's connections, idle ones), the own
    /// connection included.
    pub(crate) fn counts(&self) -> (u32, u32) {
        let own = u32::from(self.own.state.lock().idle.is_some());
        let (all, idle) = self.pool.get().map_or((0, 0), |p| {
            let s = p.state();
            (s.connections, s.idle_connections)
        });
        (all + own, idle + own)
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
    pub(crate) fn checkout(&self) -> Result<Pooled, BackendError> {
        if let Some(conn) = self.own_idle() {
            return Ok(conn);
        }
        if let Some(first) = self.first_connection() {
            return first;
        }
        let start = Instant::now();
        let failures = self.connects.failures();
        let limit = self.connect_timeout + CHECKOUT_GRACE;
        loop {
            let left = limit.saturating_sub(start.elapsed());
            match self.shared().get_timeout(left.min(CHECKOUT_SLICE)) {
                Ok(conn) => return Ok(Pooled::Shared(conn)),
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
    pub(crate) fn idle(&self) -> Option<Pooled> {
        self.own_idle()
            .or_else(|| self.pool.get()?.try_get().map(Pooled::Shared))
    }

    /// An error at once, without waiting, when the server is down: its last connection
    /// attempt failed (refused, timed out, or refused the credentials), none has
    /// succeeded since, and no connection is idle. The pool keeps trying to connect in
    /// the background (every half connect timeout at most), and the first success ends
    /// this; meanwhile a call costs nothing instead of a whole connect timeout.
    pub(crate) fn down(&self) -> Option<BackendError> {
        if !self.connects.0.down.load(Ordering::Acquire) || self.counts().1 > 0 {
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
