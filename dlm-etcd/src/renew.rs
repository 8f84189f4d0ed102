//! Renewal of every kind of hold: keep-alives of etcd leases, and keys moved to another
//! lease; one hold at a time (`extend`, `extend_found_at` for a semaphore's or read-write
//! lock's hold) or a whole round (`extend_many`).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    BackendError, BackendErrorKind, Claim, Lease, LockName, OwnerToken, Renewal, Renewed,
};
use serde_json::{Value, json};

use crate::gateway::{b64, bad_reply, is_lease_not_found};
use crate::inner::Inner;
use crate::kv::{Kv, tag_of};
use crate::leases::{Class, claim_class, class_of};
use crate::resource::Resource;

/// etcd's default `--max-txn-ops`: a renewal round reads at most this many keys per
/// transaction.
const MAX_TXN_OPS: usize = 128;

/// The most requests of one renewal round in flight at once (each of up to
/// [`MAX_TXN_OPS`] keys): 1,024 holds cost one round trip per step of the round.
const PARALLEL: usize = 8;

/// A renewal's index and its key as read.
type Found = (usize, Kv);

/// A renewal's key, and the class of its etcd lease for a hold's length.
type KeyOf = (Vec<u8>, fn(Duration) -> i64);

/// A renewal that moves a key to another etcd lease.
struct Move<'a> {
    /// The key, and the etcd lease class of a hold of it.
    key: Vec<u8>,
    class: fn(Duration) -> i64,
    name: &'a LockName,
    owner: &'a OwnerToken,
    ttl: Duration,
    kv: &'a Kv,
}

/// Renews `kv` (read just now, ours) for `ttl`: a keep-alive of its etcd lease when
/// that lease is of `ttl`'s class and carries no other key, else the key is moved.
pub(crate) fn extend_found(
    inner: &Inner,
    name: &LockName,
    owner: &OwnerToken,
    ttl: Duration,
    kv: &Kv,
) -> Result<Option<Lease>, BackendError> {
    extend_found_at(inner, inner.key(name), class_of, name, owner, ttl, kv)
}

/// [`extend_found`] of the hold at `key` (a mutex's, a permit's,
/// a read or write hold's), whose etcd lease is of `class(ttl)` seconds.
pub(crate) fn extend_found_at(
    inner: &Inner,
    key: Vec<u8>,
    class: fn(Duration) -> i64,
    name: &LockName,
    owner: &OwnerToken,
    ttl: Duration,
    kv: &Kv,
) -> Result<Option<Lease>, BackendError> {
    let fence = kv.fence();
    let (_, held_for) = kv.holder(name)?;
    let tag = tag_of(&key, owner);
    let alone = inner
        .leases
        .lock()
        .only_carries(kv.lease, &|t: &[u8]| t == tag.as_slice());
    if alone && class(held_for) == class(ttl) && held_for >= ttl {
        let sent = Instant::now();
        let renewed = inner.keep_alive(&[kv.lease], sent)?;
        let granted = renewed.get(&kv.lease).copied().unwrap_or(0);
        if granted <= 0 {
            return Ok(None);
        }
        if Duration::from_secs(granted.unsigned_abs()) >= ttl {
            return Ok(Some(inner.lease_from(sent, ttl)?.with_fence(fence)));
        }
    }
    move_keys(
        inner,
        &[Move {
            key,
            class,
            name,
            owner,
            ttl,
            kv,
        }],
    )
    .pop()
    .expect("one result per move")
}

/// Renews each of `moves` (keys read just now, ours) by putting it on the current
/// etcd lease of its class (a new one if that would end too soon): the same
/// `create_revision`, so the same fencing token. The old lease is not kept alive
/// here: it ends when nothing renews it. One transaction per 128 keys (each compared
/// on its `mod_revision`), then one per key if some key changed meanwhile.
fn move_keys(inner: &Inner, moves: &[Move<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
    let mut out: Vec<Option<Result<Option<Lease>, BackendError>>> =
        moves.iter().map(|_| None).collect();
    // (index, target lease, start) of the moves that need a put.
    let mut puts: Vec<(usize, i64, Instant)> = Vec::new();
    for (i, m) in moves.iter().enumerate() {
        let tag = tag_of(&m.key, m.owner);
        let start = Instant::now();
        let target = match inner.lease_in(Class::holds((m.class)(m.ttl)), m.ttl, start, &tag) {
            Ok(t) => t,
            Err(e) => {
                out[i] = Some(Err(e));
                continue;
            }
        };
        let same_value = m.kv.holder(m.name).is_ok_and(|(_, d)| d == m.ttl);
        if target == m.kv.lease && same_value {
            // Already on the current lease of its class, which lasts long enough.
            let fence = m.kv.fence();
            out[i] = Some(
                inner
                    .lease_from(start, m.ttl)
                    .map(|l| Some(l.with_fence(fence))),
            );
        } else {
            puts.push((i, target, start));
        }
    }
    let put_op = |m: &Move<'_>, target: i64| {
        json!({ "request_put": {
            "key": b64(&m.key),
            "value": b64(&m.kv.value_for(m.owner, m.ttl)),
            "lease": target.to_string(),
        }})
    };
    let cmp_op = |m: &Move<'_>| {
        json!({ "key": b64(&m.key), "target": "MOD", "result": "EQUAL",
                "mod_revision": m.kv.mod_revision.to_string() })
    };
    // The failure branch reads every key of the transaction, so one reply tells which
    // keys changed since they were read.
    let txn = |items: &[(usize, i64, Instant)]| {
        json!({
            "compare": items.iter().map(|&(i, _, _)| cmp_op(&moves[i])).collect::<Vec<_>>(),
            "success": items.iter().map(|&(i, t, _)| put_op(&moves[i], t)).collect::<Vec<_>>(),
            "failure": items.iter().map(|&(i, _, _)| json!({ "request_range": { "key": b64(&moves[i].key) } })).collect::<Vec<_>>(),
        })
    };
    // What one transaction of `items` came to; the items whose keys had not changed when a
    // transaction failed on another key's, to try once more.
    let done = |out: &mut Vec<Option<Result<Option<Lease>, BackendError>>>,
                items: &[(usize, i64, Instant)],
                reply: Result<Value, BackendError>|
     -> Vec<(usize, i64, Instant)> {
        let reply = match reply {
            Err(e) => {
                if is_lease_not_found(&e) {
                    for &(_, t, _) in items {
                        inner.forget_lease(t);
                    }
                }
                for &(i, _, _) in items {
                    out[i] = Some(Err(e.duplicate()));
                }
                return Vec::new();
            }
            Ok(reply) => reply,
        };
        if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
            let mut leases = inner.leases.lock();
            for &(i, t, start) in items {
                let m = &moves[i];
                if t != m.kv.lease {
                    leases.drop_key(m.kv.lease, &tag_of(&m.key, m.owner));
                }
                let fence = m.kv.fence();
                out[i] = Some(
                    inner
                        .lease_from(start, m.ttl)
                        .map(|l| Some(l.with_fence(fence))),
                );
            }
            return Vec::new();
        }
        // A key changed since it was read: gone or another owner's is lost; still ours
        // (an extension of the guard's moved it meanwhile) is a failure the watchdog
        // retries sooner, reading it again; unchanged ones go again.
        let mut again = Vec::new();
        for (k, &(i, t, start)) in items.iter().enumerate() {
            let m = &moves[i];
            let now = reply
                .pointer(&format!("/responses/{k}/response_range/kvs/0"))
                .map(Kv::from_json)
                .transpose();
            out[i] = match now {
                Err(e) => Some(Err(e)),
                Ok(None) => Some(Ok(None)),
                Ok(Some(kv)) if kv.mod_revision == m.kv.mod_revision => {
                    again.push((i, t, start));
                    None
                }
                Ok(Some(kv)) if kv.is_owned_by(m.name, m.owner).unwrap_or(false) => {
                    Some(Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        "the key changed during its renewal; read again at the next",
                    )))
                }
                Ok(Some(_)) => Some(Ok(None)),
            };
        }
        again
    };
    // One transaction per 128 keys, all at once; the unchanged keys of a transaction that
    // failed on another key's go once more, in one transaction per chunk, all at once.
    let chunks: Vec<Vec<(usize, i64, Instant)>> =
        puts.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
    let replies = all_at_once(&chunks, |chunk| {
        inner.gateway.post("/v3/kv/txn", &txn(chunk))
    });
    let again: Vec<Vec<(usize, i64, Instant)>> = chunks
        .iter()
        .zip(replies)
        .map(|(chunk, reply)| done(&mut out, chunk, reply))
        .filter(|a| !a.is_empty())
        .collect();
    let replies = all_at_once(&again, |chunk| {
        inner.gateway.post("/v3/kv/txn", &txn(chunk))
    });
    for (chunk, reply) in again.iter().zip(replies) {
        for (i, _, _) in done(&mut out, chunk, reply) {
            out[i] = Some(Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "the keys of the renewal kept changing; read again at the next",
            )));
        }
    }
    out.into_iter()
        .map(|r| r.expect("every move has a result"))
        .collect()
}

/// Renews `owner`'s hold of the mutex `name` for `ttl` (read first): `None` when the key
/// is not `owner`'s any more.
pub(crate) fn extend(
    inner: &Inner,
    name: &LockName,
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<Option<Lease>, BackendError> {
    let (kv, _) = Kv::read(&inner.gateway, &inner.key(name))?;
    match kv {
        Some(kv) if kv.is_owned_by(name, owner)? => extend_found(inner, name, owner, ttl, &kv),
        _ => Ok(None),
    }
}

/// A renewal round, every kind of hold together: the keys read in one transaction per
/// 128 (etcd's `--max-txn-ops`), those transactions sent at once; one keep-alive for
/// the etcd leases that carry only keys renewed in this round (and of the right class);
/// the other keys are moved to the current lease of their class, so that a lease
/// carrying a key nobody renews any more (a fixed lease, a guard past `max_hold`) is
/// not extended and ends. Each renewal is reported as soon as it is decided: a key
/// found gone after the reads, the kept-alive ones after the keep-alive, the moved
/// ones after the move transactions.
pub(crate) fn extend_many(inner: &Inner, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
    // Each renewal's key and the class of its etcd lease.
    let mut keys: Vec<Option<KeyOf>> = Vec::with_capacity(renewals.len());
    for (i, r) in renewals.iter().enumerate() {
        match r.claim {
            Claim::Exclusive => {
                keys.push(Some((inner.key(r.name), class_of as fn(Duration) -> i64)))
            }
            claim => match Resource::of(inner, r.name, claim) {
                Ok(res) => keys.push(Some((
                    res.holder(claim, r.owner),
                    claim_class as fn(Duration) -> i64,
                ))),
                Err(e) => {
                    keys.push(None);
                    renewed(i, Err(e));
                }
            },
        }
    }
    let asked: Vec<usize> = (0..renewals.len()).filter(|&i| keys[i].is_some()).collect();
    let key = |i: usize| &keys[i].as_ref().expect("asked").0;
    let class = |i: usize| keys[i].as_ref().expect("asked").1;
    // The reads, one transaction per 128 keys, all at once.
    let chunks: Vec<&[usize]> = asked.chunks(MAX_TXN_OPS).collect();
    let replies = all_at_once(&chunks, |chunk| {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|&i| json!({ "request_range": { "key": b64(key(i)) } }))
            .collect();
        inner
            .gateway
            .post_read("/v3/kv/txn", &json!({ "success": ops }))
            .and_then(|reply| {
                reply
                    .get("responses")
                    .and_then(Value::as_array)
                    .filter(|a| a.len() == chunk.len())
                    .cloned()
                    .ok_or_else(|| bad_reply("responses"))
            })
    });
    let mut found: Vec<Found> = Vec::new();
    for (chunk, reply) in chunks.iter().zip(replies) {
        match reply {
            Err(e) => {
                for &i in *chunk {
                    renewed(i, Err(e.duplicate()));
                }
            }
            Ok(responses) => {
                for (&i, resp) in chunk.iter().zip(&responses) {
                    let r = &renewals[i];
                    let kv = resp
                        .pointer("/response_range/kvs/0")
                        .map(Kv::from_json)
                        .transpose();
                    match kv {
                        Err(e) => renewed(i, Err(e)),
                        Ok(None) => renewed(i, Ok(None)),
                        Ok(Some(kv)) => match kv.is_owned_by(r.name, r.owner) {
                            Err(e) => renewed(i, Err(e)),
                            Ok(false) => renewed(i, Ok(None)),
                            Ok(true) => found.push((i, kv)),
                        },
                    }
                }
            }
        }
    }
    // A lease is kept alive only if every key it may carry is renewed here, each of
    // the right class; the keys of any other lease are moved.
    let tags: HashSet<Vec<u8>> = found
        .iter()
        .map(|(i, _)| tag_of(key(*i), renewals[*i].owner))
        .collect();
    let fits = |i: usize, kv: &Kv| {
        let r = &renewals[i];
        let class = class(i);
        kv.holder(r.name)
            .is_ok_and(|(_, held_for)| class(held_for) == class(r.ttl) && held_for >= r.ttl)
    };
    let mut alive: Vec<i64> = Vec::new();
    {
        let leases = inner.leases.lock();
        let mut refused: Vec<i64> = Vec::new();
        for (_, kv) in &found {
            if alive.contains(&kv.lease) || refused.contains(&kv.lease) {
                continue;
            }
            let ok = leases.only_carries(kv.lease, &|t: &[u8]| tags.contains(t))
                && found
                    .iter()
                    .filter(|(_, k)| k.lease == kv.lease)
                    .all(|(j, k)| fits(*j, k));
            if ok {
                alive.push(kv.lease);
            } else {
                refused.push(kv.lease);
            }
        }
    }
    let (batched, mut to_move): (Vec<Found>, Vec<Found>) = found
        .into_iter()
        .partition(|(_, kv)| alive.contains(&kv.lease));
    if !batched.is_empty() {
        let sent = Instant::now();
        match inner.keep_alive(&alive, sent) {
            Err(e) => {
                for (i, _) in &batched {
                    renewed(*i, Err(e.duplicate()));
                }
            }
            Ok(kept) => {
                for (i, kv) in batched {
                    let r = &renewals[i];
                    let granted = kept.get(&kv.lease).copied().unwrap_or(0);
                    let fence = kv.fence();
                    if granted <= 0 {
                        renewed(i, Ok(None));
                    } else if Duration::from_secs(granted.unsigned_abs()) >= r.ttl {
                        renewed(
                            i,
                            inner
                                .lease_from(sent, r.ttl)
                                .map(|l| Some(l.with_fence(fence))),
                        );
                    } else {
                        to_move.push((i, kv));
                    }
                }
            }
        }
    }
    if !to_move.is_empty() {
        let moves: Vec<Move<'_>> = to_move
            .iter()
            .map(|(i, kv)| Move {
                key: key(*i).clone(),
                class: class(*i),
                name: renewals[*i].name,
                owner: renewals[*i].owner,
                ttl: renewals[*i].ttl,
                kv,
            })
            .collect();
        for ((i, _), r) in to_move.iter().zip(move_keys(inner, &moves)) {
            renewed(*i, r);
        }
    }
}

/// `request(chunk)` for every chunk, at once (one thread per chunk beyond the first,
/// at most [`PARALLEL`] requests in flight): a round of many holds costs a round trip,
/// not one per 128 holds. The replies in the chunks' order.
fn all_at_once<C: Sync, T: Send>(
    chunks: &[C],
    request: impl Fn(&C) -> Result<T, BackendError> + Sync,
) -> Vec<Result<T, BackendError>> {
    if chunks.len() <= 1 {
        return chunks.iter().map(&request).collect();
    }
    let mut out: Vec<Option<Result<T, BackendError>>> = chunks.iter().map(|_| None).collect();
    for (wave, slots) in chunks.chunks(PARALLEL).zip(out.chunks_mut(PARALLEL)) {
        std::thread::scope(|scope| {
            let request = &request;
            // A thread that cannot be started leaves its chunk to this one.
            let handles: Vec<_> = wave[1..]
                .iter()
                .map(|c| {
                    std::thread::Builder::new()
                        .name("dlm-etcd-renew".into())
                        .spawn_scoped(scope, move || request(c))
                        .ok()
                })
                .collect();
            slots[0] = Some(request(&wave[0]));
            for ((slot, h), c) in slots[1..].iter_mut().zip(handles).zip(&wave[1..]) {
                *slot = Some(match h {
                    Some(h) => h.join().unwrap_or_else(|_| {
                        Err(BackendError::new(
                            BackendErrorKind::Other,
                            "a renewal request panicked",
                        ))
                    }),
                    None => request(c),
                });
            }
        });
    }
    out.into_iter()
        .map(|r| r.expect("every chunk answered"))
        .collect()
}
