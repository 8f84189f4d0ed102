//! etcd leases: their whole-second classes, which keys each may carry, grants and keep-alives.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind, Lease};
use serde_json::{Value, json};

use crate::backend::Inner;
use crate::gateway::{bad_reply, int};

/// Added to a lease's TTL for the time after which this backend forgets it: etcd's
/// expiry check (every 0.5 s) and the revocation's trip through Raft.
pub(crate) const LEASE_END_SLACK: Duration = Duration::from_secs(2);

/// An etcd lease this backend puts new locks on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub(crate) id: i64,
    /// No earlier than the lease's end on the server (counted from before the grant or
    /// the last keep-alive was sent).
    pub(crate) expires: Instant,
}

/// The etcd leases of one backend.
#[derive(Default)]
pub(crate) struct Leases {
    /// The current etcd lease of each class (its TTL in whole seconds): new locks go on it.
    pub(crate) current: HashMap<i64, Slot>,
    /// The keys each etcd lease may carry: a key is added before the request that puts it
    /// there is sent, and removed once it is known to be elsewhere or gone, so this is a
    /// superset. A keep-alive never extends a lease that may carry a key not renewed by
    /// it; a lease that is not here is never kept alive.
    pub(crate) carried: HashMap<i64, Carried>,
}

pub(crate) struct Carried {
    pub(crate) keys: HashSet<Vec<u8>>,
    /// After this the lease has ended on the server (granted or last kept alive before
    /// then, plus its TTL), unless a leader change refreshed it: forgotten then (its keys,
    /// if any are left, are moved at their next renewal, never kept alive here).
    pub(crate) ends_by: Instant,
}

impl Leases {
    /// Records that `key` may be on lease `id` from now on.
    pub(crate) fn carry(&mut self, id: i64, key: &[u8]) {
        if let Some(c) = self.carried.get_mut(&id) {
            c.keys.insert(key.to_vec());
        }
    }

    /// `key` is not on lease `id` (any more).
    pub(crate) fn drop_key(&mut self, id: i64, key: &[u8]) {
        if let Some(c) = self.carried.get_mut(&id) {
            c.keys.remove(key);
        }
    }

    /// `key` is on no lease of ours (released, or another owner's).
    pub(crate) fn drop_key_everywhere(&mut self, key: &[u8]) {
        for c in self.carried.values_mut() {
            c.keys.remove(key);
        }
    }

    /// Whether keeping lease `id` alive extends only keys in `renewed`.
    pub(crate) fn only_carries(&self, id: i64, renewed: &dyn Fn(&[u8]) -> bool) -> bool {
        self.carried
            .get(&id)
            .is_some_and(|c| c.keys.iter().all(|k| renewed(k)))
    }

    /// Forgets lease `id` (found gone).
    pub(crate) fn forget(&mut self, id: i64) {
        self.current.retain(|_, s| s.id != id);
        self.carried.remove(&id);
    }

    /// Forgets leases that have ended, and those that carry nothing and take no new keys.
    pub(crate) fn sweep(&mut self, now: Instant) {
        let current: HashSet<i64> = self.current.values().map(|s| s.id).collect();
        self.carried
            .retain(|id, c| c.ends_by > now && (current.contains(id) || !c.keys.is_empty()));
    }
}

/// The etcd lease TTL, in whole seconds, of a lock held for `ttl`: rounded up, plus one
/// second, so that a lease granted or renewed a moment ago still outlives a new lock's
/// lease and can be shared.
pub(crate) fn class_of(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX / 2) + 1
}

impl Inner {
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// `start + ttl - drift`, or a `Timeout` when nothing is left.
    pub(crate) fn lease_from(&self, start: Instant, ttl: Duration) -> Result<Lease, BackendError> {
        ttl.checked_sub(self.drift(ttl))
            .and_then(|d| start.checked_add(d))
            .map(Lease::new)
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    "the lease is too short for the drift allowance",
                )
            })
    }

    /// An etcd lease that lasts at least `ttl` from `now`, the current one of its class or
    /// a new one, recorded as (maybe) carrying `key` from now on.
    pub(crate) fn lease_for(
        &self,
        ttl: Duration,
        now: Instant,
        key: &[u8],
    ) -> Result<i64, BackendError> {
        self.lease_in(class_of(ttl), ttl, now, key)
    }

    /// An etcd lease of `class` seconds that lasts at least `ttl` from `now`: the current
    /// one of the class or a new one, recorded as (maybe) carrying `key` from now on.
    pub(crate) fn lease_in(
        &self,
        class: i64,
        ttl: Duration,
        now: Instant,
        key: &[u8],
    ) -> Result<i64, BackendError> {
        {
            let mut leases = self.leases.lock();
            if let Some(slot) = leases.current.get(&class).copied()
                && slot.expires >= now + ttl
            {
                leases.carry(slot.id, key);
                return Ok(slot.id);
            }
        }
        let sent = Instant::now();
        let reply = self
            .gateway
            .post("/v3/lease/grant", &json!({ "TTL": class.to_string() }))?;
        let id = int(&reply, "ID")?;
        let granted = int(&reply, "TTL")?;
        if id == 0 || granted < class {
            return Err(bad_reply("TTL"));
        }
        let granted = Duration::from_secs(granted.unsigned_abs());
        let expires = sent + granted;
        let mut leases = self.leases.lock();
        leases.sweep(Instant::now());
        leases.current.insert(class, Slot { id, expires });
        leases.carried.insert(
            id,
            Carried {
                keys: HashSet::from([key.to_vec()]),
                ends_by: Instant::now() + granted + LEASE_END_SLACK,
            },
        );
        Ok(id)
    }

    /// Forgets `id` (it was found gone).
    pub(crate) fn forget_lease(&self, id: i64) {
        self.leases.lock().forget(id);
    }

    /// Keeps `ids` alive in one request: for each, the TTL (seconds) it was renewed to, 0
    /// when it is gone. A slot whose lease was renewed gets the new end. The caller has
    /// checked that each lease carries only keys it renews (`Leases::only_carries`).
    pub(crate) fn keep_alive(
        &self,
        ids: &[i64],
        sent: Instant,
    ) -> Result<HashMap<i64, i64>, BackendError> {
        let mut body = String::new();
        for id in ids {
            body.push_str(&json!({ "ID": id.to_string() }).to_string());
            body.push('\n');
        }
        let text = self.gateway.post_raw("/v3/lease/keepalive", &body)?;
        let mut out = HashMap::new();
        for line in serde_json::Deserializer::from_str(&text).into_iter::<Value>() {
            let line = line.map_err(|_| bad_reply("result"))?;
            if let Some(err) = line.get("error") {
                return Err(BackendError::new(
                    BackendErrorKind::Other,
                    format!(
                        "lease keep-alive: {}",
                        err.get("message").and_then(Value::as_str).unwrap_or("?")
                    ),
                ));
            }
            let result = line.get("result").ok_or_else(|| bad_reply("result"))?;
            out.insert(int(result, "ID")?, int(result, "TTL")?);
        }
        let received = Instant::now();
        let mut leases = self.leases.lock();
        for slot in leases.current.values_mut() {
            if let Some(&ttl) = out.get(&slot.id)
                && ttl > 0
            {
                slot.expires = slot
                    .expires
                    .max(sent + Duration::from_secs(ttl.unsigned_abs()));
            }
        }
        for (id, &ttl) in &out {
            if ttl <= 0 {
                leases.forget(*id);
            } else if let Some(c) = leases.carried.get_mut(id) {
                c.ends_by = c
                    .ends_by
                    .max(received + Duration::from_secs(ttl.unsigned_abs()) + LEASE_END_SLACK);
            }
        }
        Ok(out)
    }
}

/// The etcd lease TTL, in whole seconds, of a semaphore's or read-write lock's hold of
/// `ttl`: `ceil(ttl + min(ttl / 2, 1 s))`. Tighter than [`class_of`] for short holds (a
/// 300 ms permit goes on a 1 s lease, not 2 s: a crashed holder's permit is back sooner),
/// with the same reuse window of up to a second for long ones.
pub(crate) fn claim_class(ttl: Duration) -> i64 {
    let padded = ttl + (ttl / 2).min(Duration::from_secs(1));
    let secs = padded.as_secs() + u64::from(padded.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_classes_round_up_and_add_a_second() {
        assert_eq!(class_of(Duration::from_millis(1)), 2);
        assert_eq!(class_of(Duration::from_millis(300)), 2);
        assert_eq!(class_of(Duration::from_secs(1)), 2);
        assert_eq!(class_of(Duration::from_millis(1001)), 3);
        assert_eq!(class_of(Duration::from_secs(30)), 31);
    }

    #[test]
    fn claim_classes_pad_by_half_the_hold_up_to_a_second() {
        assert_eq!(claim_class(Duration::from_millis(300)), 1);
        assert_eq!(claim_class(Duration::from_millis(700)), 2);
        assert_eq!(claim_class(Duration::from_secs(1)), 2);
        assert_eq!(claim_class(Duration::from_secs(3)), 4);
        assert_eq!(claim_class(Duration::from_secs(30)), 31);
    }
}
