//! Semaphores and read-write locks: one key per holder under the resource's own prefix,
//! each on an etcd lease, admitted by one transaction whose compares cover that prefix.
//!
//! A resource is `{prefix}lock/{name} 0 sem 0` or `{prefix}lock/{name} 0 rw 0` (a 0 byte:
//! a lock name holds no control character, so no mutex key and no other resource's key
//! falls under it). Under it:
//! - a permit: `{permits} 0 {owner}` (the count every holder asked for, in its key);
//! - a read hold `r{owner}`, a write hold `w{owner}`, the writer's mark `m`.
//!
//! Values are the mutex's, `{owner}|{lease ms}`, plus `|{token}` for a read hold made by a
//! downgrade (it keeps the write hold's token); the mark's is the refused writer's token
//! and the mark's length.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holder, Holders,
    Lease, LockName, OwnerToken, writer_mark,
};
use serde_json::{Value, json};

use crate::gateway::{b64, bad_reply, int, is_lease_not_found, revision, unb64};
use crate::hints::LAST_HELD_REVISION;
use crate::inner::Inner;
use crate::kv::release_at;
use crate::kv::{Kv, tag_of, value, value_of};
use crate::leases::{Class, claim_class};
use crate::renew;
use crate::resource::Resource;

/// Admission transactions one call sends at most: each failed one returns the resource as
/// it then is, so the next decides on fresh state; after that the call answers `Held`
/// with [`RACE_RETRY`] (one bounded attempt per call).
const ATTEMPTS: usize = 4;

/// The `retry_after` of a call whose transactions all lost a race.
const RACE_RETRY: Duration = Duration::from_millis(5);

/// What a key under a resource is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum What {
    Permit(u32),
    Read,
    Write,
    Mark,
}

/// A key under a resource, as read.
struct Entry {
    key: Vec<u8>,
    what: What,
    kv: Kv,
    /// The holder's lease (the mark's length for the mark).
    ms: Duration,
}

/// `UnexpectedKey` for a key under a resource that dlm did not write.
fn foreign(name: &LockName, claim: Claim) -> BackendError {
    BackendError::new(
        BackendErrorKind::UnexpectedKey,
        format!(
            "a key of the {} {name:?} was not written by dlm (or has no lease)",
            claim.primitive()
        ),
    )
}

/// `Unsupported` for a kind of hold dlm-etcd does not keep.
/// A compare that every key in `[range.0, range.1)` satisfies (true for an empty range).
fn range_cmp(range: &(Vec<u8>, Vec<u8>), target: &str, result: &str, field: &str, v: i64) -> Value {
    let mut c = json!({
        "key": b64(&range.0),
        "range_end": b64(&range.1),
        "target": target,
        "result": result,
    });
    c[field] = Value::String(v.to_string());
    c
}

/// No key in the range.
fn empty(range: &(Vec<u8>, Vec<u8>)) -> Value {
    range_cmp(range, "VERSION", "EQUAL", "version", 0)
}

/// `key` does not exist.
fn absent(key: &[u8]) -> Value {
    json!({ "key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0" })
}

/// Reads every key in the range.
fn range_op(range: &(Vec<u8>, Vec<u8>)) -> Value {
    json!({ "request_range": { "key": b64(&range.0), "range_end": b64(&range.1) } })
}

/// Whether a transaction took its `success` branch.
fn succeeded(reply: &Value) -> bool {
    reply.get("succeeded").and_then(Value::as_bool) == Some(true)
}

/// Whole seconds, rounded up, at least 1.
fn secs_up(d: Duration) -> i64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(s).unwrap_or(i64::MAX / 2).max(1)
}

/// The keys of a range reply (at `pointer`), each checked to be of dlm's shape for
/// `claim`'s resource.
fn entries(
    reply: &Value,
    pointer: &str,
    res: &Resource,
    name: &LockName,
    claim: Claim,
) -> Result<Vec<Entry>, BackendError> {
    let Some(kvs) = reply.pointer(pointer) else {
        return Ok(Vec::new());
    };
    let kvs = kvs.as_array().ok_or_else(|| bad_reply("kvs"))?;
    let mut out = Vec::with_capacity(kvs.len());
    for j in kvs {
        let key = j
            .get("key")
            .and_then(unb64)
            .ok_or_else(|| bad_reply("key"))?;
        let kv = Kv::from_json(j)?;
        let (owner, ms) = kv.holder(name).map_err(|_| foreign(name, claim))?;
        let suffix = key
            .strip_prefix(res.prefix.as_slice())
            .ok_or_else(|| bad_reply("key"))?;
        let what = match (claim, suffix) {
            (Claim::Permit { .. }, s) => {
                let sep = s.iter().position(|&b| b == 0);
                let permits = sep
                    .and_then(|i| std::str::from_utf8(&s[..i]).ok())
                    .and_then(|p| p.parse::<u32>().ok())
                    .filter(|&p| p > 0);
                match (sep, permits) {
                    (Some(i), Some(p)) if &s[i + 1..] == owner => What::Permit(p),
                    _ => return Err(foreign(name, claim)),
                }
            }
            (_, b"m") => What::Mark,
            (_, [b'r', rest @ ..]) if rest == owner => What::Read,
            (_, [b'w', rest @ ..]) if rest == owner => What::Write,
            _ => return Err(foreign(name, claim)),
        };
        out.push(Entry { key, what, kv, ms });
    }
    Ok(out)
}

/// Every key under `res`, read in one transaction and each checked to be of dlm's shape:
/// the reply (its header has the read's revision) and the keys.
fn read_all(
    inner: &Inner,
    res: &Resource,
    name: &LockName,
    claim: Claim,
) -> Result<(Value, Vec<Entry>), BackendError> {
    let reply = inner
        .gateway
        .post_read("/v3/kv/txn", &json!({ "success": [range_op(&res.all())] }))?;
    let entries = entries(&reply, "/responses/0/response_range/kvs", res, name, claim)?;
    Ok((reply, entries))
}

/// One bounded attempt at a hold (see `LockBackend::try_acquire_group`).
pub(crate) fn try_acquire(inner: &Inner, req: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
    let (name, claim, owner, ttl) = (req.name, req.claim, req.owner, req.ttl);
    let res = Resource::of(inner, name, claim)?;
    let mine = res.holder(claim, owner);
    let tag = tag_of(&mine, owner);
    let value = b64(&value(owner, ttl, None, req.label));
    // A semaphore admits while fewer than `permits` hold: after a first look, the
    // admission compares that nothing under the resource changed since.
    let mut unchanged_since: Option<i64> = None;
    let mut fresh_lease = false;
    let mut attempt = 0;
    while attempt < ATTEMPTS {
        attempt += 1;
        let start = Instant::now();
        let lease = inner.lease_in(Class::holds(claim_class(ttl)), ttl, start, &tag)?;
        let mut compare = vec![absent(&mine)];
        match (claim, unchanged_since) {
            (_, Some(rev)) => {
                compare.push(range_cmp(
                    &res.all(),
                    "MOD",
                    "LESS",
                    "mod_revision",
                    rev + 1,
                ));
            }
            (Claim::Permit { .. }, None) => compare.push(empty(&res.all())),
            (Claim::Read, None) => {
                compare.push(empty(&res.writers()));
                compare.push(absent(&res.mark()));
            }
            _ => compare.push(empty(&res.holds())),
        }
        let mut success = vec![
            json!({ "request_put": { "key": b64(&mine), "value": value, "lease": lease.to_string() } }),
        ];
        if claim == Claim::Write {
            success.push(json!({ "request_delete_range": { "key": b64(&res.mark()) } }));
        }
        let txn = json!({
            "compare": compare,
            "success": success,
            "failure": [range_op(&res.all())],
        });
        let reply = match inner.gateway.post("/v3/kv/txn", &txn) {
            Err(e) if is_lease_not_found(&e) && !fresh_lease => {
                inner.forget_lease(lease);
                fresh_lease = true;
                attempt -= 1;
                continue;
            }
            r => r?,
        };
        let rev = revision(&reply)?;
        if succeeded(&reply) {
            if claim == Claim::Write {
                inner.leases.lock().drop_key_everywhere(&mark_tag(&res));
            }
            let fence = FencingToken::new(rev.unsigned_abs());
            return Ok(Acquire::Acquired(
                inner.lease_from(start, ttl)?.with_fence(fence),
            ));
        }
        let entries = entries(&reply, "/responses/0/response_range/kvs", &res, name, claim);
        let entries = match entries {
            Ok(e) => e,
            Err(e) => {
                inner.leases.lock().drop_key(lease, &tag);
                return Err(e);
            }
        };
        if let Some(own) = entries.iter().find(|e| e.key == mine) {
            if own.kv.lease != lease {
                inner.leases.lock().drop_key(lease, &tag);
            }
            // Ours already (a retry after a lost reply): refresh it.
            return match renew::extend_found_at(
                inner,
                mine.clone(),
                claim_class,
                name,
                owner,
                ttl,
                &own.kv,
            )? {
                Some(lease) => Ok(Acquire::Acquired(lease)),
                None => Ok(Acquire::Held { retry_after: None }),
            };
        }
        inner.leases.lock().drop_key(lease, &tag);
        let shortest =
            |f: &dyn Fn(What) -> bool| entries.iter().filter(|e| f(e.what)).map(|e| e.ms).min();
        let refused = match claim {
            Claim::Permit { permits } => {
                if let Some(other) = entries.iter().find_map(|e| match e.what {
                    What::Permit(p) if p != permits => Some(p),
                    _ => None,
                }) {
                    return Err(BackendError::new(
                        BackendErrorKind::Conflict,
                        format!("the semaphore {name} is held with {other} permits, not {permits}"),
                    ));
                }
                if entries.len() >= permits as usize {
                    Some(shortest(&|_| true).unwrap_or(ttl))
                } else {
                    None
                }
            }
            Claim::Read => {
                if let Some(w) = shortest(&|w| w == What::Write) {
                    Some(w)
                } else {
                    shortest(&|w| w == What::Mark).map(|m| m / 3)
                }
            }
            _ => {
                let holders = shortest(&|w| w != What::Mark);
                match holders {
                    Some(soonest) => {
                        let mark = writer_mark(ttl);
                        set_mark(inner, &res, &entries, owner, mark);
                        Some(soonest.min(mark / 3))
                    }
                    None => None,
                }
            }
        };
        if let Some(retry_after) = refused {
            LAST_HELD_REVISION.with(|r: &Cell<i64>| r.set(rev));
            return Ok(Acquire::Held {
                retry_after: Some(retry_after),
            });
        }
        // Free as read at `rev` (a race, or a semaphore with a permit left): the next
        // transaction admits if nothing changed since.
        unchanged_since = Some(rev);
    }
    Ok(Acquire::Held {
        retry_after: Some(RACE_RETRY),
    })
}

/// Marks the read-write lock as awaited by a writer for `mark`, unless the mark
/// changed since `rev` (another writer's is then live). Best effort: a mark that
/// cannot be put costs writer preference for one round, not safety.
fn set_mark(inner: &Inner, res: &Resource, entries: &[Entry], owner: &OwnerToken, mark: Duration) {
    let key = res.mark();
    let start = Instant::now();
    // The mark's etcd lease ends within `ceil(mark)` s (plus etcd's expiry check) of
    // this put, and lasts at least half the mark, past the writer's next attempt.
    let Ok(lease) = inner.lease_in(Class::marks(secs_up(mark)), mark / 2, start, &mark_tag(res))
    else {
        return;
    };
    let cmp = match entries.iter().find(|e| e.what == What::Mark) {
        Some(e) => json!({ "key": b64(&key), "target": "MOD", "result": "EQUAL",
                           "mod_revision": e.kv.mod_revision.to_string() }),
        None => absent(&key),
    };
    let txn = json!({
        "compare": [cmp],
        "success": [{ "request_put": {
            "key": b64(&key),
            "value": b64(&value_of(owner, mark)),
            "lease": lease.to_string(),
        }}],
    });
    match inner.gateway.post("/v3/kv/txn", &txn) {
        Err(e) if is_lease_not_found(&e) => inner.forget_lease(lease),
        Err(e) => log::debug!("dlm-etcd: a writer's mark was not set: {e}"),
        Ok(_) => {}
    }
}

/// The key of `owner`'s hold of kind `claim` of `name`, read: `Some` if it is ours.
fn own_hold(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
) -> Result<Option<(Vec<u8>, Kv)>, BackendError> {
    let key = Resource::of(inner, name, claim)?.holder(claim, owner);
    let (kv, _) = Kv::read(&inner.gateway, &key)?;
    match kv {
        Some(kv) if kv.is_owned_by(name, owner).unwrap_or(false) => Ok(Some((key, kv))),
        _ => Ok(None),
    }
}

/// Renews `owner`'s hold of kind `claim` of `name` for `ttl` (read first, then
/// `renew::extend_found_at`): `None` when the key is not `owner`'s any more.
pub(crate) fn extend(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<Option<Lease>, BackendError> {
    match own_hold(inner, name, claim, owner)? {
        Some((key, kv)) => renew::extend_found_at(inner, key, claim_class, name, owner, ttl, &kv),
        None => Ok(None),
    }
}

/// The fencing token of `owner`'s hold of kind `claim` of `name`, read back: `None` once
/// the key is not `owner`'s.
pub(crate) fn fence(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
) -> Result<Option<FencingToken>, BackendError> {
    Ok(own_hold(inner, name, claim, owner)?.map(|(_, kv)| kv.fence()))
}

/// Releases `owner`'s hold of kind `claim` of `name` if it is still `owner`'s; a release
/// wakes every waiter of the resource in this backend at once.
pub(crate) fn release(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
) -> Result<bool, BackendError> {
    let res = Resource::of(inner, name, claim)?;
    let released = release_at(inner, &res.holder(claim, owner), owner)?.is_some();
    if released {
        wake_local(inner, &res);
    }
    Ok(released)
}

/// Wakes this backend's waiters of `res` now (the watch event wakes them again).
fn wake_local(inner: &Inner, res: &Resource) {
    if let Some(h) = inner.hints.lock().as_ref() {
        h.wake_all(&res.id);
    }
}

/// Sets the label of `owner`'s hold (an election leader's new value): the key put again
/// on its etcd lease, compared on its `mod_revision` (its token, the `create_revision`,
/// stays). Observers see the put. Whether `owner` holds it.
pub(crate) fn relabel(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
    label: Option<&str>,
) -> Result<bool, BackendError> {
    for _ in 0..ATTEMPTS {
        let Some((key, kv)) = own_hold(inner, name, claim, owner)? else {
            return Ok(false);
        };
        let value = kv
            .relabelled(owner, label)
            .ok_or_else(|| foreign(name, claim))?;
        let txn = json!({
            "compare": [{ "key": b64(&key), "target": "MOD", "result": "EQUAL",
                          "mod_revision": kv.mod_revision.to_string() }],
            "success": [{ "request_put": {
                "key": b64(&key),
                "value": b64(&value),
                "lease": kv.lease.to_string(),
            }}],
        });
        if succeeded(&inner.gateway.post("/v3/kv/txn", &txn)?) {
            return Ok(true);
        }
        // The key changed (a renewal put it again): look again.
    }
    Err(BackendError::new(
        BackendErrorKind::Unavailable,
        "the hold kept changing during the relabel",
    ))
}

/// `writer`'s write hold turned into `reader`'s read hold in one transaction (compared
/// on the write key's `mod_revision`), keeping the write hold's token.
pub(crate) fn downgrade(
    inner: &Inner,
    name: &LockName,
    writer: &OwnerToken,
    reader: &OwnerToken,
    ttl: Duration,
) -> Result<Option<Lease>, BackendError> {
    let res = Resource::of(inner, name, Claim::Write)?;
    let wkey = res.holder(Claim::Write, writer);
    let rkey = res.holder(Claim::Read, reader);
    let rtag = tag_of(&rkey, reader);
    for _ in 0..ATTEMPTS {
        let (kv, _) = Kv::read(&inner.gateway, &wkey)?;
        let Some(kv) = kv.filter(|kv| kv.is_owned_by(name, writer).unwrap_or(false)) else {
            return Ok(None);
        };
        let fence = kv.fence();
        let label = kv.label().map(str::to_owned);
        let start = Instant::now();
        let lease = inner.lease_in(Class::holds(claim_class(ttl)), ttl, start, &rtag)?;
        let txn = json!({
            "compare": [{ "key": b64(&wkey), "target": "MOD", "result": "EQUAL",
                          "mod_revision": kv.mod_revision.to_string() }],
            "success": [
                { "request_delete_range": { "key": b64(&wkey) } },
                { "request_put": {
                    "key": b64(&rkey),
                    "value": b64(&value(reader, ttl, Some(fence.get()), label.as_deref())),
                    "lease": lease.to_string(),
                }},
            ],
        });
        let reply = match inner.gateway.post("/v3/kv/txn", &txn) {
            Err(e) if is_lease_not_found(&e) => {
                // Refused before anything was written.
                inner.leases.lock().drop_key(lease, &rtag);
                inner.forget_lease(lease);
                continue;
            }
            // It may have been applied: the read key stays in the record of what the
            // lease carries (so no keep-alive extends that lease for other keys while
            // it may carry this one), and the front releases it.
            Err(e) if e.may_have_applied() => return Err(e),
            // Refused, or never sent: nothing was written.
            Err(e) => {
                inner.leases.lock().drop_key(lease, &rtag);
                return Err(e);
            }
            Ok(r) => r,
        };
        if succeeded(&reply) {
            inner
                .leases
                .lock()
                .drop_key_everywhere(&tag_of(&wkey, writer));
            wake_local(inner, &res);
            return Ok(Some(inner.lease_from(start, ttl)?.with_fence(fence)));
        }
        // The write key changed (a renewal moved it): look again.
        inner.leases.lock().drop_key(lease, &rtag);
    }
    Err(BackendError::new(
        BackendErrorKind::Unavailable,
        "the write hold kept changing during the downgrade",
    ))
}

/// Ends every hold of the resource and the writer's mark, if every key under it is
/// dlm's (compared unchanged since read, so a key written meanwhile is not deleted).
pub(crate) fn force_release(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
) -> Result<bool, BackendError> {
    let res = Resource::of(inner, name, claim)?;
    for _ in 0..ATTEMPTS {
        let (reply, entries) = read_all(inner, &res, name, claim)?;
        let rev = revision(&reply)?;
        if entries.is_empty() {
            return Ok(false);
        }
        let held = entries.iter().any(|e| e.what != What::Mark);
        let all = res.all();
        let txn = json!({
            "compare": [range_cmp(&all, "MOD", "LESS", "mod_revision", rev + 1)],
            "success": [{ "request_delete_range": { "key": b64(&all.0), "range_end": b64(&all.1) } }],
        });
        if succeeded(&inner.gateway.post("/v3/kv/txn", &txn)?) {
            wake_local(inner, &res);
            return Ok(held);
        }
    }
    Err(BackendError::new(
        BackendErrorKind::Unavailable,
        "the resource kept changing during the force-release",
    ))
}

/// Who holds it: each holder's kind, label and remaining lease (its lease, at most its
/// etcd lease's remaining whole seconds, as the mutex's `inspect`), and a semaphore's
/// permit count.
pub(crate) fn inspect(
    inner: &Inner,
    name: &LockName,
    claim: Claim,
) -> Result<Holders, BackendError> {
    let res = Resource::of(inner, name, claim)?;
    let (_, entries) = read_all(inner, &res, name, claim)?;
    let holders: Vec<&Entry> = entries.iter().filter(|e| e.what != What::Mark).collect();
    let mut left: HashMap<i64, Duration> = HashMap::new();
    for e in &holders {
        if let std::collections::hash_map::Entry::Vacant(slot) = left.entry(e.kv.lease) {
            let r = inner.gateway.post_read(
                "/v3/lease/timetolive",
                &json!({ "ID": e.kv.lease.to_string() }),
            )?;
            let secs = int(&r, "TTL")?.max(0).unsigned_abs();
            slot.insert(Duration::from_secs(secs));
        }
    }
    let permits = holders.iter().find_map(|e| match e.what {
        What::Permit(p) => Some(p),
        _ => None,
    });
    let list = holders
        .iter()
        .map(|e| {
            let claim = match e.what {
                What::Permit(permits) => Claim::Permit { permits },
                What::Read => Claim::Read,
                _ => Claim::Write,
            };
            Holder::new(
                claim,
                e.ms.min(left[&e.kv.lease]),
                e.kv.label().map(str::to_owned),
            )
            .with_token(Some(e.kv.fence()))
        })
        .collect();
    Ok(Holders::new(permits, list))
}

/// The mark's entry in the record of what each etcd lease carries (whoever put it).
fn mark_tag(res: &Resource) -> Vec<u8> {
    let mut t = res.mark();
    t.push(0);
    t
}
