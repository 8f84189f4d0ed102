//! The etcd rows' bars: a minimal client of etcd's v3 JSON gateway (a put-if-absent
//! transaction and a delete, one connection per thread, written the way the minimal Redis
//! client is), and etcd's own lock service (`/v3/lock/lock` + `/v3/lock/unlock`).

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::system::{LockHandle, LockSystem};

/// One keep-alive connection (an agent that keeps at most one idle connection).
fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .max_idle_connections(1)
        .max_idle_connections_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()
}

fn post(agent: &ureq::Agent, url: &str, body: &str) -> Option<String> {
    agent
        .post(url)
        .set("Content-Type", "application/json")
        .send_string(body)
        .ok()?
        .into_string()
        .ok()
}

/// A JSON string field of a flat reply (etcd prints 64-bit integers as strings).
fn field(body: &str, name: &str) -> Option<String> {
    let pat = format!("\"{name}\":\"");
    let start = body.find(&pat)? + pat.len();
    let len = body[start..].find('"')?;
    Some(body[start..start + len].to_owned())
}

/// A lease of an hour for one handle (the bars keep no lease alive).
fn grant(agent: &ureq::Agent, base: &str) -> String {
    let reply = post(
        agent,
        &format!("{base}/v3/lease/grant"),
        r#"{"TTL":"3600"}"#,
    )
    .expect("lease grant");
    field(&reply, "ID").expect("a lease ID")
}

/// The minimal gateway client: acquire = `txn(create_revision == 0 ? put(key, lease))`,
/// release = `deleterange(key)`; `lock` spins on `try_lock`. With `checked`, each handle
/// writes a value of its own (its lease ID) and the release deletes the key only while it
/// holds that value (`txn(value == v ? deleterange(key))`), as any lock must, so that a
/// holder whose lease ran out cannot delete its successor's key: the owner check of dlm's
/// release, at its least.
pub struct MinimalEtcd {
    pub base: String,
    pub checked: bool,
}

/// The name of the checked-release variant of the minimal gateway client.
pub const MINIMAL_ETCD_CHECKED: &str = "minimal (etcd gateway, checked release)";

impl LockSystem for MinimalEtcd {
    fn name(&self) -> String {
        if self.checked {
            MINIMAL_ETCD_CHECKED.into()
        } else {
            crate::report::MINIMAL_ETCD.into()
        }
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let agent = agent();
        let lease = grant(&agent, &self.base);
        Box::new(MinimalEtcdHandle {
            agent,
            base: self.base.clone(),
            lease,
            checked: self.checked,
            held: None,
        })
    }
}

struct MinimalEtcdHandle {
    agent: ureq::Agent,
    base: String,
    lease: String,
    checked: bool,
    held: Option<String>,
}

impl MinimalEtcdHandle {
    /// The value written: `x` for the unchecked client (as before), the handle's own
    /// lease ID for the checked one (base64, as the gateway wants it).
    fn value(&self) -> String {
        if self.checked {
            STANDARD.encode(&self.lease)
        } else {
            "eA==".into()
        }
    }
}

impl LockHandle for MinimalEtcdHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        let k = STANDARD.encode(format!("minimal/{key}"));
        let body = format!(
            r#"{{"compare":[{{"key":"{k}","target":"CREATE","result":"EQUAL","create_revision":"0"}}],"success":[{{"request_put":{{"key":"{k}","value":"{}","lease":"{}"}}}}]}}"#,
            self.value(),
            self.lease
        );
        let ok = post(&self.agent, &format!("{}/v3/kv/txn", self.base), &body)
            .is_some_and(|r| r.contains("\"succeeded\":true"));
        if ok {
            self.held = Some(k);
        }
        ok
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
        loop {
            if self.try_lock(key) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    fn unlock(&mut self) {
        let Some(k) = self.held.take() else { return };
        if self.checked {
            let body = format!(
                r#"{{"compare":[{{"key":"{k}","target":"VALUE","result":"EQUAL","value":"{}"}}],"success":[{{"request_delete_range":{{"key":"{k}"}}}}]}}"#,
                self.value()
            );
            let _ = post(&self.agent, &format!("{}/v3/kv/txn", self.base), &body);
        } else {
            let _ = post(
                &self.agent,
                &format!("{}/v3/kv/deleterange", self.base),
                &format!(r#"{{"key":"{k}"}}"#),
            );
        }
    }
}

/// etcd's own lock service (the `concurrency.Mutex` recipe on the server): `lock` blocks
/// until the lock is the caller's and returns its key; `unlock` deletes that key.
pub struct EtcdLockService {
    pub base: String,
}

impl LockSystem for EtcdLockService {
    fn name(&self) -> String {
        "etcd /v3/lock".into()
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let agent = agent();
        let lease = grant(&agent, &self.base);
        Box::new(LockServiceHandle {
            agent,
            base: self.base.clone(),
            lease,
            held: None,
        })
    }
}

struct LockServiceHandle {
    agent: ureq::Agent,
    base: String,
    lease: String,
    held: Option<String>,
}

impl LockHandle for LockServiceHandle {
    /// No try: `/v3/lock/lock` waits; on a free lock it returns at once.
    fn try_lock(&mut self, key: &str) -> bool {
        self.lock(key, 30_000)
    }

    fn lock(&mut self, key: &str, _max_wait_ms: u64) -> bool {
        let name = STANDARD.encode(format!("lockservice/{key}"));
        let body = format!(r#"{{"name":"{name}","lease":"{}"}}"#, self.lease);
        self.held = post(&self.agent, &format!("{}/v3/lock/lock", self.base), &body)
            .and_then(|r| field(&r, "key"));
        self.held.is_some()
    }

    fn unlock(&mut self) {
        if let Some(k) = self.held.take() {
            let _ = post(
                &self.agent,
                &format!("{}/v3/lock/unlock", self.base),
                &format!(r#"{{"key":"{k}"}}"#),
            );
        }
    }
}
