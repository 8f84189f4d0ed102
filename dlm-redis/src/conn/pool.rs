//! Pooled connections: the r2d2 manager with timeouts, and connections that remember when
//! they can no longer be trusted.

use std::time::{Duration, Instant};

use dlm_core::BackendError;
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
