//! The connections of one backend: at most `max` open, idle ones kept for the next
//! request, a new one opened on the caller's thread when none is idle.
//!
//! Opening on the caller's thread (not in a pool's background thread, as r2d2 does) is
//! what lets the first request fail with the connection's own error (a wrong password,
//! a missing database, a standby) instead of a pool's "timed out waiting for a
//! connection".

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind};
use parking_lot::{Condvar, Mutex};

use crate::conn::{Conn, Connector};

/// The connections.
pub(crate) struct Pool {
    connector: Connector,
    max: usize,
    state: Mutex<State>,
    freed: Condvar,
}

/// How long a connection may have been idle and still be lent without first letting
/// its runtime look for a close from the server (a restarted server): a connection given
/// back moments ago is lent at once, which saves two turns of the runtime per request
/// under load.
const CHECK_AFTER_IDLE: Duration = Duration::from_millis(50);

struct State {
    /// Idle connections, with when each was given back.
    idle: Vec<(Conn, Instant)>,
    /// Open connections, idle or lent (and ones being opened).
    open: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Pool")
            .field("connector", &self.connector)
            .field("max", &self.max)
            .field("open", &s.open)
            .field("idle", &s.idle.len())
            .finish()
    }
}

impl Pool {
    pub(crate) fn new(connector: Connector, max: usize) -> Pool {
        Pool {
            connector,
            max,
            state: Mutex::new(State {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// A connection: an idle one that still works, else a new one if fewer than `max`
    /// are open, else the first one given back within the connect timeout. Nothing has
    /// been sent when this fails.
    pub(crate) fn get(&self) -> Result<Lent<'_>, BackendError> {
        let deadline = Instant::now() + self.connector.connect_timeout;
        let mut state = self.state.lock();
        loop {
            while let Some((mut conn, since)) = state.idle.pop() {
                drop(state);
                if (since.elapsed() < CHECK_AFTER_IDLE && !conn.is_broken()) || conn.is_usable() {
                    return Ok(Lent {
                        pool: self,
                        conn: Some(conn),
                    });
                }
                drop(conn);
                state = self.state.lock();
                state.open -= 1;
            }
            if state.open < self.max {
                state.open += 1;
                drop(state);
                return match self.connector.connect() {
                    Ok(conn) => Ok(Lent {
                        pool: self,
                        conn: Some(conn),
                    }),
                    Err(e) => {
                        self.state.lock().open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            if self.freed.wait_until(&mut state, deadline).timed_out() {
                return Err(BackendError::new(
                    BackendErrorKind::Busy,
                    format!(
                        "all {} connections to PostgreSQL stayed in use for {:?}",
                        self.max, self.connector.connect_timeout
                    ),
                )
                .never_sent());
            }
        }
    }

    /// The longest a request may take.
    pub(crate) fn io_timeout(&self) -> Duration {
        self.connector.io_timeout
    }

    fn give_back(&self, conn: Conn) {
        let usable = !conn.is_broken();
        let mut state = self.state.lock();
        if usable {
            state.idle.push((conn, Instant::now()));
        } else {
            state.open -= 1;
            drop(state);
            drop(conn);
        }
        self.freed.notify_one();
    }
}

/// A connection lent by the pool; given back when dropped (closed if it broke).
pub(crate) struct Lent<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
}

impl Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("lent")
    }
}

impl DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("lent")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.give_back(conn);
        }
    }
}
