//! What a server's replies mean: the answers to lock requests, read with the server's
//! name and the lock's keys for the errors.

use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, Claim, LockName};

use super::fencing::token_of_id;
use super::keys::Keys;
use crate::conn::Endpoint;

/// What one server answered to an acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeAcquire {
    /// Ours now.
    Acquired,
    /// Someone else's, for this much longer.
    Held { remaining: Duration },
}

/// What one server answered to a fence call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeFence {
    /// The lock is not ours there.
    NotOurs,
    /// The proposal was taken: the stream's last ID is now that token.
    Taken(u64),
    /// A new ID was drawn: the stream's last ID is now this token.
    Drawn(u64),
}

impl NodeFence {
    /// Where the stream stands after the call (`None` when not ours).
    pub(crate) fn stream(self) -> Option<u64> {
        match self {
            NodeFence::NotOurs => None,
            NodeFence::Taken(t) | NodeFence::Drawn(t) => Some(t),
        }
    }
}

/// What the reply to an acquire call says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The answer.
    Done(NodeAcquire),
    /// Ask again with the acquire script.
    Script,
}

/// What the claim script (semaphores, read-write locks) answered: its code and its second
/// value.
pub(crate) struct ClaimAnswer {
    pub(crate) code: i64,
    pub(crate) value: redis::Value,
}

/// Reads the replies of one server (its name is in every error).
#[derive(Clone, Copy)]
pub(crate) struct ReplyReader<'a> {
    pub(crate) server: &'a Endpoint,
    pub(crate) keys: &'a Keys,
}

impl ReplyReader<'_> {
    pub(crate) fn unexpected_key(&self, name: &LockName, what: &str) -> BackendError {
        self.foreign_key(&self.keys.lock(name), what)
    }

    /// `UnexpectedKey`: `key` is `what` it is, so dlm did not write it.
    fn foreign_key(&self, key: &str, what: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::UnexpectedKey,
            format!(
                "{}: the key {key} {what}; it was not written by dlm",
                self.server
            ),
        )
    }

    /// The claim script's reply to an operation on the `claim` resource `name`: its code
    /// and value; the codes of a foreign key are `UnexpectedKey`.
    pub(crate) fn claim(
        &self,
        name: &LockName,
        claim: Claim,
        reply: redis::Value,
    ) -> Result<ClaimAnswer, BackendError> {
        let mut parts = match reply {
            redis::Value::Array(parts) if parts.len() >= 2 => parts.into_iter(),
            other => return Err(self.protocol("the claim script", &other)),
        };
        let code: i64 = self.parse(parts.next().expect("two parts"))?;
        let value = parts.next().expect("two parts");
        self.claim_code(name, claim, code)?;
        Ok(ClaimAnswer { code, value })
    }

    /// `UnexpectedKey` for the claim script's codes of a foreign key at the `claim`
    /// resource `name`'s hash (-1: not a hash; -2: a hash dlm did not write).
    pub(crate) fn claim_code(
        &self,
        name: &LockName,
        claim: Claim,
        code: i64,
    ) -> Result<(), BackendError> {
        let what = match code {
            -1 => "is not a hash",
            -2 => "is a hash without an expiry or with fields dlm does not write",
            _ => return Ok(()),
        };
        Err(self.foreign_key(&self.keys.claim(name, claim), what))
    }

    pub(crate) fn acquire_script(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<NodeAcquire, BackendError> {
        let (code, value): (i64, redis::Value) = self.parse(reply)?;
        match code {
            1 => Ok(NodeAcquire::Acquired),
            0 => Ok(NodeAcquire::Held {
                remaining: Duration::from_millis(self.parse::<i64>(value)?.max(0) as u64),
            }),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: acquire script returned {other}", self.server),
            )),
        }
    }

    /// The fenced acquire script's answer: the acquisition's, and the token drawn with
    /// it (`NodeFence::Taken` or `Drawn`; `None` when held, or acquired without a token).
    pub(crate) fn acquire_fenced(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<(NodeAcquire, Option<NodeFence>), BackendError> {
        let (code, value): (i64, redis::Value) = self.parse(reply)?;
        match code {
            1 => Ok((
                NodeAcquire::Acquired,
                Some(NodeFence::Taken(self.draw(name, value)?)),
            )),
            2 => Ok((
                NodeAcquire::Acquired,
                Some(NodeFence::Drawn(self.draw(name, value)?)),
            )),
            3 => Ok((NodeAcquire::Acquired, None)),
            0 => Ok((
                NodeAcquire::Held {
                    remaining: Duration::from_millis(self.parse::<i64>(value)?.max(0) as u64),
                },
                None,
            )),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: fenced acquire script returned {other}", self.server),
            )),
        }
    }

    /// The fence script's answer.
    pub(crate) fn fence(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<NodeFence, BackendError> {
        let (code, value): (i64, redis::Value) = self.parse(reply)?;
        match code {
            0 => Ok(NodeFence::NotOurs),
            1 => Ok(NodeFence::Taken(self.draw(name, value)?)),
            2 => Ok(NodeFence::Drawn(self.draw(name, value)?)),
            -3 => Err(self.foreign_fence(name)),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: fence script returned {other}", self.server),
            )),
        }
    }

    /// The fencing token of the ID the slot's stream drew (`XADD`). A key of another type
    /// at the stream's name was not written by dlm.
    pub(crate) fn draw(&self, name: &LockName, value: redis::Value) -> Result<u64, BackendError> {
        match value {
            redis::Value::BulkString(id) => token_of_id(&id).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!(
                        "{}: the fencing stream gave the ID {:?}, which makes no token",
                        self.server,
                        String::from_utf8_lossy(&id)
                    ),
                )
            }),
            redis::Value::ServerError(e) => {
                let e: redis::RedisError = e.into();
                if e.code() == Some("WRONGTYPE") {
                    return Err(self.foreign_fence(name));
                }
                Err(self.server.error(&e))
            }
            other => Err(self.protocol("XADD", &other)),
        }
    }

    pub(crate) fn foreign_fence(&self, name: &LockName) -> BackendError {
        BackendError::new(
            BackendErrorKind::UnexpectedKey,
            format!(
                "{}: the fencing stream {} is not a stream; it was not written by dlm",
                self.server,
                self.keys.fence(name)
            ),
        )
    }

    pub(crate) fn protocol(&self, what: &str, reply: &redis::Value) -> BackendError {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{}: unexpected reply to {what}: {reply:?}", self.server),
        )
    }

    /// Converts a script's reply.
    pub(crate) fn parse<T: redis::FromRedisValue>(
        &self,
        reply: redis::Value,
    ) -> Result<T, BackendError> {
        redis::from_redis_value(reply).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("{}: unexpected script reply: {e}", self.server),
            )
        })
    }

    /// The replies of a batch (see [`Call::batch`]) of `n` calls, each parsed by `one`; a
    /// call's server error is its own result, not the batch's.
    pub(crate) fn batch<T>(
        &self,
        reply: redis::Value,
        n: usize,
        one: impl Fn(redis::Value) -> Result<T, BackendError>,
    ) -> Result<Vec<Result<T, BackendError>>, BackendError> {
        Ok(self
            .values(reply, n)?
            .into_iter()
            .map(|v| match v.extract_error() {
                Ok(v) => one(v),
                Err(e) => Err(self.server.error(&e)),
            })
            .collect())
    }

    /// The `n` replies of a batch, as they came (server errors kept as values).
    pub(crate) fn values(
        &self,
        reply: redis::Value,
        n: usize,
    ) -> Result<Vec<redis::Value>, BackendError> {
        match reply {
            redis::Value::Array(values) if values.len() == n => Ok(values),
            other => Err(self.protocol("a batch", &other)),
        }
    }

    /// `1` -> `true`, `0` -> `false`.
    pub(crate) fn flag(&self, reply: redis::Value) -> Result<bool, BackendError> {
        Ok(self.parse::<i64>(reply)? == 1)
    }

    /// The release script's answer: whether it released, and whether it announced the
    /// release on the lock's channel (someone had marked the key).
    pub(crate) fn release(&self, reply: redis::Value) -> Result<(bool, bool), BackendError> {
        let n = self.parse::<i64>(reply)?;
        Ok((n >= 1, n == 2))
    }

    /// [`release`](Self::release)'s first part: whether it released.
    pub(crate) fn released(&self, reply: redis::Value) -> Result<bool, BackendError> {
        Ok(self.release(reply)?.0)
    }

    pub(crate) fn force_release(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<bool, BackendError> {
        match self.parse::<i64>(reply)? {
            -1 => Err(self.unexpected_key(name, "is not a string")),
            n => Ok(n == 1),
        }
    }

    pub(crate) fn inspect(
        &self,
        name: &LockName,
        reply: redis::Value,
    ) -> Result<Option<Duration>, BackendError> {
        match self.parse::<i64>(reply)? {
            -3 => Ok(None),
            -1 => Err(self.unexpected_key(name, "is not a string")),
            -2 => Err(self.unexpected_key(name, "has no expiry")),
            ms => Ok(Some(Duration::from_millis(ms.max(0) as u64))),
        }
    }
}
