//! The resource side of fencing for values stored in Redis.

use std::fmt;
use std::sync::LazyLock;

use dlm_core::{BackendError, FencingToken, StaleToken};
use redis::{ConnectionLike, Script};

use crate::conn::map_error;

static FENCED_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("protocol/lua/fenced_set.lua")));

/// Why a fenced write was not applied.
#[derive(Debug)]
#[non_exhaustive]
pub enum FencedWriteError {
    /// The token is older than the one stored with the value: the writer's lock was taken
    /// over meanwhile.
    Stale(StaleToken),
    /// Redis failed.
    Backend(BackendError),
}

impl fmt::Display for FencedWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FencedWriteError::Stale(e) => e.fmt(f),
            FencedWriteError::Backend(e) => e.fmt(f),
        }
    }
}

/// Transparent, like [`dlm_core::Error`]: the variants display the inner error and pass
/// on its source, so a chain prints each message once.
impl std::error::Error for FencedWriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FencedWriteError::Stale(e) => e.source(),
            FencedWriteError::Backend(e) => e.source(),
        }
    }
}

/// Stores `value` at `key` (a hash with the fields `value` and `fence`) only if `token`
/// is not older than the token stored there; atomic (one Lua script). An equal token is
/// accepted: tokens strictly increase from one holder to the next, so an equal token is
/// the same holder writing again.
///
/// Use it for a value the lock protects, with the guard's
/// [`fencing_token`](dlm_core::LockGuard::fencing_token): a holder that was paused past its
/// lease cannot overwrite what a newer holder wrote. `con` is any connection of the
/// [`redis`](crate::redis) crate (re-exported: no dependency of your own needed); for a
/// value on the lock's own server, [`RedisBackend::fenced_set`](crate::RedisBackend::fenced_set)
/// uses the backend's connections instead.
///
/// ```no_run
/// use dlm_core::FencingToken;
/// use dlm_redis::redis;
///
/// let mut con = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection()?;
/// dlm_redis::fenced_set(&mut con, "report:42", FencingToken::new(7), b"done")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`FencedWriteError::Stale`] when a newer token wrote first; [`FencedWriteError::Backend`]
/// when Redis fails.
pub fn fenced_set(
    con: &mut dyn ConnectionLike,
    key: &str,
    token: FencingToken,
    value: &[u8],
) -> Result<(), FencedWriteError> {
    let reply = set_request(con, key, token, value)
        .map_err(|e| FencedWriteError::Backend(map_error(&e, "fenced_set")))?;
    set_verdict(token, reply)
}

/// The fenced-set script's reply: `(written, highest token)`.
pub(crate) fn set_request(
    con: &mut dyn ConnectionLike,
    key: &str,
    token: FencingToken,
    value: &[u8],
) -> redis::RedisResult<(i64, String)> {
    FENCED_SET.key(key).arg(token.get()).arg(value).invoke(con)
}

/// What the fenced-set script's reply means for a write with `token`.
pub(crate) fn set_verdict(
    token: FencingToken,
    (written, highest): (i64, String),
) -> Result<(), FencedWriteError> {
    if written == 1 {
        return Ok(());
    }
    let highest = highest.parse().map_err(|_| {
        FencedWriteError::Backend(BackendError::new(
            dlm_core::BackendErrorKind::UnexpectedKey,
            format!("fenced_set: the token stored at the key is not a number: {highest:?}"),
        ))
    })?;
    Err(FencedWriteError::Stale(StaleToken {
        presented: token,
        highest: FencingToken::new(highest),
    }))
}

/// Reads a value written by [`fenced_set`], with the token of its last write.
///
/// # Errors
/// [`BackendError`] when Redis fails.
pub fn fenced_get(
    con: &mut dyn ConnectionLike,
    key: &str,
) -> Result<Option<(Vec<u8>, FencingToken)>, BackendError> {
    get_request(con, key).map_err(|e| map_error(&e, "fenced_get"))
}

/// The value and token stored by [`fenced_set`] at `key`.
pub(crate) fn get_request(
    con: &mut dyn ConnectionLike,
    key: &str,
) -> redis::RedisResult<Option<(Vec<u8>, FencingToken)>> {
    let (value, fence): (Option<Vec<u8>>, Option<u64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("value")
        .arg("fence")
        .query(con)?;
    Ok(value.zip(fence.map(FencingToken::new)))
}
