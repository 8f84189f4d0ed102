//! `EtcdBackend`: the lock operations as etcd transactions.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::InvalidArgument;
use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Renewal, Watch,
};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::gateway::{Gateway, Timeouts, b64, bad_reply, int, is_lease_not_found, revision, unb64};
use crate::watch::Watcher;

/// etcd's default `--max-txn-ops`: a renewal round reads at most this many keys per
/// transaction.
const MAX_TXN_OPS: usize = 128;

/// Added to a lease's TTL for the time after which this backend forgets it: etcd's
/// expiry check (every 0.5 s) and the revocation's trip through Raft.
const LEASE_END_SLACK: Duration = Duration::from_secs(2);

thread_local! {
    /// The revision of this thread's last attempt that found a lock held: the shared watch,
    /// when this thread starts it, starts just after it (see `watch`).
    static LAST_HELD_REVISION: Cell<i64> = const { Cell::new(0) };
}

/// A lock backend on an etcd cluster (or a single member), over etcd's v3 HTTP/JSON
/// gateway.
///
/// - **Keys.** A lock called `n` is the key `dlm/lock/n` (the prefix is configurable);
///   its value is the owner token and the holder's lease in milliseconds
///   (`token|ms`), attached to an etcd lease. Nothing else is written.
/// - **Acquisition** is one transaction: put the key with the lease if it does not exist
///   (`create_revision == 0`), else read it.
/// - **Fencing token:** the key's `create_revision`, a cluster-wide revision that only
///   grows, kept in the Raft log: it survives restarts of every member, leader changes
///   and the loss of any minority.
/// - **Leases.** etcd leases have whole-second TTLs. A lock with a lease of `d` is put on
///   an etcd lease of `ceil(d) + 1` seconds that this backend shares among the locks it
///   takes with leases of the same whole-second class, reused for as long as it outlives
///   the new lock's lease. A renewal keeps an etcd lease alive only when every key on
///   it is renewed in that round (one keep-alive for all such leases); other renewed
///   keys move to the current lease of their class, so a lock nobody renews (a fixed
///   lease, a leaked guard past `max_hold`) ends with its own etcd lease whatever the
///   other locks do. So the server may keep a lock up to about 2 s longer than asked (the rounding, plus etcd's own expiry check every 0.5 s); the
///   holder's validity is the lease asked for, never more.
/// - **Release** deletes the key only if its value is still the owner's (compared in the
///   transaction). Waiters are woken by one streaming `/v3/watch` per backend.
///
/// Build it with [`EtcdBackend::new`] or [`EtcdBackend::builder`].
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) gateway: Gateway,
    /// Key prefix of every lock: `{prefix}lock/`.
    pub(crate) key_prefix: Vec<u8>,
    drift_factor: f64,
    /// The etcd leases this backend granted: the current one of each class, and the keys
    /// each may carry.
    leases: Mutex<Leases>,
    watcher: Mutex<Option<Watcher>>,
}

/// An etcd lease this backend puts new locks on.
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: i64,
    /// No earlier than the lease's end on the server (counted from before the grant or
    /// the last keep-alive was sent).
    expires: Instant,
}

/// The etcd leases of one backend.
#[derive(Default)]
struct Leases {
    /// The current etcd lease of each class (its TTL in whole seconds): new locks go on it.
    current: HashMap<i64, Slot>,
    /// The keys each etcd lease may carry: a key is added before the request that puts it
    /// there is sent, and removed once it is known to be elsewhere or gone, so this is a
    /// superset. A keep-alive never extends a lease that may carry a key not renewed by
    /// it; a lease that is not here is never kept alive.
    carried: HashMap<i64, Carried>,
}

struct Carried {
    keys: HashSet<Vec<u8>>,
    /// After this the lease has ended on the server (granted or last kept alive before
    /// then, plus its TTL), unless a leader change refreshed it: forgotten then (its keys,
    /// if any are left, are moved at their next renewal, never kept alive here).
    ends_by: Instant,
}

impl Leases {
    /// Records that `key` may be on lease `id` from now on.
    fn carry(&mut self, id: i64, key: &[u8]) {
        if let Some(c) = self.carried.get_mut(&id) {
            c.keys.insert(key.to_vec());
        }
    }

    /// `key` is not on lease `id` (any more).
    fn drop_key(&mut self, id: i64, key: &[u8]) {
        if let Some(c) = self.carried.get_mut(&id) {
            c.keys.remove(key);
        }
    }

    /// `key` is on no lease of ours (released, or another owner's).
    fn drop_key_everywhere(&mut self, key: &[u8]) {
        for c in self.carried.values_mut() {
            c.keys.remove(key);
        }
    }

    /// Whether keeping lease `id` alive extends only keys in `renewed`.
    fn only_carries(&self, id: i64, renewed: &dyn Fn(&[u8]) -> bool) -> bool {
        self.carried
            .get(&id)
            .is_some_and(|c| c.keys.iter().all(|k| renewed(k)))
    }

    /// Forgets lease `id` (found gone).
    fn forget(&mut self, id: i64) {
        self.current.retain(|_, s| s.id != id);
        self.carried.remove(&id);
    }

    /// Forgets leases that have ended, and those that carry nothing and take no new keys.
    fn sweep(&mut self, now: Instant) {
        let current: HashSet<i64> = self.current.values().map(|s| s.id).collect();
        self.carried
            .retain(|id, c| c.ends_by > now && (current.contains(id) || !c.keys.is_empty()));
    }
}

/// A lock's key as read.
struct Kv {
    value: Vec<u8>,
    lease: i64,
    create_revision: i64,
    mod_revision: i64,
}

impl Kv {
    fn from_json(kv: &Value) -> Result<Kv, BackendError> {
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
    fn holder(&self, name: &LockName) -> Result<(&[u8], Duration), BackendError> {
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

    fn is_owned_by(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        Ok(self.holder(name)?.0 == owner.encoded().as_bytes())
    }
}

/// The etcd lease TTL, in whole seconds, of a lock held for `ttl`: rounded up, plus one
/// second, so that a lease granted or renewed a moment ago still outlives a new lock's
/// lease and can be shared.
fn class_of(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX / 2) + 1
}

/// A key as carried by an etcd lease for one owner: the key, a 0 byte, the owner token
/// (so that one owner's release never forgets another owner's key).
fn tag_of(key: &[u8], owner: &OwnerToken) -> Vec<u8> {
    let mut t = key.to_vec();
    t.push(0);
    t.extend_from_slice(owner.encoded().as_bytes());
    t
}

/// A renewal's index and its key as read.
type Found = (usize, Kv);

/// A renewal that moves a key to another etcd lease.
struct Move<'a> {
    name: &'a LockName,
    owner: &'a OwnerToken,
    ttl: Duration,
    kv: &'a Kv,
}

fn value_of(owner: &OwnerToken, ttl: Duration) -> Vec<u8> {
    let mut v = owner.encoded().as_bytes().to_vec();
    v.push(b'|');
    v.extend_from_slice(ttl.as_millis().to_string().as_bytes());
    v
}

impl EtcdBackend {
    /// A backend on the etcd members at `urls` (`http://host:port`, the client URLs; one
    /// is enough, more give failover), with the default settings.
    ///
    /// # Errors
    /// `InvalidArgument` for a URL that is not `http://host:port` (no I/O is done here:
    /// a member that is down fails calls, not construction).
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Self, InvalidArgument> {
        Self::builder(urls).build()
    }

    /// A builder for a backend on the etcd members at `urls`.
    pub fn builder<S: AsRef<str>>(urls: &[S]) -> EtcdBackendBuilder {
        EtcdBackendBuilder {
            urls: urls.iter().map(|u| u.as_ref().to_owned()).collect(),
            prefix: "dlm/".to_owned(),
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            pool_size: 16,
        }
    }

    /// The key that holds lock `name` (for operators and tests).
    pub fn key(&self, name: &LockName) -> Vec<u8> {
        self.inner.key(name)
    }

    /// The member URLs, as given.
    pub fn members(&self) -> &[String] {
        self.inner.gateway.members()
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("members", &self.inner.gateway.members())
            .field("prefix", &String::from_utf8_lossy(&self.inner.key_prefix))
            .finish_non_exhaustive()
    }
}

/// Settings of an [`EtcdBackend`]; [`build`](EtcdBackendBuilder::build) checks them.
#[derive(Clone, Debug)]
pub struct EtcdBackendBuilder {
    urls: Vec<String>,
    prefix: String,
    connect_timeout: Duration,
    io_timeout: Duration,
    drift_factor: f64,
    pool_size: usize,
}

impl EtcdBackendBuilder {
    /// The prefix of every key (default `dlm/`; a lock's key is `{prefix}lock/{name}`).
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How long connecting to a member may take (default 1 s). A member that cannot be
    /// reached is skipped for the next one.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a request may wait for its reply (default 1 s); a request that times out
    /// is a transient `Timeout`, and the next request goes to the next member.
    pub fn io_timeout(mut self, t: Duration) -> Self {
        self.io_timeout = t;
        self
    }

    /// The clock-drift allowance as a fraction of the lease (default 0.01): a lease's
    /// validity is `lease - (lease x factor + 2 ms)` from before the request was sent.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Idle connections kept per member (default 16).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// Checks the settings and builds the backend. No I/O.
    ///
    /// # Errors
    /// `InvalidArgument` for no URL, a URL that is not `http://host:port` (`https://` is
    /// not supported yet), the same URL twice, a bad prefix or timeout.
    pub fn build(self) -> Result<EtcdBackend, InvalidArgument> {
        if self.urls.is_empty() {
            return Err(InvalidArgument::new(
                "urls",
                "at least one etcd member URL is needed",
            ));
        }
        let mut members = Vec::new();
        for u in &self.urls {
            let m = parse_member(u)?;
            if members.contains(&m) {
                return Err(InvalidArgument::new("urls", format!("{m} is listed twice")));
            }
            members.push(m);
        }
        if self.prefix.is_empty()
            || self.prefix.len() > 64
            || self.prefix.chars().any(char::is_control)
        {
            return Err(InvalidArgument::new(
                "prefix",
                "must be 1 to 64 bytes without control characters",
            ));
        }
        if self.connect_timeout.is_zero() || self.io_timeout.is_zero() {
            return Err(InvalidArgument::new("timeout", "must be positive"));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(InvalidArgument::new("drift_factor", "must be in [0, 0.5)"));
        }
        if self.pool_size == 0 {
            return Err(InvalidArgument::new("pool_size", "must be at least 1"));
        }
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            io: self.io_timeout,
        };
        let mut key_prefix = self.prefix.into_bytes();
        key_prefix.extend_from_slice(b"lock/");
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                gateway: Gateway::new(members, timeouts, self.pool_size),
                key_prefix,
                drift_factor: self.drift_factor,
                leases: Mutex::new(Leases::default()),
                watcher: Mutex::new(None),
            }),
        })
    }
}

/// `http://host:port` (a trailing `/` allowed), checked in plain words.
fn parse_member(url: &str) -> Result<String, InvalidArgument> {
    let bad = |why: &str| InvalidArgument::new("urls", format!("{url:?}: {why}"));
    let rest = if let Some(rest) = url.strip_prefix("http://") {
        rest
    } else if url.starts_with("https://") {
        return Err(bad(
            "https:// is not supported yet by dlm-etcd (use http://)",
        ));
    } else {
        return Err(bad("must start with http://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    if rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(bad("must be http://host:port, without a path"));
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("has a bad port"))?;
    Ok(format!("http://{rest}"))
}

impl Inner {
    fn key(&self, name: &LockName) -> Vec<u8> {
        let mut k = self.key_prefix.clone();
        k.extend_from_slice(name.as_str().as_bytes());
        k
    }

    fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// `start + ttl - drift`, or a `Timeout` when nothing is left.
    fn lease_from(&self, start: Instant, ttl: Duration) -> Result<Lease, BackendError> {
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
    fn lease_for(&self, ttl: Duration, now: Instant, key: &[u8]) -> Result<i64, BackendError> {
        let class = class_of(ttl);
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
    fn forget_lease(&self, id: i64) {
        self.leases.lock().forget(id);
    }

    /// Keeps `ids` alive in one request: for each, the TTL (seconds) it was renewed to, 0
    /// when it is gone. A slot whose lease was renewed gets the new end. The caller has
    /// checked that each lease carries only keys it renews (`Leases::only_carries`).
    fn keep_alive(&self, ids: &[i64], sent: Instant) -> Result<HashMap<i64, i64>, BackendError> {
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

    fn range(&self, key: &[u8]) -> Result<(Option<Kv>, i64), BackendError> {
        let reply = self
            .gateway
            .post("/v3/kv/range", &json!({ "key": b64(key) }))?;
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

    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let key_bytes = self.key(name);
        let tag = tag_of(&key_bytes, owner);
        let key = b64(&key_bytes);
        let value = b64(&value_of(owner, ttl));
        let mut fresh_lease = false;
        loop {
            let start = Instant::now();
            let lease = self.lease_for(ttl, start, &tag)?;
            let txn = json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": value, "lease": lease.to_string() } }],
                "failure": [{ "request_range": { "key": key } }],
            });
            let reply = match self.gateway.post("/v3/kv/txn", &txn) {
                Err(e) if is_lease_not_found(&e) && !fresh_lease => {
                    self.forget_lease(lease);
                    fresh_lease = true;
                    continue;
                }
                r => r?,
            };
            let rev = revision(&reply)?;
            if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
                let fence = FencingToken::new(rev.unsigned_abs());
                return Ok(Acquire::Acquired(
                    self.lease_from(start, ttl)?.with_fence(fence),
                ));
            }
            let kv = reply
                .pointer("/responses/0/response_range/kvs/0")
                .ok_or_else(|| bad_reply("responses"))?;
            let kv = Kv::from_json(kv)?;
            if kv.lease != lease {
                self.leases.lock().drop_key(lease, &tag);
            }
            if kv.is_owned_by(name, owner)? {
                // Ours already (a retry after a lost reply): refresh it.
                return match self.extend_found(name, owner, ttl, &kv)? {
                    Some(lease) => Ok(Acquire::Acquired(lease)),
                    None => Ok(Acquire::Held { retry_after: None }),
                };
            }
            LAST_HELD_REVISION.with(|r| r.set(rev));
            let (_, holder_ttl) = kv.holder(name)?;
            return Ok(Acquire::Held {
                retry_after: Some(holder_ttl),
            });
        }
    }

    /// Renews `kv` (read just now, ours) for `ttl`: a keep-alive of its etcd lease when
    /// that lease is of `ttl`'s class and carries no other key, else the key is moved.
    fn extend_found(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        kv: &Kv,
    ) -> Result<Option<Lease>, BackendError> {
        let fence = FencingToken::new(kv.create_revision.unsigned_abs());
        let (_, held_for) = kv.holder(name)?;
        let tag = tag_of(&self.key(name), owner);
        let alone = self
            .leases
            .lock()
            .only_carries(kv.lease, &|t: &[u8]| t == tag.as_slice());
        if alone && class_of(held_for) == class_of(ttl) && held_for >= ttl {
            let sent = Instant::now();
            let renewed = self.keep_alive(&[kv.lease], sent)?;
            let granted = renewed.get(&kv.lease).copied().unwrap_or(0);
            if granted <= 0 {
                return Ok(None);
            }
            if Duration::from_secs(granted.unsigned_abs()) >= ttl {
                return Ok(Some(self.lease_from(sent, ttl)?.with_fence(fence)));
            }
        }
        self.move_keys(&[Move {
            name,
            owner,
            ttl,
            kv,
        }])
        .pop()
        .expect("one result per move")
    }

    /// Renews each of `moves` (keys read just now, ours) by putting it on the current
    /// etcd lease of its class (a new one if that would end too soon): the same
    /// `create_revision`, so the same fencing token. The old lease is not kept alive
    /// here: it ends when nothing renews it. One transaction per 128 keys (each compared
    /// on its `mod_revision`), then one per key if some key changed meanwhile.
    fn move_keys(&self, moves: &[Move<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
        let mut out: Vec<Option<Result<Option<Lease>, BackendError>>> =
            moves.iter().map(|_| None).collect();
        // (index, target lease, start) of the moves that need a put.
        let mut puts: Vec<(usize, i64, Instant)> = Vec::new();
        for (i, m) in moves.iter().enumerate() {
            let tag = tag_of(&self.key(m.name), m.owner);
            let start = Instant::now();
            let target = match self.lease_for(m.ttl, start, &tag) {
                Ok(t) => t,
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            };
            let same_value = m.kv.holder(m.name).is_ok_and(|(_, d)| d == m.ttl);
            if target == m.kv.lease && same_value {
                // Already on the current lease of its class, which lasts long enough.
                let fence = FencingToken::new(m.kv.create_revision.unsigned_abs());
                out[i] = Some(
                    self.lease_from(start, m.ttl)
                        .map(|l| Some(l.with_fence(fence))),
                );
            } else {
                puts.push((i, target, start));
            }
        }
        let put_op = |m: &Move<'_>, target: i64| {
            json!({ "request_put": {
                "key": b64(&self.key(m.name)),
                "value": b64(&value_of(m.owner, m.ttl)),
                "lease": target.to_string(),
            }})
        };
        let cmp_op = |m: &Move<'_>| {
            json!({ "key": b64(&self.key(m.name)), "target": "MOD", "result": "EQUAL",
                    "mod_revision": m.kv.mod_revision.to_string() })
        };
        for chunk in puts.chunks(MAX_TXN_OPS) {
            let txn = |items: &[(usize, i64, Instant)]| {
                json!({
                    "compare": items.iter().map(|&(i, _, _)| cmp_op(&moves[i])).collect::<Vec<_>>(),
                    "success": items.iter().map(|&(i, t, _)| put_op(&moves[i], t)).collect::<Vec<_>>(),
                })
            };
            let done = |out: &mut Vec<Option<Result<Option<Lease>, BackendError>>>,
                        items: &[(usize, i64, Instant)],
                        reply: Result<Value, BackendError>| {
                match reply {
                    Err(e) => {
                        if is_lease_not_found(&e) {
                            for &(_, t, _) in items {
                                self.forget_lease(t);
                            }
                        }
                        for &(i, _, _) in items {
                            out[i] = Some(Err(BackendError::new(
                                BackendErrorKind::Unavailable,
                                format!("moving the key to a new etcd lease: {}", e.message()),
                            )));
                        }
                        true
                    }
                    Ok(reply) if reply.get("succeeded").and_then(Value::as_bool) == Some(true) => {
                        let mut leases = self.leases.lock();
                        for &(i, t, start) in items {
                            let m = &moves[i];
                            if t != m.kv.lease {
                                leases.drop_key(m.kv.lease, &tag_of(&self.key(m.name), m.owner));
                            }
                            let fence = FencingToken::new(m.kv.create_revision.unsigned_abs());
                            out[i] = Some(
                                self.lease_from(start, m.ttl)
                                    .map(|l| Some(l.with_fence(fence))),
                            );
                        }
                        true
                    }
                    // A key changed since it was read.
                    Ok(_) => false,
                }
            };
            let reply = self.gateway.post("/v3/kv/txn", &txn(chunk));
            if done(&mut out, chunk, reply) {
                continue;
            }
            for item in chunk {
                let one = std::slice::from_ref(item);
                let reply = self.gateway.post("/v3/kv/txn", &txn(one));
                if !done(&mut out, one, reply) {
                    // No longer ours as read: lost (or released meanwhile).
                    out[item.0] = Some(Ok(None));
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every move has a result"))
            .collect()
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let (kv, _) = self.range(&self.key(name))?;
        match kv {
            Some(kv) if kv.is_owned_by(name, owner)? => self.extend_found(name, owner, ttl, &kv),
            _ => Ok(None),
        }
    }

    /// A renewal round: the keys read in one transaction per 128; one keep-alive for the
    /// etcd leases that carry only keys renewed in this round (and of the right class);
    /// the other keys are moved to the current lease of their class, so that a lease
    /// carrying a key nobody renews any more (a fixed lease, a guard past `max_hold`) is
    /// not extended and ends.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
        let mut out: Vec<Option<Result<Option<Lease>, BackendError>>> =
            renewals.iter().map(|_| None).collect();
        let mut found: Vec<(usize, Kv)> = Vec::new();
        for (chunk_no, chunk) in renewals.chunks(MAX_TXN_OPS).enumerate() {
            let base = chunk_no * MAX_TXN_OPS;
            let ops: Vec<Value> = chunk
                .iter()
                .map(|r| json!({ "request_range": { "key": b64(&self.key(r.name)) } }))
                .collect();
            let reply = self.gateway.post("/v3/kv/txn", &json!({ "success": ops }));
            let responses = reply.and_then(|reply| {
                reply
                    .get("responses")
                    .and_then(Value::as_array)
                    .filter(|a| a.len() == chunk.len())
                    .cloned()
                    .ok_or_else(|| bad_reply("responses"))
            });
            match responses {
                Err(e) => {
                    for i in 0..chunk.len() {
                        out[base + i] = Some(Err(copy(&e)));
                    }
                }
                Ok(responses) => {
                    for (i, (r, resp)) in chunk.iter().zip(&responses).enumerate() {
                        let kv = resp
                            .pointer("/response_range/kvs/0")
                            .map(Kv::from_json)
                            .transpose();
                        out[base + i] = match kv {
                            Err(e) => Some(Err(e)),
                            Ok(None) => Some(Ok(None)),
                            Ok(Some(kv)) => match kv.is_owned_by(r.name, r.owner) {
                                Err(e) => Some(Err(e)),
                                Ok(false) => Some(Ok(None)),
                                Ok(true) => {
                                    found.push((base + i, kv));
                                    None
                                }
                            },
                        };
                    }
                }
            }
        }
        // A lease is kept alive only if every key it may carry is renewed here, each of
        // the right class; the keys of any other lease are moved.
        let renewed: HashSet<Vec<u8>> = found
            .iter()
            .map(|(i, _)| tag_of(&self.key(renewals[*i].name), renewals[*i].owner))
            .collect();
        let fits = |i: usize, kv: &Kv| {
            let r = &renewals[i];
            kv.holder(r.name).is_ok_and(|(_, held_for)| {
                class_of(held_for) == class_of(r.ttl) && held_for >= r.ttl
            })
        };
        let mut alive: Vec<i64> = Vec::new();
        {
            let leases = self.leases.lock();
            let mut refused: Vec<i64> = Vec::new();
            for (_, kv) in &found {
                if alive.contains(&kv.lease) || refused.contains(&kv.lease) {
                    continue;
                }
                let ok = leases.only_carries(kv.lease, &|t: &[u8]| renewed.contains(t))
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
            match self.keep_alive(&alive, sent) {
                Err(e) => {
                    for (i, _) in &batched {
                        out[*i] = Some(Err(copy(&e)));
                    }
                }
                Ok(renewed) => {
                    for (i, kv) in batched {
                        let r = &renewals[i];
                        let granted = renewed.get(&kv.lease).copied().unwrap_or(0);
                        let fence = FencingToken::new(kv.create_revision.unsigned_abs());
                        if granted <= 0 {
                            out[i] = Some(Ok(None));
                        } else if Duration::from_secs(granted.unsigned_abs()) >= r.ttl {
                            out[i] = Some(
                                self.lease_from(sent, r.ttl)
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
                    name: renewals[*i].name,
                    owner: renewals[*i].owner,
                    ttl: renewals[*i].ttl,
                    kv,
                })
                .collect();
            for ((i, _), r) in to_move.iter().zip(self.move_keys(&moves)) {
                out[*i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.expect("every renewal has a result"))
            .collect()
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let key_bytes = self.key(name);
        let key = b64(&key_bytes);
        // The value is `token|ms`: ours if it lies strictly between `token|` and `token}`
        // (no token holds `|` or `}`).
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
        let reply = self.gateway.post("/v3/kv/txn", &txn)?;
        // Either way this owner's key is on no etcd lease any more.
        self.leases
            .lock()
            .drop_key_everywhere(&tag_of(&key_bytes, owner));
        if reply.get("succeeded").and_then(Value::as_bool) != Some(true) {
            return Ok(false);
        }
        let deleted = reply
            .pointer("/responses/0/response_delete_range")
            .map(|d| int(d, "deleted"))
            .transpose()?
            .unwrap_or(0);
        if deleted > 0
            && let Some(w) = self.watcher.lock().as_ref()
        {
            w.announce(name, revision(&reply)?);
        }
        Ok(deleted > 0)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let reply = self.gateway.post(
            "/v3/kv/deleterange",
            &json!({ "key": b64(&self.key(name)) }),
        )?;
        Ok(int(&reply, "deleted")? > 0)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let (kv, _) = self.range(&self.key(name))?;
        let Some(kv) = kv else {
            return Ok(None);
        };
        let (_, held_for) = kv.holder(name)?;
        let reply = self.gateway.post(
            "/v3/lease/timetolive",
            &json!({ "ID": kv.lease.to_string() }),
        )?;
        let left = int(&reply, "TTL")?.max(0).unsigned_abs();
        Ok(Some(held_for.min(Duration::from_secs(left))))
    }
}

fn copy(e: &BackendError) -> BackendError {
    BackendError::new(e.kind(), e.message())
}

impl LockBackend for EtcdBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.inner.try_acquire(name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.inner.extend(name, owner, ttl)
    }

    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
        self.inner.extend_many(renewals)
    }

    /// The token was handed out with the acquisition (the key's `create_revision`); asked
    /// again, it is read back: `None` once the key is not `owner`'s.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let (kv, _) = self.inner.range(&self.inner.key(name))?;
        match kv {
            Some(kv) if kv.is_owned_by(name, owner)? => Ok(u64::try_from(kv.create_revision)
                .ok()
                .map(FencingToken::new)),
            _ => Ok(None),
        }
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.inner.release(name, owner)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.inner.force_release(name)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.inner.inspect(name)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let mut watcher = self.inner.watcher.lock();
        let w = watcher.get_or_insert_with(|| {
            let start = LAST_HELD_REVISION.with(Cell::get);
            Watcher::start(&self.inner, if start > 0 { start + 1 } else { 0 })
        });
        w.subscribe(name)
    }

    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner
            .watcher
            .lock()
            .as_ref()
            .is_some_and(|w| w.wake_pending(name))
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        if let Some(w) = self.inner.watcher.lock().take() {
            w.stop();
        }
    }
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
    fn member_urls_are_checked_in_plain_words() {
        assert_eq!(
            parse_member("http://127.0.0.1:2379/").unwrap(),
            "http://127.0.0.1:2379"
        );
        for (bad, why) in [
            ("127.0.0.1:2379", "must start with http://"),
            ("https://h:2379", "https:// is not supported yet"),
            ("http://h", "has no port"),
            ("http://h:0", "bad port"),
            ("http://u:p@h:1", "credentials"),
            ("http://h:1/v3", "without a path"),
        ] {
            let e = parse_member(bad).unwrap_err();
            assert!(e.reason().contains(why), "{bad}: {e}");
        }
    }
}
