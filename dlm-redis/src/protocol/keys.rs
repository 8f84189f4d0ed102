//! The key layout of a lock: its key, its release channel and its slot's fencing stream.

use std::time::Duration;

use dlm_core::backend::{Claim, LockName};

use crate::transport::Resp;

/// The key layout: one hash tag per lock, so the lock key and its release channel share a
/// cluster slot, and one fencing stream per slot (`prefix:fence:{tag}`, where the tag puts
/// it in the lock key's slot). Names go into KEYS only.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
    /// `PEXPIRE` of a fencing stream, refreshed by every acquisition that uses it.
    pub(crate) fence_ttl_ms: u64,
}

pub(crate) const LOCK: &str = "";

pub(crate) const CHANNEL: &str = ":released";

/// The hash of a name's semaphore (`prefix:{name}:sem`) or read-write lock
/// (`prefix:{name}:rw`): separate from the mutex's key, in the same slot (the `{name}`
/// hash tag; see [`Keys::claim_slot`] for the one exception).
pub(crate) fn claim_suffix(claim: Claim) -> &'static str {
    match claim {
        Claim::Read | Claim::Write => ":rw",
        _ => ":sem",
    }
}

impl Keys {
    pub(crate) fn new(prefix: String, fence_ttl: Duration) -> Self {
        Keys {
            prefix,
            fence_ttl_ms: millis(fence_ttl),
        }
    }

    /// The hash slot of `prefix:{name}`, computed without building the key: the prefix
    /// holds no braces, so the hashed part is the name up to its first `}`, or the whole
    /// key when the name starts with one.
    pub(crate) fn slot(&self, name: &LockName) -> u16 {
        let n = name.as_str().as_bytes();
        match n.iter().position(|&b| b == b'}') {
            Some(0) => crate::slot::key_slot(self.lock(name).as_bytes()),
            Some(end) => crate::slot::key_slot_of_tag(&n[..end]),
            None => crate::slot::key_slot_of_tag(n),
        }
    }

    /// `prefix:fence:{tag}`: the fencing stream of `name`'s slot.
    pub(crate) fn fence(&self, name: &LockName) -> String {
        self.fence_of_slot(self.slot(name))
    }

    /// `prefix:fence:{tag}`: the fencing stream of hash slot `slot`.
    pub(crate) fn fence_of_slot(&self, slot: u16) -> String {
        format!("{}:fence:{{{}}}", self.prefix, crate::slot::tag(slot))
    }

    /// Writes the fencing stream's key of `name` as one argument.
    pub(crate) fn fence_arg(&self, r: &mut Resp, name: &LockName) {
        r.arg_parts(&[
            self.prefix.as_bytes(),
            b":fence:{",
            crate::slot::tag(self.slot(name)).as_bytes(),
            b"}",
        ]);
    }

    fn key(&self, name: &LockName, suffix: &str) -> String {
        format!("{}:{{{}}}{suffix}", self.prefix, name.as_str())
    }

    /// `prefix:{name}`
    pub(crate) fn lock(&self, name: &LockName) -> String {
        self.key(name, LOCK)
    }

    /// `prefix:{name}:released`
    pub(crate) fn channel(&self, name: &LockName) -> String {
        self.key(name, CHANNEL)
    }

    /// `prefix:{name}:sem` or `prefix:{name}:rw`: the hash of the `claim` resource `name`.
    pub(crate) fn claim(&self, name: &LockName, claim: Claim) -> String {
        self.key(name, claim_suffix(claim))
    }

    /// `prefix:{name}:sem:released` or `prefix:{name}:rw:released`: where a release of
    /// the `claim` resource `name` is announced (matched by the release-hint listeners'
    /// pattern `prefix:*:released`; no lock channel ends so, since a lock's ends in
    /// `}:released`).
    pub(crate) fn claim_channel(&self, name: &LockName, claim: Claim) -> String {
        format!("{}{CHANNEL}", self.claim(name, claim))
    }

    /// The hash slot of the `claim` resource `name`'s hash: the name's slot, except for a
    /// name that starts with `}` (an empty hash tag: the whole key is hashed), so it is
    /// always computed from the key itself.
    pub(crate) fn claim_slot(&self, name: &LockName, claim: Claim) -> u16 {
        crate::slot::key_slot(self.claim(name, claim).as_bytes())
    }

    /// Writes the fencing stream's key of the slot `slot` as one argument.
    pub(crate) fn fence_arg_of_slot(&self, r: &mut Resp, slot: u16) {
        r.arg_parts(&[
            self.prefix.as_bytes(),
            b":fence:{",
            crate::slot::tag(slot).as_bytes(),
            b"}",
        ]);
    }

    /// Every key and the channel of `name`.
    pub(crate) fn all(&self, name: &LockName) -> LockKeys {
        LockKeys {
            lock: self.lock(name),
            fencing_stream: self.fence(name),
            channel: self.channel(name),
        }
    }

    /// Writes `prefix:{name}suffix` as one argument.
    pub(crate) fn arg(&self, r: &mut Resp, name: &LockName, suffix: &str) {
        r.arg_parts(&[
            self.prefix.as_bytes(),
            b":{",
            name.as_str().as_bytes(),
            b"}",
            suffix.as_bytes(),
        ]);
    }
}

/// Whole milliseconds, rounded up, for PX/PEXPIRE.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The Redis keys and the channel of one lock, from `RedisBackend::keys` or
/// `Redlock::keys`: for ACLs, monitoring and administration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LockKeys {
    /// `prefix:{name}`: a string, the holder's owner token (with `~` appended once a
    /// waiter has marked it), with an expiry.
    pub lock: String,
    /// `prefix:fence:{tag}`: the fencing stream of the lock's cluster slot, shared by the
    /// names of that slot, with an expiry that every acquisition refreshes.
    pub fencing_stream: String,
    /// `prefix:{name}:released`: the channel a release is announced on.
    pub channel: String,
}
