//! Fixtures shared by the Redis integration tests: real servers from dlm-testkit.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::redis_server::{
    RedisNodes, RedisServer, legacy_redis_server_binary, require_redis_server,
};

pub mod errors;
pub mod soak;

/// Generous I/O timeouts for tests that are not about timeouts: a loaded 2-core CI
/// machine must not turn a healthy server into a spurious failure.
pub const CALM: Duration = Duration::from_millis(500);

pub fn require() {
    require_redis_server();
}

/// One server, one `RedisBackend` per `backend()` call (a fresh pool: another process).
pub struct Single {
    pub server: RedisServer,
    pub fencing: bool,
}

impl Single {
    pub fn new() -> Self {
        require();
        Single {
            server: RedisServer::spawn(),
            fencing: true,
        }
    }

    /// Without fencing: acquisitions are a plain `SET ... NX GET`, not the script.
    pub fn unfenced() -> Self {
        Single {
            fencing: false,
            ..Single::new()
        }
    }
}

impl Single {
    /// One Redis 6.2 server (`DLM_REDIS_LEGACY_SERVER`); panics when there is none (the
    /// tests that use it are `#[ignore]`d: `scripts/test` runs them with the server).
    pub fn legacy() -> Self {
        Single {
            server: RedisServer::builder().binary(legacy_binary()).spawn(),
            fencing: true,
        }
    }
}

/// The Redis 6.2 binary of `DLM_REDIS_LEGACY_SERVER`, or a panic that says how to get it.
fn legacy_binary() -> std::path::PathBuf {
    legacy_redis_server_binary().expect(
        "no Redis 6.2 server: set DLM_REDIS_LEGACY_SERVER (scripts/legacy-redis-server fetches one; scripts/test does it all)",
    )
}

impl dlm_testkit::Fixture for Single {
    fn fencing(&self) -> bool {
        self.fencing
    }

    fn fencing_keys(&self) -> Option<usize> {
        Some(fence_keys(&self.server).len())
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(keys_without_expiry_on([&self.server], "dlm:*"))
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::builder(&self.server.url())
                .fencing(self.fencing)
                .io_timeout(CALM)
                .connect_timeout(CALM)
                .build()
                .unwrap(),
        )
    }
}

/// N servers, one `Redlock` per `backend()` call.
pub struct Cluster {
    pub nodes: RedisNodes,
}

impl Cluster {
    pub fn new(n: usize) -> Self {
        require();
        Cluster {
            nodes: RedisNodes::spawn(n),
        }
    }

    /// N Redis 6.2 servers (see [`Single::legacy`]).
    pub fn legacy(n: usize) -> Self {
        let binary = legacy_binary();
        Cluster {
            nodes: RedisNodes::spawn_with(n, |b| b.binary(&binary)),
        }
    }

    pub fn redlock(&self) -> Redlock {
        Redlock::builder(&self.nodes.urls())
            .io_timeout(CALM)
            .connect_timeout(CALM)
            .pool_size(4)
            .build()
            .unwrap()
    }
}

impl dlm_testkit::Fixture for Cluster {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.redlock())
    }

    fn fencing_keys(&self) -> Option<usize> {
        Some(fence_keys_on(self.nodes.iter()))
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(keys_without_expiry_on(self.nodes.iter(), "dlm:*"))
    }
}

/// How many keys matching `pattern` on `servers` have no expiry (`PTTL` -1).
pub fn keys_without_expiry_on<'a>(
    servers: impl IntoIterator<Item = &'a RedisServer>,
    pattern: &str,
) -> usize {
    servers
        .into_iter()
        .map(|s| {
            let mut con = s.connection();
            let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut con).unwrap();
            keys.iter()
                .filter(|k| {
                    // A cluster replica answers MOVED for its master's keys: the master
                    // counts them.
                    let ttl: redis::RedisResult<i64> = redis::cmd("PTTL").arg(k).query(&mut con);
                    matches!(ttl, Ok(-1))
                })
                .count()
        })
        .sum()
}

/// How many fencing streams (`dlm:fence:*`) `servers` hold together.
pub fn fence_keys_on<'a>(servers: impl IntoIterator<Item = &'a RedisServer>) -> usize {
    servers.into_iter().map(|s| fence_keys(s).len()).sum()
}

/// How many keys match `pattern` on `servers`, summed.
pub fn keys_on<'a>(servers: impl IntoIterator<Item = &'a RedisServer>, pattern: &str) -> usize {
    servers
        .into_iter()
        .map(|s| {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query(&mut s.connection())
                .unwrap();
            keys.len()
        })
        .sum()
}

/// A field (`calls`, `failed_calls`, `rejected_calls`) of `command`'s line in the server's
/// `INFO commandstats`; 0 when the command never ran.
pub fn command_stat(server: &RedisServer, command: &str, field: &str) -> u64 {
    let stats = server.info("commandstats");
    let line = stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .unwrap_or("");
    line.split(',')
        .find_map(|f| f.strip_prefix(field)?.strip_prefix('='))
        .map_or(0, |v| v.parse().unwrap())
}

/// Waits until `cond` holds, checking every 10 ms; panics with `what` after `limit`.
#[track_caller]
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The fencing streams (`dlm:fence:{tag}`) on `server`.
pub fn fence_keys(server: &RedisServer) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("dlm:fence:*")
        .query(&mut server.connection())
        .unwrap()
}

/// The token of the last ID of the fencing stream `stream` on `server` (as
/// `ms << 20 | seq`).
pub fn last_fence_token(server: &RedisServer, stream: &str) -> u64 {
    let info: redis::Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(stream)
        .query(&mut server.connection())
        .unwrap();
    let redis::Value::Array(fields) = info else {
        panic!("XINFO STREAM gave {info:?}")
    };
    let id = fields
        .chunks(2)
        .find_map(|kv| match kv {
            [redis::Value::BulkString(k), redis::Value::BulkString(v)]
                if k == b"last-generated-id" =>
            {
                Some(String::from_utf8(v.clone()).unwrap())
            }
            _ => None,
        })
        .expect("last-generated-id");
    let (ms, seq) = id.split_once('-').unwrap();
    ms.parse::<u64>().unwrap() << 20 | seq.parse::<u64>().unwrap()
}

/// One server with a TLS port (test CA), one `RedisBackend` over `rediss://` per
/// `backend()` call, trusting the test CA.
pub struct TlsSingle {
    pub pki: dlm_testkit::tls::TestPki,
    pub server: RedisServer,
}

impl TlsSingle {
    pub fn new() -> Self {
        require();
        let pki = dlm_testkit::tls::TestPki::new();
        let server = RedisServer::builder()
            .tls(&pki, dlm_testkit::tls::ServerCert::Valid)
            .spawn();
        TlsSingle { pki, server }
    }
}

impl dlm_testkit::Fixture for TlsSingle {
    fn fencing_keys(&self) -> Option<usize> {
        Some(fence_keys(&self.server).len())
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(keys_without_expiry_on([&self.server], "dlm:*"))
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::builder(&self.server.tls_url())
                .tls(dlm_redis::TlsOptions::new().ca_file(self.pki.ca_file()))
                .io_timeout(CALM)
                .connect_timeout(CALM)
                .build()
                .unwrap(),
        )
    }
}

/// N servers that require mutual TLS (`tls-auth-clients yes`), one `Redlock` over
/// `rediss://` with the test client certificate per `backend()` call.
pub struct MutualTlsCluster {
    pub pki: dlm_testkit::tls::TestPki,
    pub nodes: RedisNodes,
}

impl MutualTlsCluster {
    pub fn new(n: usize) -> Self {
        require();
        let pki = dlm_testkit::tls::TestPki::new();
        let nodes = RedisNodes::spawn_with(n, |b| {
            b.tls(&pki, dlm_testkit::tls::ServerCert::Valid)
                .tls_auth_clients(true)
        });
        MutualTlsCluster { pki, nodes }
    }

    pub fn tls_urls(&self) -> Vec<String> {
        (0..self.nodes.len())
            .map(|i| self.nodes.get(i).tls_url())
            .collect()
    }

    pub fn tls_options(&self) -> dlm_redis::TlsOptions {
        let (cert, key) = self.pki.client_cert();
        dlm_redis::TlsOptions::new()
            .ca_file(self.pki.ca_file())
            .client_cert(cert, key)
    }
}

impl dlm_testkit::Fixture for MutualTlsCluster {
    fn fencing_keys(&self) -> Option<usize> {
        Some(fence_keys_on(self.nodes.iter()))
    }

    fn keys_without_expiry(&self) -> Option<usize> {
        Some(keys_without_expiry_on(self.nodes.iter(), "dlm:*"))
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            Redlock::builder(&self.tls_urls())
                .tls(self.tls_options())
                .io_timeout(CALM)
                .connect_timeout(CALM)
                .pool_size(4)
                .build()
                .unwrap(),
        )
    }
}

/// A waiter across a failover: finds `name` held, says so on `started`, then waits for
/// it with a 10 s backoff that only a release hint beats (and a 30 s budget for the
/// errors of the failover). Returns when it got the lock (released at once).
pub fn waiter(
    backend: RedisBackend,
    name: &str,
    started: crossbeam_channel::Sender<()>,
) -> std::time::Instant {
    use dlm_core::{Lock, LockClient, RetryPolicy};
    let client = LockClient::builder(backend)
        .retry(
            RetryPolicy::new()
                .backoff(Duration::from_secs(10), Duration::from_secs(10))
                .unwrap()
                .error_timeout(Duration::from_secs(30)),
        )
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.get_lock(name).unwrap();
    assert!(lock.try_lock().unwrap().is_none(), "{name} is not held");
    started.send(()).unwrap();
    let g = lock.lock().unwrap();
    let got = std::time::Instant::now();
    g.unlock().unwrap();
    got
}

/// Waits (10 s at most) until `replicas` replicas of `master` have everything it wrote
/// so far: their acknowledged offsets (`INFO replication`, acknowledged every second)
/// reach the master's offset now. (`WAIT` on a fresh connection would not do: it waits
/// for that connection's own writes only.)
pub fn replicated(master: &RedisServer, replicas: usize) {
    let field = |info: &str, key: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let target = field(&master.info("replication"), "master_repl_offset:");
    wait_until(Duration::from_secs(10), "the replicas caught up", || {
        let info = master.info("replication");
        let caught_up = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .filter_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")))
            .filter_map(|v| v.parse::<u64>().ok())
            .filter(|&offset| offset >= target)
            .count();
        caught_up >= replicas
    });
}

/// Cuts the replication links of `master`: the replicas stop (so they cannot reconnect
/// and resync) and the master drops its side (a stopped process's kernel would otherwise
/// still buffer what the master sends).
pub fn cut_off_replicas(master: &RedisServer, replicas: &[&RedisServer]) {
    for r in replicas {
        r.pause();
    }
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master.connection())
        .unwrap();
}

/// The first holder of a failover negative control: it took the lock on a master that is
/// about to be lost, its hold is recorded, and it wrote once through a fenced resource.
pub struct OldHolder {
    history: dlm_testkit::history::History,
    hold: dlm_testkit::history::OpenHold,
    guard: dlm_core::LockGuard,
    resource: dlm_core::FencedResource<Vec<&'static str>>,
}

impl OldHolder {
    pub fn new(guard: dlm_core::LockGuard) -> OldHolder {
        let history = dlm_testkit::history::History::new();
        let hold = history.begin("A (on the old master)", &guard);
        let resource = dlm_core::FencedResource::new(Vec::new());
        resource
            .write(guard.fencing_token().unwrap(), |w| w.push("A"))
            .unwrap();
        OldHolder {
            history,
            hold,
            guard,
            resource,
        }
    }

    /// B asks the promoted replica for the lock (waiting up to 10 s for the failover to
    /// be followed) and gets it: the documented double grant, checked as
    /// [`assert_double_grant_is_caught`](Self::assert_double_grant_is_caught) says.
    pub fn assert_granted_again(self, b: &dlm_core::LockClient) {
        use dlm_core::Lock;
        let gb = b
            .get_lock(self.guard.name())
            .unwrap()
            .try_lock_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("the promoted replica has no trace of A's lock: the documented double grant");
        self.assert_double_grant_is_caught(gb);
    }

    /// A and `b` hold at once, and the history checker sees the overlap: A's guard, the
    /// checker's report, and the resource A wrote to.
    fn both_hold(
        self,
        b: &dlm_core::LockGuard,
    ) -> (
        dlm_core::LockGuard,
        dlm_testkit::history::Report,
        dlm_core::FencedResource<Vec<&'static str>>,
    ) {
        let OldHolder {
            history,
            hold,
            guard: a,
            resource,
        } = self;
        let hold_b = history.begin("B (on the promoted replica)", b);
        assert!(a.is_held() && b.is_held(), "two holders at once");
        history.end(hold, &a);
        history.end(hold_b, b);
        let report = history.check();
        assert!(
            report.has_overlap(),
            "the checker must see the double grant"
        );
        (a, report, resource)
    }

    /// `b` got the same lock from a promoted replica whose clock is behind: the double
    /// grant, and the token went back too (the replica's stream continued from what it
    /// had, below A's unreplicated token). Fencing fails with it: the resource that saw
    /// A's write refuses the new holder B, and accepts A's late write.
    pub fn assert_double_grant_with_an_older_token(self, b: dlm_core::LockGuard) {
        let (a, _, resource) = self.both_hold(&b);
        let (ta, tb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
        assert!(tb < ta, "the token did not go back: {tb} after {ta}");
        assert!(
            resource.write(tb, |w| w.push("B")).is_err(),
            "the new holder's write must be refused (its token is older)"
        );
        resource.write(ta, |w| w.push("A, late")).unwrap();
        assert_eq!(resource.read(|w| w.clone()), ["A", "A, late"]);
        a.into_hold();
        b.unlock().unwrap();
    }

    /// `b` got the same lock from the promoted replica: the documented double grant. Both
    /// hold at once and the history checker sees it; fencing still holds: `b`'s token is
    /// newer, so the resource keeps out A's late write once `b` has written.
    pub fn assert_double_grant_is_caught(self, b: dlm_core::LockGuard) {
        let (a, report, resource) = self.both_hold(&b);
        let (ta, tb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
        assert!(
            tb > ta,
            "the token went back on the promoted replica: {tb} after {ta}"
        );
        assert!(!report.has_token_disorder(), "{:?}", report.violations);
        resource.write(tb, |w| w.push("B")).unwrap();
        assert!(resource.write(ta, |w| w.push("A, late")).is_err());
        assert_eq!(resource.read(|w| w.clone()), ["A", "B"]);
        a.into_hold();
        b.unlock().unwrap();
    }
}
