//! A lock's key and value: how dlm writes them and reads them back.

use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind, LockName, OwnerToken};
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
        let unexpected = || {
            BackendError::new(
                BackendErrorKind::UnexpectedKey,
                format!("the key of lock {name:?} was not written by dlm (or has no lease)"),
            )
        };
        if self.lease == 0 {
            return Err(unexpected());
        }
        let sep = self
            .value
            .iter()
            .rposition(|&b| b == b'|')
            .ok_or_else(unexpected)?;
        let ms: u64 = std::str::from_utf8(&self.value[sep + 1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(unexpected)?;
        Ok((&self.value[..sep], Duration::from_millis(ms)))
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
    let mut v = owner.encoded().as_bytes().to_vec();
    v.push(b'|');
    v.extend_from_slice(ttl.as_millis().to_string().as_bytes());
    v
}
