//! A lock's key and value: how dlm writes them and reads them back.

use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, FencingToken, LockName, OwnerToken};
use serde_json::{Value, json};

use crate::gateway::{Gateway, b64, bad_reply, int, revision, unb64};
use crate::inner::Inner;

/// A lock's key as read.
pub(crate) struct Kv {
    pub(crate) value: Vec<u8>,
    pub(crate) lease: i64,
    pub(crate) create_revision: i64,
    pub(crate) mod_revision: i64,
}

impl Kv {
    /// Reads `key`: the key as it is (`None` when there is none), and the revision the
    /// read was made at.
    pub(crate) fn read(gateway: &Gateway, key: &[u8]) -> Result<(Option<Kv>, i64), BackendError> {
        let reply = gateway.post_read("/v3/kv/range", &json!({ "key": b64(key) }))?;
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

    /// A key as the gateway's JSON gives it (`kvs[i]`, `response_range.kvs[i]`).
    pub(crate) fn from_json(kv: &Value) -> Result<Kv, BackendError> {
        Ok(Kv {
            value: kv
                .get("value")
                .map(|v| unb64(v).ok_or_else(|| bad_reply("value")))
                .transpose()?
                .unwrap_or_default(),
            lease: int(kv, "lease")?,
            create_revision: int(kv, "create_revision")?,
            mod_revision: int(kv, "mod_revision")?,
        })
    }

    /// The owner token and the holder's lease, or `UnexpectedKey` for a value dlm did not
    /// write or a key without an etcd lease.
    pub(crate) fn holder(&self, name: &LockName) -> Result<(&[u8], Duration), BackendError> {
        let p = self.parse().ok_or_else(|| unexpected(name))?;
        Ok((p.owner, p.held_for))
    }

    /// The value's parts: `owner|ms`, `owner|ms|token` for a hold whose fencing token is
    /// not its key's `create_revision` (a read hold made by a downgrade keeps the write
    /// hold's), and `owner|ms|token|label` (the token may be empty) for a hold that
    /// carries its holder's label. `None` for a value of another shape, or a key without
    /// an etcd lease.
    fn parse(&self) -> Option<Parts<'_>> {
        if self.lease == 0 {
            return None;
        }
        let mut parts = self.value.splitn(4, |&b| b == b'|');
        let owner = parts.next()?;
        let num =
            |p: &[u8]| -> Option<u64> { std::str::from_utf8(p).ok().and_then(|s| s.parse().ok()) };
        let ms = num(parts.next()?)?;
        let fence = parts.next();
        let label = parts.next();
        let fence = match fence {
            None => None,
            Some(b"") if label.is_some() => None,
            Some(p) => Some(num(p)?),
        };
        if owner.is_empty() {
            return None;
        }
        Some(Parts {
            owner,
            held_for: Duration::from_millis(ms),
            fence,
            label,
        })
    }

    /// The label the value carries, if any.
    pub(crate) fn label(&self) -> Option<&str> {
        self.parse()
            .and_then(|p| p.label)
            .and_then(|l| std::str::from_utf8(l).ok())
            .filter(|l| !l.is_empty())
    }

    /// The hold's fencing token: the one its value carries, else the key's
    /// `create_revision`.
    pub(crate) fn fence(&self) -> FencingToken {
        let carried = self.parse().and_then(|p| p.fence);
        FencingToken::new(carried.unwrap_or(self.create_revision.unsigned_abs()))
    }

    /// The token the value carries, if any (kept when the key is put again).
    pub(crate) fn carried_fence(&self) -> Option<u64> {
        self.parse().and_then(|p| p.fence)
    }

    /// This hold's value with `label` instead of the one it carries (the lease asked for
    /// and the token kept); `None` for a value not of dlm's shape.
    pub(crate) fn relabelled(&self, owner: &OwnerToken, label: Option<&str>) -> Option<Vec<u8>> {
        let p = self.parse()?;
        Some(value(owner, p.held_for, p.fence, label))
    }

    /// This hold's value for `owner` and `ttl`, keeping the token and label it carries
    /// (a renewal that moves the key to another etcd lease).
    pub(crate) fn value_for(&self, owner: &OwnerToken, ttl: Duration) -> Vec<u8> {
        value(owner, ttl, self.carried_fence(), self.label())
    }

    pub(crate) fn is_owned_by(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        Ok(self.holder(name)?.0 == owner.encoded().as_bytes())
    }
}

/// A value's parts (see [`Kv::parse`]).
struct Parts<'a> {
    owner: &'a [u8],
    held_for: Duration,
    fence: Option<u64>,
    label: Option<&'a [u8]>,
}

/// A key as carried by an etcd lease for one owner: the key, a 0 byte, the owner token
/// (so that one owner's release never forgets another owner's key).
pub(crate) fn tag_of(key: &[u8], owner: &OwnerToken) -> Vec<u8> {
    let mut t = key.to_vec();
    t.push(0);
    t.extend_from_slice(owner.encoded().as_bytes());
    t
}

pub(crate) fn value_of(owner: &OwnerToken, ttl: Duration) -> Vec<u8> {
    value(owner, ttl, None, None)
}

/// `owner|ms`; `owner|ms|token` when the hold carries its token (see [`Kv::fence`]);
/// `owner|ms|token|label` (the token may be empty) when it carries a label.
pub(crate) fn value(
    owner: &OwnerToken,
    ttl: Duration,
    fence: Option<u64>,
    label: Option<&str>,
) -> Vec<u8> {
    let mut v = owner.encoded().as_bytes().to_vec();
    v.push(b'|');
    v.extend_from_slice(ttl.as_millis().to_string().as_bytes());
    if fence.is_some() || label.is_some() {
        v.push(b'|');
        if let Some(f) = fence {
            v.extend_from_slice(f.to_string().as_bytes());
        }
    }
    if let Some(label) = label {
        v.push(b'|');
        v.extend_from_slice(label.as_bytes());
    }
    v
}

fn unexpected(name: &LockName) -> BackendError {
    BackendError::new(
        BackendErrorKind::UnexpectedKey,
        format!("the key of lock {name:?} was not written by dlm (or has no lease)"),
    )
}

/// Deletes `key` if its value is `owner`'s: the revision of the deletion, `None` if
/// it was not `owner`'s (any more).
pub(crate) fn release_at(
    inner: &Inner,
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
    let reply = inner.gateway.post("/v3/kv/txn", &txn)?;
    // Either way this owner's key is on no etcd lease any more.
    inner
        .leases
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
