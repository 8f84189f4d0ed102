//! A lock's key and value: how dlm writes them and reads them back.

use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, FencingToken, LockName, OwnerToken};
use serde_json::Value;

use crate::gateway::{bad_reply, int, unb64};

/// A lock's key as read.
pub(crate) struct Kv {
    pub(crate) value: Vec<u8>,
    pub(crate) lease: i64,
    pub(crate) create_revision: i64,
    pub(crate) mod_revision: i64,
}

impl Kv {
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
        let (owner, ms, _) = self.parse().ok_or_else(|| unexpected(name))?;
        Ok((owner, ms))
    }

    /// The value's parts: `owner|ms`, or `owner|ms|token` for a hold whose fencing token
    /// is not its key's `create_revision` (a read hold made by a downgrade keeps the
    /// write hold's). `None` for a value of another shape, or a key without an etcd lease.
    fn parse(&self) -> Option<(&[u8], Duration, Option<u64>)> {
        if self.lease == 0 {
            return None;
        }
        let mut parts = self.value.split(|&b| b == b'|');
        let owner = parts.next()?;
        let num = |p: Option<&[u8]>| -> Option<u64> {
            std::str::from_utf8(p?).ok().and_then(|s| s.parse().ok())
        };
        let ms = num(parts.next())?;
        let fence = match parts.next() {
            None => None,
            p => Some(num(p)?),
        };
        if parts.next().is_some() || owner.is_empty() {
            return None;
        }
        Some((owner, Duration::from_millis(ms), fence))
    }

    /// The hold's fencing token: the one its value carries, else the key's
    /// `create_revision`.
    pub(crate) fn fence(&self) -> FencingToken {
        let carried = self.parse().and_then(|(_, _, f)| f);
        FencingToken::new(carried.unwrap_or(self.create_revision.unsigned_abs()))
    }

    /// The token the value carries, if any (kept when the key is put again).
    pub(crate) fn carried_fence(&self) -> Option<u64> {
        self.parse().and_then(|(_, _, f)| f)
    }

    pub(crate) fn is_owned_by(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        Ok(self.holder(name)?.0 == owner.encoded().as_bytes())
    }
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
    value_with_fence(owner, ttl, None)
}

/// `owner|ms`, or `owner|ms|token` when the hold carries its token (see [`Kv::fence`]).
pub(crate) fn value_with_fence(owner: &OwnerToken, ttl: Duration, fence: Option<u64>) -> Vec<u8> {
    let mut v = owner.encoded().as_bytes().to_vec();
    v.push(b'|');
    v.extend_from_slice(ttl.as_millis().to_string().as_bytes());
    if let Some(f) = fence {
        v.push(b'|');
        v.extend_from_slice(f.to_string().as_bytes());
    }
    v
}

fn unexpected(name: &LockName) -> BackendError {
    BackendError::new(
        BackendErrorKind::UnexpectedKey,
        format!("the key of lock {name:?} was not written by dlm (or has no lease)"),
    )
}
