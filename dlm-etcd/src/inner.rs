//! The state one `EtcdBackend` shares with its watch thread and renewals: the gateway to
//! the members, the key prefix, the etcd leases it granted, the release hints; and the
//! lease bookkeeping every operation uses (which etcd lease a hold goes on, keep-alives).
//! `Inner` is defined and implemented here only.
//!
//! Below the `LockBackend` impl (`backend`) and the operations, each a function of its
//! module taking `&Inner` (`acquire`: a mutex's; `claims`: a semaphore's or read-write
//! lock's; `renew`: renewals of every kind); above the pieces it holds (`gateway`,
//! `leases`, `hints`). See the layers in `lib.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind, Lease, LockName};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::gateway::{Gateway, bad_reply, int};
use crate::hints::Hints;
use crate::leases::{Carried, Class, LEASE_END_SLACK, Leases, Slot, class_of};

/// What the operations of one `EtcdBackend` share (see the module's docs).
pub(crate) struct Inner {
    /// Shared with the watch thread.
    pub(crate) gateway: Arc<Gateway>,
    /// Key prefix of every lock: `{prefix}lock/`.
    pub(crate) key_prefix: Vec<u8>,
    /// The clock-drift allowance, as a fraction of a lease (the builder's).
    pub(crate) drift_factor: f64,
    /// The etcd leases this backend granted: the current one of each class, and the keys
    /// each may carry.
    pub(crate) leases: Mutex<Leases>,
    /// The release-hint subscriptions and the watch thread, started by the first waiter.
    pub(crate) hints: Mutex<Option<Hints>>,
}

impl Inner {
    /// The key of the mutex `name`: `{prefix}lock/{name}`.
    pub(crate) fn key(&self, name: &LockName) -> Vec<u8> {
        let mut k = self.key_prefix.clone();
        k.extend_from_slice(name.as_str().as_bytes());
        k
    }

    /// The drift allowance of a lease of `ttl`: `ttl x drift_factor + 2 ms`.
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
        self.lease_in(Class::holds(class_of(ttl)), ttl, now, key)
    }

    /// An etcd lease of `class` that lasts at least `ttl` from `now`: the current one of
    /// the class or a new one, recorded as (maybe) carrying `key` from now on.
    pub(crate) fn lease_in(
        &self,
        class: Class,
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
            .post("/v3/lease/grant", &json!({ "TTL": class.secs.to_string() }))?;
        let id = int(&reply, "ID")?;
        let granted = int(&reply, "TTL")?;
        if id == 0 || granted < class.secs {
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
