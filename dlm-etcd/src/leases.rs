//! etcd leases: their whole-second classes and which keys each may carry (their grants
//! and keep-alives are `Inner`'s, in `inner.rs`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

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

/// What new keys an etcd lease takes: holds of one whole-second TTL, or writers' marks
/// of one. Marks never share a lease with holds: a lease that carries a hold is kept alive
/// by that hold's renewals, and a mark on it would outlive the writer that set it (a mark
/// put by a writer whose record of it a granted writer had just cleared would then hold
/// new readers back until the next writer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Class {
    /// The etcd lease's TTL, in whole seconds.
    pub(crate) secs: i64,
    pub(crate) marks: bool,
}

impl Class {
    /// The class of holds kept on etcd leases of `secs` seconds.
    pub(crate) fn holds(secs: i64) -> Class {
        Class { secs, marks: false }
    }

    /// The class of writers' marks kept on etcd leases of `secs` seconds.
    pub(crate) fn marks(secs: i64) -> Class {
        Class { secs, marks: true }
    }
}

/// The etcd leases of one backend.
#[derive(Default)]
pub(crate) struct Leases {
    /// The current etcd lease of each class: new keys of the class go on it.
    pub(crate) current: HashMap<Class, Slot>,
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
