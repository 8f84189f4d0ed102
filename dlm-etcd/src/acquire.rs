//! Acquisition, release, force-release and inspection, each one transaction.

use std::cell::Cell;
use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, BackendError, FencingToken, LockName, OwnerToken};
use serde_json::{Value, json};

use crate::gateway::{b64, bad_reply, int, is_lease_not_found, revision};
use crate::inner::Inner;
use crate::kv::{Kv, tag_of, value_of};

thread_local! {
    /// The revision of this thread's last attempt that found a lock held: the shared watch,
    /// when this thread starts it, starts just after it (see `hints`).
    pub(crate) static LAST_HELD_REVISION: Cell<i64> = const { Cell::new(0) };
}

impl Inner {
    pub(crate) fn range(&self, key: &[u8]) -> Result<(Option<Kv>, i64), BackendError> {
        let reply = self
            .gateway
            .post_read("/v3/kv/range", &json!({ "key": b64(key) }))?;
        let rev = revision(&reply)?;
        match reply
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            Some(kv) => Ok((Some(Kv::from_json(kv)?), rev)),
            None => Ok((None, rev)),
        }
    }

    pub(crate) fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let key_bytes = self.key(name);
        let tag = tag_of(&key_bytes, owner);
        let key = b64(&key_bytes);
        let value = b64(&value_of(owner, ttl));
        let mut fresh_lease = false;
        loop {
            let start = Instant::now();
            let lease = self.lease_for(ttl, start, &tag)?;
            let txn = json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": value, "lease": lease.to_string() } }],
                "failure": [{ "request_range": { "key": key } }],
            });
            let reply = match self.gateway.post("/v3/kv/txn", &txn) {
                Err(e) if is_lease_not_found(&e) && !fresh_lease => {
                    self.forget_lease(lease);
                    fresh_lease = true;
                    continue;
                }
                r => r?,
            };
            let rev = revision(&reply)?;
            if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
                let fence = FencingToken::new(rev.unsigned_abs());
                return Ok(Acquire::Acquired(
                    self.lease_from(start, ttl)?.with_fence(fence),
                ));
            }
            let kv = reply
                .pointer("/responses/0/response_range/kvs/0")
                .ok_or_else(|| bad_reply("responses"))?;
            let kv = Kv::from_json(kv)?;
            if kv.lease != lease {
                self.leases.lock().drop_key(lease, &tag);
            }
            if kv.is_owned_by(name, owner)? {
                // Ours already (a retry after a lost reply): refresh it.
                return match self.extend_found(name, owner, ttl, &kv)? {
                    Some(lease) => Ok(Acquire::Acquired(lease)),
                    None => Ok(Acquire::Held { retry_after: None }),
                };
            }
            LAST_HELD_REVISION.with(|r| r.set(rev));
            let (_, holder_ttl) = kv.holder(name)?;
            return Ok(Acquire::Held {
                retry_after: Some(holder_ttl),
            });
        }
    }

    pub(crate) fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let deleted_at = self.release_at(&self.key(name), owner)?;
        if let Some(rev) = deleted_at
            && let Some(h) = self.hints.lock().as_ref()
        {
            h.announce(name, rev);
        }
        Ok(deleted_at.is_some())
    }

    /// Deletes `key` if its value is `owner`'s: the revision of the deletion, `None` if
    /// it was not `owner`'s (any more).
    pub(crate) fn release_at(
        &self,
        key_bytes: &[u8],
        owner: &OwnerToken,
    ) -> Result<Option<i64>, BackendError> {
        let key = b64(key_bytes);
        // The value is `token|ms` (or `token|ms|fence`): ours if it lies strictly between
        // `token|` and `token}` (no token holds `|` or `}`).
        let token = owner.encoded();
        let mut low = token.as_bytes().to_vec();
        low.push(b'|');
        let mut high = token.as_bytes().to_vec();
        high.push(b'}');
        let txn = json!({
            "compare": [
                { "key": key, "target": "VALUE", "result": "GREATER", "value": b64(&low) },
                { "key": key, "target": "VALUE", "result": "LESS", "value": b64(&high) },
            ],
            "success": [{ "request_delete_range": { "key": key } }],
        });
        let reply = self.gateway.post("/v3/kv/txn", &txn)?;
        // Either way this owner's key is on no etcd lease any more.
        self.leases
            .lock()
            .drop_key_everywhere(&tag_of(key_bytes, owner));
        if reply.get("succeeded").and_then(Value::as_bool) != Some(true) {
            return Ok(None);
        }
        let deleted = reply
            .pointer("/responses/0/response_delete_range")
            .map(|d| int(d, "deleted"))
            .transpose()?
            .unwrap_or(0);
        if deleted > 0 {
            Ok(Some(revision(&reply)?))
        } else {
            Ok(None)
        }
    }

    pub(crate) fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let reply = self.gateway.post(
            "/v3/kv/deleterange",
            &json!({ "key": b64(&self.key(name)) }),
        )?;
        Ok(int(&reply, "deleted")? > 0)
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let (kv, _) = self.range(&self.key(name))?;
        let Some(kv) = kv else {
            return Ok(None);
        };
        let (_, held_for) = kv.holder(name)?;
        let reply = self.gateway.post_read(
            "/v3/lease/timetolive",
            &json!({ "ID": kv.lease.to_string() }),
        )?;
        let left = int(&reply, "TTL")?.max(0).unsigned_abs();
        Ok(Some(held_for.min(Duration::from_secs(left))))
    }
}
