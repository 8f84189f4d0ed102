//! The keys of a semaphore or a read-write lock: the resource's prefix and the key of
//! each kind of hold under it (see `claims` for what is written there, and `renew` for
//! the renewals of every kind).
//!
//! A resource is `{prefix}lock/{name} 0 sem 0` or `{prefix}lock/{name} 0 rw 0` (a 0 byte:
//! a lock name holds no control character, so no mutex key and no other resource's key
//! falls under it).

use dlm_core::backend::{BackendError, BackendErrorKind, Claim, LockName, OwnerToken};

use crate::inner::Inner;

/// A semaphore's or read-write lock's keys.
pub(crate) struct Resource {
    /// `name 0 kind`: the watch's key for its waiters.
    pub(crate) id: Vec<u8>,
    /// `{prefix}lock/` + id + `0`: every key of the resource starts with it.
    pub(crate) prefix: Vec<u8>,
    /// The end of the prefix's range (its last byte, 0, plus one).
    end: Vec<u8>,
}

impl Resource {
    /// The keys of `name`'s semaphore or read-write lock.
    pub(crate) fn of(
        inner: &Inner,
        name: &LockName,
        claim: Claim,
    ) -> Result<Resource, BackendError> {
        let kind: &[u8] = match claim {
            Claim::Permit { .. } => b"sem",
            Claim::Read | Claim::Write => b"rw",
            _ => return Err(unsupported(claim)),
        };
        let mut id = name.as_str().as_bytes().to_vec();
        id.push(0);
        id.extend_from_slice(kind);
        let mut prefix = inner.key_prefix.clone();
        prefix.extend_from_slice(&id);
        prefix.push(0);
        let mut end = prefix.clone();
        *end.last_mut().expect("not empty") = 1;
        Ok(Resource { id, prefix, end })
    }

    pub(crate) fn key(&self, suffix: &[u8]) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(suffix);
        k
    }

    /// The key of `owner`'s hold of kind `claim`.
    pub(crate) fn holder(&self, claim: Claim, owner: &OwnerToken) -> Vec<u8> {
        let token = owner.encoded();
        let mut suffix = match claim {
            Claim::Permit { permits } => format!("{permits}\0").into_bytes(),
            Claim::Read => b"r".to_vec(),
            _ => b"w".to_vec(),
        };
        suffix.extend_from_slice(token.as_bytes());
        self.key(&suffix)
    }

    pub(crate) fn mark(&self) -> Vec<u8> {
        self.key(b"m")
    }

    /// The whole resource: `[prefix, end)`.
    pub(crate) fn all(&self) -> (Vec<u8>, Vec<u8>) {
        (self.prefix.clone(), self.end.clone())
    }

    /// Every hold of a read-write lock (readers and writers, not the mark).
    pub(crate) fn holds(&self) -> (Vec<u8>, Vec<u8>) {
        (self.key(b"r"), self.end.clone())
    }

    /// The write holds of a read-write lock.
    pub(crate) fn writers(&self) -> (Vec<u8>, Vec<u8>) {
        (self.key(b"w"), self.key(b"x"))
    }
}

fn unsupported(claim: Claim) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        format!("dlm-etcd keeps no {claim} holds"),
    )
}
