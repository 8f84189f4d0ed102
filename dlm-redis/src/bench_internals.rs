//! dlm's own connection, exposed for one purpose: dlm-bench's transport A/B (the same
//! client code over `redis::Connection` and over this). Behind the `bench-internals`
//! feature, hidden from the docs, with no stability promise.

use std::time::Duration;

use dlm_core::BackendError;

use crate::conn::{Endpoint, ParsedUrl, Timeouts};
use crate::transport::Wire;

/// One connection as dlm's backends open it (plain `redis://` URLs only: TLS needs a
/// backend's loaded configuration).
pub struct Connection(Wire);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

impl Connection {
    /// Connects to `url` with dlm's handshake (`PING`, or `AUTH`/`SELECT` as asked).
    ///
    /// # Errors
    /// A malformed or `rediss://` URL, or a failed connect.
    pub fn open(url: &str, timeout: Duration) -> Result<Connection, BackendError> {
        let invalid = |e: dlm_core::InvalidArgument| {
            BackendError::new(dlm_core::BackendErrorKind::Protocol, e.to_string())
        };
        let endpoint =
            Endpoint::new(ParsedUrl::parse(url).map_err(invalid)?, None).map_err(invalid)?;
        endpoint
            .connect(Timeouts {
                connect: timeout,
                io: timeout,
            })
            .map(Connection)
    }

    /// Writes one packed request.
    ///
    /// # Errors
    /// An I/O error.
    pub fn send_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<()> {
        self.0.send(cmd, 1)
    }

    /// Reads one reply.
    ///
    /// # Errors
    /// An I/O or protocol error.
    pub fn recv_response(&mut self) -> redis::RedisResult<redis::Value> {
        self.0.receive()
    }
}

/// The key of every hash slot's fencing stream under the default prefix
/// (`dlm:fence:{tag}`), and how long dlm keeps one after its last draw: dlm-bench makes
/// them all, as a server that has served locks of many names has them.
pub fn fencing_streams() -> (Vec<String>, Duration) {
    let keys = crate::protocol::Keys::new(
        crate::options::Options::single().prefix,
        crate::options::DEFAULT_FENCE_TTL,
    );
    let keys = (0..crate::slot::SLOTS)
        .map(|slot| keys.fence_of_slot(slot as u16))
        .collect();
    (keys, crate::options::DEFAULT_FENCE_TTL)
}
