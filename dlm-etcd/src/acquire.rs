//! A mutex's acquisition, release, force-release, inspection and fencing token, each one
//! request.

use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, BackendError, FencingToken, LockName, OwnerToken};
use serde_json::{Value, json};

use crate::gateway::{b64, bad_reply, int, is_lease_not_found, revision};
use crate::hints::LAST_HELD_REVISION;
use crate::inner::Inner;
use crate::kv::release_at;
use crate::kv::{Kv, tag_of, value_of};
use crate::renew;

/// One attempt at `name` for `owner`: a put-if-absent transaction that reads the holder
/// when it fails. A key already `owner`'s (a retry after a lost reply) is renewed.
pub(crate) fn try_acquire(
    inner: &Inner,
    name: &LockName,
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<Acquire, BackendError> {
    let key_bytes = inner.key(name);
    let tag = tag_of(&key_bytes, owner);
    let key = b64(&key_bytes);
    let value = b64(&value_of(owner, ttl));
    let mut fresh_lease = false;
    loop {
        let start = Instant::now();
        let lease = inner.lease_for(ttl, start, &tag)?;
        let txn = json!({
            "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": { "key": key, "value": value, "lease": lease.to_string() } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let reply = match inner.gateway.post("/v3/kv/txn", &txn) {
            Err(e) if is_lease_not_found(&e) && !fresh_lease => {
                inner.forget_lease(lease);
                fresh_lease = true;
                continue;
            }
            r => r?,
        };
        let rev = revision(&reply)?;
        if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
            let fence = FencingToken::new(rev.unsigned_abs());
            return Ok(Acquire::Acquired(
                inner.lease_from(start, ttl)?.with_fence(fence),
            ));
        }
        let kv = reply
            .pointer("/responses/0/response_range/kvs/0")
            .ok_or_else(|| bad_reply("responses"))?;
        let kv = Kv::from_json(kv)?;
        if kv.lease != lease {
            inner.leases.lock().drop_key(lease, &tag);
        }
        if kv.is_owned_by(name, owner)? {
            // Ours already (a retry after a lost reply): refresh it.
            return match renew::extend_found(inner, name, owner, ttl, &kv)? {
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

/// Releases `name` if it is `owner`'s; a release that deleted the key wakes one of this
/// backend's waiters at once (the watch event then wakes nobody else).
pub(crate) fn release(
    inner: &Inner,
    name: &LockName,
    owner: &OwnerToken,
) -> Result<bool, BackendError> {
    let deleted_at = release_at(inner, &inner.key(name), owner)?;
    if let Some(rev) = deleted_at
        && let Some(h) = inner.hints.lock().as_ref()
    {
        h.announce(name, rev);
    }
    Ok(deleted_at.is_some())
}

/// `owner`'s fencing token of `name`, read back (the key's `create_revision`): `None`
/// once the key is not `owner`'s.
pub(crate) fn fence(
    inner: &Inner,
    name: &LockName,
    owner: &OwnerToken,
) -> Result<Option<FencingToken>, BackendError> {
    let (kv, _) = Kv::read(&inner.gateway, &inner.key(name))?;
    match kv {
        Some(kv) if kv.is_owned_by(name, owner)? => Ok(u64::try_from(kv.create_revision)
            .ok()
            .map(FencingToken::new)),
        _ => Ok(None),
    }
}

/// Deletes `name`'s key whoever holds it: whether there was one.
pub(crate) fn force_release(inner: &Inner, name: &LockName) -> Result<bool, BackendError> {
    let reply = inner.gateway.post(
        "/v3/kv/deleterange",
        &json!({ "key": b64(&inner.key(name)) }),
    )?;
    Ok(int(&reply, "deleted")? > 0)
}

/// How long `name`'s holder may still count on it: its lease, at most its etcd lease's
/// remaining whole seconds; `None` when it is free.
pub(crate) fn inspect(inner: &Inner, name: &LockName) -> Result<Option<Duration>, BackendError> {
    let (kv, _) = Kv::read(&inner.gateway, &inner.key(name))?;
    let Some(kv) = kv else {
        return Ok(None);
    };
    let (_, held_for) = kv.holder(name)?;
    let reply = inner.gateway.post_read(
        "/v3/lease/timetolive",
        &json!({ "ID": kv.lease.to_string() }),
    )?;
    let left = int(&reply, "TTL")?.max(0).unsigned_abs();
    Ok(Some(held_for.min(Duration::from_secs(left))))
}
