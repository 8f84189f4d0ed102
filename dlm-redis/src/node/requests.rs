//! The lock requests of one server: each built (in the server's acquisition dialect),
//! run on a pooled connection (with `WAIT` after a write when asked) and its reply read.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, Claim, LockName, OwnerToken};

use super::Node;
use crate::protocol::{Call, NodeAcquire, NodeFence, ReplicaWait, Shape, Step, millis};

/// How a server is asked to acquire: `SET ... NX GET`, or the acquire script (a server
/// older than 7.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Set,
    Script,
}

impl Node {
    /// The first request of an acquisition: the plain `SET key token NX PX ms GET`, so
    /// that the server runs no script on the uncontended path (fencing tokens are drawn
    /// when read, by the fence script). Servers older than 7.0 (no `SET ... NX GET`) get
    /// the acquire script.
    pub(crate) fn acquire_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        self.acquire_call_in(self.dialect(), name, owner, ttl)
    }

    /// [`acquire_call`](Self::acquire_call) as `dialect` says, whatever the server is
    /// known to speak by now.
    pub(crate) fn acquire_call_in(
        &self,
        dialect: Dialect,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Call {
        match dialect {
            Dialect::Script => self.keys.acquire_script_call(name, owner, ttl),
            Dialect::Set => self.keys.set_call(name, owner, ttl),
        }
    }

    /// How the server is asked to acquire, as far as is known now (a server found older
    /// than 7.0 stays [`Dialect::Script`]).
    pub(crate) fn dialect(&self) -> Dialect {
        if self.scripts_only.load(Ordering::Relaxed) {
            Dialect::Script
        } else {
            Dialect::Set
        }
    }

    /// As when the server turns out to be older than 7.0.
    #[cfg(test)]
    pub(crate) fn set_scripts_only(&self) {
        self.scripts_only.store(true, Ordering::Relaxed);
    }

    /// What the reply to an acquire call means: the answer, or [`Step::Script`] when only
    /// the acquire script can tell (the key is someone else's: for how long? Or it is
    /// already ours: refresh it. Or the server is older than 7.0).
    pub(crate) fn parse_acquire(
        &self,
        name: &LockName,
        call: &Call,
        reply: redis::Value,
    ) -> Result<Step, BackendError> {
        let read = self.reader();
        let set = match call.shape() {
            Some(Shape::Script(_)) => return read.acquire_script(name, reply).map(Step::Done),
            Some(Shape::SetGet) => reply,
            Some(Shape::Wait) => return Err(read.protocol("WAIT", &reply)),
            None => return Err(read.protocol("a batch", &reply)),
        };
        match set {
            redis::Value::Nil => Ok(Step::Done(NodeAcquire::Acquired)),
            // Someone's token (perhaps ours): the script tells whose and for how long.
            redis::Value::BulkString(_) => Ok(Step::Script),
            redis::Value::ServerError(e) => {
                let e: redis::RedisError = e.into();
                if e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("syntax")) {
                    if !self.scripts_only.swap(true, Ordering::Relaxed) {
                        log::info!(
                            "{}: the server does not take SET ... NX GET (Redis < 7.0): acquiring with the script",
                            self.endpoint
                        );
                    }
                    return Ok(Step::Script);
                }
                if e.code() == Some("WRONGTYPE") {
                    return Err(read.unexpected_key(name, "is not a string"));
                }
                Err(self.endpoint.error(&e))
            }
            other => Err(read.protocol("SET", &other)),
        }
    }

    /// One whole acquisition attempt on this node: the plain request, then the script
    /// when the reply needs it; with `wait`, also how many replicas acknowledged a grant.
    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        wait: Option<ReplicaWait>,
    ) -> Result<(NodeAcquire, Option<u32>), BackendError> {
        let call = self.acquire_call(name, owner, ttl);
        let (reply, acked) = self.execute_acked(&call, wait)?;
        match self.parse_acquire(name, &call, reply)? {
            Step::Done(answer) => Ok((answer, acked)),
            Step::Script => {
                let call = self.keys.acquire_script_call(name, owner, ttl);
                let (reply, acked) = self.execute_acked(&call, wait)?;
                Ok((self.reader().acquire_script(name, reply)?, acked))
            }
        }
    }

    /// One acquisition attempt that draws the fencing token with it (the fenced acquire
    /// script, no proposal): the answer, the token when acquired with one, and with
    /// `wait`, how many replicas acknowledged the grant and the draw.
    pub(crate) fn acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        wait: Option<ReplicaWait>,
    ) -> Result<(NodeAcquire, Option<u64>, Option<u32>), BackendError> {
        let call = self.keys.acquire_fenced_call(name, owner, ttl, None);
        let (reply, acked) = match self.execute_acked_once(&call, wait) {
            Err(e) if self.router.is_some() && e.message().contains("TRYAGAIN") => {
                // A Redis Cluster slot half migrated: a script naming a key that is on
                // neither side gets TRYAGAIN until the slot is assigned, where the plain
                // acquisition follows ASK (and a read draws there once the key exists).
                let (answer, acked) = self.acquire(name, owner, ttl, wait)?;
                return Ok((answer, None, acked));
            }
            other => other?,
        };
        let (answer, fence) = self.reader().acquire_fenced(name, reply)?;
        Ok((answer, fence.and_then(NodeFence::stream), acked))
    }

    /// Draws the fencing token of `owner`'s hold (the fence script, no proposal); with
    /// `wait`, also how many replicas acknowledged the draw.
    pub(crate) fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        wait: Option<ReplicaWait>,
    ) -> Result<(NodeFence, Option<u32>), BackendError> {
        let (reply, acked) = self.execute_acked(&self.keys.fence_call(name, owner, None), wait)?;
        Ok((self.reader().fence(name, reply)?, acked))
    }

    /// Renews the lock if it is still `owner`'s; with `wait`, also how many replicas
    /// acknowledged the renewal.
    pub(crate) fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        wait: Option<ReplicaWait>,
    ) -> Result<(bool, Option<u32>), BackendError> {
        let (reply, acked) = self.execute_acked(&self.keys.extend_call(name, owner, ttl), wait)?;
        Ok((self.reader().flag(reply)?, acked))
    }

    /// Releases if ours, publishing `release_id` on the lock's channel if a waiter marked
    /// the key: whether it released, and whether it published.
    pub(crate) fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Result<(bool, bool), BackendError> {
        let reply = self.execute(&self.keys.release_call(name, owner, release_id))?;
        self.reader().release(reply)
    }

    /// Hands the lock from `owner` to `next` for `ttl` if it is `owner`'s (the hand-over
    /// script), drawing `next`'s fencing token in the same step when `fenced`: the answer
    /// as an acquisition's (`Held`: it was not `owner`'s, nothing written) and the token.
    pub(crate) fn handover(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        next: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Result<(NodeAcquire, Option<u64>), BackendError> {
        let reply = self.execute(&self.keys.handover_call(name, owner, next, ttl, fenced))?;
        let (answer, fence) = self.reader().acquire_fenced(name, reply)?;
        Ok((answer, fence.and_then(NodeFence::stream)))
    }

    /// Releases `owner`'s `claim` hold (a permit, a read or a write hold) of the resource
    /// `name` if it is there (the claim script), publishing `release_id` on the resource's
    /// channel.
    pub(crate) fn release_claim(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Result<bool, BackendError> {
        let reply = self.execute(&self.keys.claim_release_call(name, claim, owner, release_id))?;
        Ok(self.reader().claim(name, claim, reply)?.code == 1)
    }

    /// Runs a prepared call on a pooled connection.
    pub(crate) fn execute(&self, call: &Call) -> Result<redis::Value, BackendError> {
        self.run_routed(
            &|con| call.execute(con),
            &|value| call.refusal_in(value),
            true,
        )
    }

    /// [`execute`](Self::execute), then, when `wait` is set and the call wrote the lock,
    /// `WAIT replicas timeout` on the same connection (`WAIT` counts the replicas that
    /// acknowledged this connection's writes): the reply and how many acknowledged
    /// (`None` when nothing was waited for).
    pub(crate) fn execute_acked(
        &self,
        call: &Call,
        wait: Option<ReplicaWait>,
    ) -> Result<(redis::Value, Option<u32>), BackendError> {
        self.execute_acked_with(call, wait, true)
    }

    /// [`execute_acked`](Self::execute_acked) that does not wait out a cluster's
    /// `TRYAGAIN`: it is the (`Unavailable`) answer.
    pub(crate) fn execute_acked_once(
        &self,
        call: &Call,
        wait: Option<ReplicaWait>,
    ) -> Result<(redis::Value, Option<u32>), BackendError> {
        self.execute_acked_with(call, wait, false)
    }

    fn execute_acked_with(
        &self,
        call: &Call,
        wait: Option<ReplicaWait>,
        retry: bool,
    ) -> Result<(redis::Value, Option<u32>), BackendError> {
        let Some(w) = wait else {
            return self
                .run_routed(
                    &|con| call.execute(con),
                    &|value| call.refusal_in(value),
                    retry,
                )
                .map(|value| (value, None));
        };
        self.run_routed(
            &|con| {
                let value = call.execute(con)?;
                // A refusal (a redirection among them) wrote nothing either.
                if !call.wrote(&value) {
                    return Ok((value, None));
                }
                let acked: i64 = redis::cmd("WAIT")
                    .arg(w.replicas)
                    .arg(millis(w.timeout))
                    .query(con)?;
                Ok((value, Some(u32::try_from(acked.max(0)).unwrap_or(u32::MAX))))
            },
            &|(value, _)| call.refusal_in(value),
            retry,
        )
    }

    /// The error for a write that fewer than `w.replicas` replicas acknowledged.
    pub(crate) fn not_replicated(
        &self,
        w: ReplicaWait,
        acked: Option<u32>,
        what: &str,
    ) -> BackendError {
        BackendError::new(
            BackendErrorKind::NotReplicated,
            format!(
                "{}: {what} acknowledged by {} of the {} replicas asked for within {:?} (WAIT)",
                self.endpoint,
                acked.unwrap_or(0),
                w.replicas,
                w.timeout
            ),
        )
    }

    pub(crate) fn force_release(
        &self,
        name: &LockName,
        release_id: u64,
    ) -> Result<bool, BackendError> {
        let reply = self.execute(&self.keys.force_release_call(name, release_id))?;
        self.reader().force_release(name, reply)
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let reply = self.execute(&self.keys.inspect_call(name))?;
        self.reader().inspect(name, reply)
    }

    /// The server's `run_id` (INFO server), to spot one server listed twice.
    pub(crate) fn run_id(&self) -> Result<String, BackendError> {
        let info: String = self.run(|con| redis::cmd("INFO").arg("server").query(con))?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{}: INFO server has no run_id", self.endpoint),
                )
            })
    }
}
