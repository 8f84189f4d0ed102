//! The semaphore and the read-write lock on [`RedisBackend`]: every call is one run of
//! the claim script (`src/protocol/lua/claim.lua`) on the node of the resource's hash,
//! so single instance, Sentinel and Cluster share them.

use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holder, Holders,
    Lease, LockName, OwnerToken, writer_mark,
};

use super::RedisBackend;
use crate::node::Node;
use crate::protocol::{Call, ReleaseId, claim_member, millis, token_of_id};

impl RedisBackend {
    /// Runs the claim script's `op` on `member`'s hold of the `claim` resource `name` on
    /// the node of its hash (in a cluster, the master of that slot).
    fn claim_run<T>(
        &self,
        name: &LockName,
        claim: Claim,
        f: impl Fn(&Node) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let keys = &self.inner.keys;
        self.on_slot(|| keys.claim_slot(name, claim), f)
    }

    /// The token in a script's answer (a stream ID; empty: none).
    fn claim_token(
        node: &Node,
        value: &redis::Value,
    ) -> Result<Option<FencingToken>, BackendError> {
        match value {
            redis::Value::BulkString(id) if id.is_empty() => Ok(None),
            redis::Value::BulkString(id) => token_of_id(id)
                .map(|t| Some(FencingToken::new(t)))
                .ok_or_else(|| {
                    BackendError::new(
                        BackendErrorKind::Protocol,
                        format!(
                            "{}: the fencing stream gave the ID {:?}, which makes no token",
                            node.endpoint,
                            String::from_utf8_lossy(id)
                        ),
                    )
                }),
            other => Err(node.reader().protocol("the claim script", other)),
        }
    }

    pub(super) fn claim_acquire(&self, req: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        let (name, claim, owner, ttl) = (req.name, req.claim, req.owner, req.ttl);
        let member = claim_member(claim, owner);
        let permits = match claim {
            Claim::Permit { permits } => permits,
            _ => 0,
        };
        let fenced = req.fenced && self.inner.options.fencing;
        let (mut ttl_ms, mut permits_s, mut mark_ms, mut stream_ttl, mut id_s) = (
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
        );
        // A one-permit semaphore (an election) announces its grants to its observers.
        let channel = (permits == 1).then(|| self.inner.keys.claim_channel(name, claim));
        let announce_id = channel.as_ref().map(|_| ReleaseId::Release.random());
        let call = self.inner.keys.claim_call(
            name,
            claim,
            "acquire",
            &member,
            &[
                ttl_ms.format(millis(ttl)).as_bytes(),
                permits_s.format(permits).as_bytes(),
                if fenced { b"1" } else { b"0" },
                mark_ms.format(millis(writer_mark(ttl))).as_bytes(),
                stream_ttl.format(self.inner.keys.fence_ttl_ms).as_bytes(),
                req.label.unwrap_or("").as_bytes(),
                channel.as_deref().unwrap_or("").as_bytes(),
                announce_id.map_or(&b""[..], |id| id_s.format(id).as_bytes()),
            ],
        );
        self.claim_run(name, claim, |node| {
            let start = Instant::now();
            let wait = self.inner.options.replica_wait;
            let (reply, acked) = node.execute_acked(&call, wait)?;
            let answer = node.reader().claim(name, claim, reply)?;
            match answer.code {
                1 => {}
                0 => {
                    let ms: i64 = node.reader().parse(answer.value)?;
                    return Ok(Acquire::Held {
                        retry_after: Some(Duration::from_millis(ms.max(0) as u64)),
                    });
                }
                -4 => {
                    let held: i64 = node.reader().parse(answer.value)?;
                    return Err(BackendError::new(
                        BackendErrorKind::Conflict,
                        format!("the semaphore {name} is held with {held} permits, not {permits}"),
                    ));
                }
                other => {
                    return Err(BackendError::new(
                        BackendErrorKind::Protocol,
                        format!("{}: claim script returned {other}", node.endpoint),
                    ));
                }
            }
            let token = Self::claim_token(node, &answer.value)?;
            if let Some(w) = wait
                && acked.unwrap_or(0) < w.replicas
            {
                // Not on enough replicas: a failover could lose it. The front undoes it,
                // as it undoes every failed step that may have written a hold.
                return Err(node.not_replicated(w, acked, "the grant"));
            }
            self.granted(node, start, ttl, token)
        })
    }

    /// The claim script's extension of `owner`'s hold (alone, or in a renewal batch).
    pub(super) fn claim_extend_call(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Call {
        let member = claim_member(claim, owner);
        let mut ms = itoa::Buffer::new();
        self.inner.keys.claim_call(
            name,
            claim,
            "extend",
            &member,
            &[ms.format(millis(ttl)).as_bytes()],
        )
    }

    pub(super) fn claim_extend(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let call = self.claim_extend_call(name, claim, owner, ttl);
        self.claim_run(name, claim, |node| {
            let start = Instant::now();
            let wait = self.inner.options.replica_wait;
            let (reply, acked) = node.execute_acked(&call, wait)?;
            if node.reader().claim(name, claim, reply)?.code != 1 {
                return Ok(None);
            }
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the renewal"));
            }
            Ok(self.lease(start, ttl))
        })
    }

    pub(super) fn claim_release(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let id = ReleaseId::Release.random();
        let keys = &self.inner.keys;
        let released = self.release_on(
            || keys.claim_slot(name, claim),
            name,
            claim,
            owner,
            |node| node.release_claim(name, claim, owner, id),
        )?;
        if released {
            self.claim_released_here(name, claim, id);
        }
        Ok(released)
    }

    /// Wakes the waiters of this process for the release `id` at once.
    fn claim_released_here(&self, name: &LockName, claim: Claim, id: u64) {
        if let Some(hints) = &self.inner.hints {
            hints.released(|| self.inner.keys.claim_channel(name, claim), id);
        }
    }

    pub(super) fn claim_fence(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.options.fencing {
            return Err(super::fencing_off());
        }
        let member = claim_member(claim, owner);
        let mut ttl = itoa::Buffer::new();
        let call = self.inner.keys.claim_call(
            name,
            claim,
            "fence",
            &member,
            &[ttl.format(self.inner.keys.fence_ttl_ms).as_bytes()],
        );
        self.claim_run(name, claim, |node| {
            let wait = self.inner.options.replica_wait;
            let (reply, acked) = node.execute_acked(&call, wait)?;
            let answer = node.reader().claim(name, claim, reply)?;
            let reply = redis::Value::Array(vec![redis::Value::Int(answer.code), answer.value]);
            let Some(token) = node.reader().fence(name, reply)?.stream() else {
                return Ok(None);
            };
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the fencing token's draw"));
            }
            Ok(Some(FencingToken::new(token)))
        })
    }

    pub(super) fn claim_downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let claim = Claim::Write;
        let (w, r) = (
            claim_member(Claim::Write, writer),
            claim_member(Claim::Read, reader),
        );
        let channel = self.inner.keys.claim_channel(name, claim);
        let id = ReleaseId::Release.random();
        let (mut ms, mut id_s) = (itoa::Buffer::new(), itoa::Buffer::new());
        let call = self.inner.keys.claim_call(
            name,
            claim,
            "downgrade",
            &w,
            &[
                ms.format(millis(ttl)).as_bytes(),
                &r,
                channel.as_bytes(),
                id_s.format(id).as_bytes(),
            ],
        );
        let lease = self.claim_run(name, claim, |node| {
            let start = Instant::now();
            let wait = self.inner.options.replica_wait;
            let (reply, acked) = node.execute_acked(&call, wait)?;
            let answer = node.reader().claim(name, claim, reply)?;
            if answer.code != 1 {
                return Ok(None);
            }
            if let Some(w) = wait.filter(|w| acked.unwrap_or(0) < w.replicas) {
                return Err(node.not_replicated(w, acked, "the downgrade"));
            }
            let token = Self::claim_token(node, &answer.value)?;
            Ok(self.lease(start, ttl).map(|lease| match token {
                Some(t) => lease.with_fence(t),
                None => lease,
            }))
        })?;
        if lease.is_some() {
            self.claim_released_here(name, claim, id);
        }
        Ok(lease)
    }

    pub(super) fn claim_force_release(
        &self,
        name: &LockName,
        claim: Claim,
    ) -> Result<bool, BackendError> {
        let channel = self.inner.keys.claim_channel(name, claim);
        let id = ReleaseId::Release.random();
        let mut id_s = itoa::Buffer::new();
        let call = self.inner.keys.claim_call(
            name,
            claim,
            "force",
            b"",
            &[channel.as_bytes(), id_s.format(id).as_bytes()],
        );
        let held = self.claim_run(name, claim, |node| {
            let reply = node.execute(&call)?;
            Ok(node.reader().claim(name, claim, reply)?.code == 1)
        })?;
        self.claim_released_here(name, claim, id);
        Ok(held)
    }

    pub(super) fn claim_relabel(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        let member = claim_member(claim, owner);
        let channel = self.inner.keys.claim_channel(name, claim);
        let id = ReleaseId::Release.random();
        let mut id_s = itoa::Buffer::new();
        let call = self.inner.keys.claim_call(
            name,
            claim,
            "relabel",
            &member,
            &[
                label.unwrap_or("").as_bytes(),
                channel.as_bytes(),
                id_s.format(id).as_bytes(),
            ],
        );
        let relabelled = self.claim_run(name, claim, |node| {
            let reply = node.execute(&call)?;
            Ok(node.reader().claim(name, claim, reply)?.code == 1)
        })?;
        if relabelled {
            self.claim_released_here(name, claim, id);
        }
        Ok(relabelled)
    }

    pub(super) fn claim_inspect(
        &self,
        name: &LockName,
        claim: Claim,
    ) -> Result<Holders, BackendError> {
        let call = self.inner.keys.claim_call(name, claim, "inspect", b"", &[]);
        self.claim_run(name, claim, |node| {
            let reply = node.execute(&call)?;
            let bad =
                |what: &redis::Value| node.reader().protocol("the claim script's inspect", what);
            let parts = match reply {
                redis::Value::Array(parts) => parts,
                other => return Err(bad(&other)),
            };
            let code = match parts.first() {
                Some(redis::Value::Int(code)) => *code,
                _ => return Err(bad(&redis::Value::Array(parts))),
            };
            node.reader().claim_code(name, claim, code)?;
            let (permits, list) = match parts.as_slice() {
                [_, redis::Value::Int(permits), redis::Value::Array(list)] => (*permits, list),
                _ => return Err(bad(&redis::Value::Array(parts.clone()))),
            };
            let permits = u32::try_from(permits).ok().filter(|&p| p > 0);
            let mut holders = Vec::with_capacity(list.len() / 4);
            for h in list.chunks(4) {
                let [class, ms, label, id] = h else {
                    return Err(bad(&redis::Value::Array(list.clone())));
                };
                let text = |v: &redis::Value| match v {
                    redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    redis::Value::SimpleString(s) => Some(s.clone()),
                    _ => None,
                };
                let claim = match text(class).as_deref() {
                    Some("p") => Claim::Permit {
                        permits: permits.unwrap_or(0),
                    },
                    Some("r") => Claim::Read,
                    Some("w") => Claim::Write,
                    _ => return Err(bad(class)),
                };
                let ms = match ms {
                    redis::Value::Int(ms) => Duration::from_millis((*ms).max(0) as u64),
                    other => return Err(bad(other)),
                };
                let label = text(label).filter(|l| !l.is_empty());
                let token = Self::claim_token(node, id)?;
                holders.push(Holder::new(claim, ms, label).with_token(token));
            }
            Ok(Holders::new(permits, holders))
        })
    }
}
