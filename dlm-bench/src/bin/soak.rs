//! The soak tier: each backend under mixed load for a set time while faults are injected
//! on a schedule, every hold checked afterwards.
//!
//! ```text
//! soak [--minutes N] [--backend memory|single|redlock|all] [--seed S]
//! ```
//!
//! Load: clients x 4 threads on 4 hot locks (watchdog leases of 2 s), a mix of `lock`,
//! `try_lock` and `try_lock_timeout`, short holds and holds longer than the lease (the
//! watchdog renews them), re-entry, and writes through a [`FencedResource`] per lock at
//! the start and at the end of every hold, without checking first (a holder that lost its
//! lock during a fault writes anyway: fencing must refuse it).
//!
//! Faults, one at a time, each followed by a liveness check (the load must make progress
//! within 30 s of the heal):
//! - memory: slow calls, transient errors, a lease expired under its holder;
//! - single (AOF `always`, through a fault proxy, clock shimmed): pauses shorter and longer
//!   than the lease, kill + restart, restart with the data lost, proxy latency, stalls,
//!   resets, black holes, lost replies, the clock going back (then restored) and jumping
//!   forward;
//! - Redlock over 5 nodes (each like the single one): minority and majority pauses and
//!   black holes, kill + restart, a node restarting empty, latency on a minority, stalls,
//!   resets, a clock going back on one node (then restored), forward jumps on a fixed
//!   majority.
//!
//! Some faults break a documented assumption (a lease expired under its holder, data
//! loss, a forward clock jump): they open a *declared* window, and overlapping holds that
//! touch it are counted apart, as expected. Token order is never declared: tokens must
//! stay ordered through every fault here, data loss included (the clocks never go back
//! across a loss). Anything else found wrong fails the run (exit status 1), as do leaked
//! lock keys, connections or threads after the load stops, and a load that stops making
//! progress.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_core::{FencedResource, Lock, LockClient};
use dlm_memory::MemoryBackend;
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::history::{History, Hold, Violation};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::skew::ClockSkew;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const LEASE: Duration = Duration::from_secs(2);
const LOCKS: usize = 4;
const THREADS: usize = 4;
/// How long a declared fault's effects may last after it ends: a lease granted before
/// it can run for a whole lease after, plus the renewal that kept it.
const AFTERMATH: Duration = Duration::from_secs(5);

fn main() {
    let mut minutes = 1.0f64;
    let mut which = "all".to_owned();
    let mut seed: u64 = rand::random();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--minutes" => minutes = value().parse().unwrap_or_else(|_| usage("bad --minutes")),
            "--backend" => which = value(),
            "--seed" => seed = value().parse().unwrap_or_else(|_| usage("bad --seed")),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let backends: &[&str] = match which.as_str() {
        "all" => &["memory", "single", "redlock"],
        "memory" => &["memory"],
        "single" => &["single"],
        "redlock" => &["redlock"],
        _ => usage("--backend is memory, single, redlock or all"),
    };
    if backends.iter().any(|b| *b != "memory") {
        dlm_testkit::redis_server::require_redis_server();
    }
    let run = Duration::from_secs_f64(minutes * 60.0);
    println!("soak: {minutes} minute(s) per backend, seed {seed}");
    let mut failed = false;
    for (i, b) in backends.iter().enumerate() {
        let rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64));
        let summary = match *b {
            "memory" => soak(MemoryTarget::new(), run, rng),
            "single" => soak(SingleTarget::new(), run, rng),
            _ => soak(RedlockTarget::new(5), run, rng),
        };
        println!("{}", summary.line());
        failed |= !summary.passed();
    }
    std::process::exit(i32::from(failed));
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("soak: {problem}");
    }
    eprintln!("usage: soak [--minutes N] [--backend memory|single|redlock|all] [--seed S]");
    std::process::exit(2)
}

/// A backend under soak: how to make clients of it, the faults it can suffer, and what it
/// left behind.
trait Target {
    fn name(&self) -> &'static str;
    /// Clients (think: processes) to run, each with its own backend instance.
    fn clients(&self) -> usize;
    fn backend(&self) -> Arc<dyn LockBackend>;
    /// Injects one fault (chosen with `rng`), lets it last, heals it, and says which it
    /// was. A fault outside the documented assumptions is declared in `declared`.
    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str;
    /// Lock keys left behind (or keys without a TTL), once the load has stopped.
    fn leaked_keys(&self) -> usize;
    /// Connections still open to the servers (the soak's own admin ones excepted).
    fn connections(&self) -> usize;
}

/// Windows in which a fault broke an assumption that mutual exclusion needs.
#[derive(Default)]
struct Declared(Mutex<Vec<(Instant, Instant)>>);

impl Declared {
    /// Runs `fault` and declares the time it took (plus its aftermath).
    fn window<R>(&self, fault: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = fault();
        self.0.lock().push((start, Instant::now() + AFTERMATH));
        r
    }

    fn covers(&self, from: Instant, until: Instant) -> bool {
        self.0.lock().iter().any(|&(s, e)| from < e && s < until)
    }
}

/// What the load threads count.
#[derive(Default)]
struct Counters {
    holds: AtomicU64,
    writes: AtomicU64,
    refused: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    /// Writes accepted from a holder older than one already accepted: (hold start, write).
    stale: Mutex<Vec<(Instant, Instant)>>,
    /// Failures that are bugs whatever the faults (a permanent error, re-entry wrong).
    fatal: Mutex<Vec<String>>,
}

impl Counters {
    fn error(&self, what: String) {
        *self.errors.lock().entry(what).or_default() += 1;
    }
}

/// The newest accepted writer of a resource, by the start of its hold.
#[derive(Default)]
struct Newest(Option<Instant>);

struct Load {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    history: Arc<History>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start(target: &dyn Target, seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let history = Arc::new(History::new());
        let resources: Arc<Vec<FencedResource<Newest>>> =
            Arc::new((0..LOCKS).map(|_| FencedResource::default()).collect());
        let mut workers = Vec::new();
        for c in 0..target.clients() {
            let client = LockClient::builder(target.backend())
                .watchdog_timeout(LEASE)
                .build()
                .unwrap();
            for t in 0..THREADS {
                let (client, stop, counters, history, resources) = (
                    client.clone(),
                    stop.clone(),
                    counters.clone(),
                    history.clone(),
                    resources.clone(),
                );
                let rng = StdRng::seed_from_u64(seed ^ ((c * THREADS + t) as u64 + 1) << 32);
                workers.push(thread::spawn(move || {
                    work(
                        &format!("client {c} thread {t}"),
                        &client,
                        &stop,
                        &counters,
                        &history,
                        &resources,
                        rng,
                    )
                }));
            }
        }
        Load {
            stop,
            counters,
            history,
            workers,
        }
    }

    fn holds(&self) -> u64 {
        self.counters.holds.load(Ordering::Relaxed)
    }

    /// Whether `n` more holds complete within `within`.
    fn progresses(&self, n: u64, within: Duration) -> bool {
        let target = self.holds() + n;
        let deadline = Instant::now() + within;
        while self.holds() < target {
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn stop(self) -> (Arc<Counters>, Arc<History>) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            if w.join().is_err() {
                self.counters
                    .fatal
                    .lock()
                    .push("a load thread panicked".into());
            }
        }
        (self.counters, self.history)
    }
}

fn work(
    owner: &str,
    client: &LockClient,
    stop: &AtomicBool,
    counters: &Counters,
    history: &History,
    resources: &[FencedResource<Newest>],
    mut rng: StdRng,
) {
    while !stop.load(Ordering::Relaxed) {
        let i = rng.random_range(0..LOCKS);
        let lock = client.get_lock(&format!("soak-{i}")).expect("a valid name");
        let got = match rng.random_range(0..10) {
            0..=6 => lock.try_lock_timeout(Duration::from_millis(rng.random_range(10..500))),
            7 => lock.lock().map(Some),
            _ => lock.try_lock(),
        };
        let guard = match got {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                match e.backend_kind() {
                    Some(kind) if kind.is_transient() => counters.error(format!("{kind:?}")),
                    _ => counters.fatal.lock().push(format!("{owner}: acquire: {e}")),
                }
                continue;
            }
        };
        let hold = history.begin(owner, &guard);
        let from = Instant::now();
        let write = |counters: &Counters| {
            let Some(token) = guard.fencing_token() else {
                return;
            };
            counters.writes.fetch_add(1, Ordering::Relaxed);
            match resources[i].write(token, |newest| {
                if newest.0.is_some_and(|n| from < n) {
                    return true;
                }
                newest.0 = Some(from);
                false
            }) {
                Ok(true) => counters.stale.lock().push((from, Instant::now())),
                Ok(false) => {}
                Err(_) => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        write(counters);
        if rng.random_bool(0.1) {
            // Re-entry: no I/O, so it must succeed (while the lease lasts) with the same
            // token.
            match lock.try_lock() {
                Ok(Some(again)) if again.fencing_token() == guard.fencing_token() => {}
                Ok(Some(_)) => counters
                    .fatal
                    .lock()
                    .push(format!("{owner}: re-entry changed the token")),
                Ok(None) => counters
                    .fatal
                    .lock()
                    .push(format!("{owner}: re-entry refused")),
                Err(e) => counters.error(format!("re-entry: {e}")),
            }
        }
        let pause = match rng.random_range(0..1000) {
            0..=897 => Duration::ZERO,
            898..=997 => Duration::from_millis(rng.random_range(1..20)),
            _ => Duration::from_millis(rng.random_range(500..3000)),
        };
        sleep_unless(stop, pause);
        write(counters);
        history.end(hold, &guard);
        match guard.unlock() {
            Ok(()) => {}
            Err(dlm_core::Error::LockLost) => counters.error("lost".into()),
            Err(e) => match e.backend_kind() {
                Some(kind) if kind.is_transient() => counters.error(format!("release {kind:?}")),
                _ => counters.fatal.lock().push(format!("{owner}: release: {e}")),
            },
        }
        counters.holds.fetch_add(1, Ordering::Relaxed);
    }
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

struct Summary {
    backend: &'static str,
    ran: Duration,
    holds: u64,
    faults: BTreeMap<&'static str, u64>,
    violations: Vec<Violation>,
    declared: usize,
    stale: usize,
    stale_declared: usize,
    refused: u64,
    writes: u64,
    errors: BTreeMap<String, u64>,
    fatal: Vec<String>,
    stuck: Vec<&'static str>,
    leaked_keys: usize,
    threads: isize,
    connections: usize,
}

impl Summary {
    fn passed(&self) -> bool {
        self.violations.is_empty()
            && self.stale == 0
            && self.fatal.is_empty()
            && self.stuck.is_empty()
            && self.leaked_keys == 0
            && self.threads <= 0
            && self.connections == 0
    }

    fn line(&self) -> String {
        let faults: u64 = self.faults.values().sum();
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let mut s = format!(
            "soak {}: {} {:.1} min, holds={} faults={} ({}) violations={} (declared {}) \
             stale-writes-accepted={} (declared {}; refused {} of {} writes) leaked-keys={} \
             threads={:+} connections={}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.backend,
            self.ran.as_secs_f64() / 60.0,
            self.holds,
            faults,
            kinds.join(", "),
            self.violations.len(),
            self.declared,
            self.stale,
            self.stale_declared,
            self.refused,
            self.writes,
            self.leaked_keys,
            self.threads,
            self.connections,
        );
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = write!(s, " errors=[{}]", errors.join(", "));
        for v in self.violations.iter().take(5) {
            let _ = write!(s, "\n  violation: {v}");
        }
        for f in self.fatal.iter().take(5) {
            let _ = write!(s, "\n  failure: {f}");
        }
        for k in &self.stuck {
            let _ = write!(s, "\n  no progress within 30 s after: {k}");
        }
        s
    }
}

fn soak(mut target: impl Target, run: Duration, mut rng: StdRng) -> Summary {
    let baseline = threads();
    let declared = Declared::default();
    let start = Instant::now();
    let load = Load::start(&target, rng.random());
    let mut faults = BTreeMap::new();
    let mut stuck = Vec::new();
    if !load.progresses(100, Duration::from_secs(30)) {
        stuck.push("start");
    }
    while start.elapsed() < run && stuck.is_empty() {
        let kind = target.fault(&mut rng, &declared);
        *faults.entry(kind).or_default() += 1;
        if !load.progresses(50, Duration::from_secs(30)) {
            stuck.push(kind);
        }
        thread::sleep(Duration::from_millis(rng.random_range(500..2000)));
    }
    let ran = start.elapsed();
    let (counters, history) = load.stop();
    // Every client is gone: its watchdog thread, connections and subscriptions with it.
    let report = history.check();
    let (mut violations, mut declared_n) = (Vec::new(), 0);
    for v in report.violations {
        let excused = match &v {
            Violation::Overlap { first, second } => [first, second]
                .iter()
                .any(|h: &&Hold| declared.covers(h.from, h.until)),
            _ => false,
        };
        if excused {
            declared_n += 1;
        } else {
            violations.push(v);
        }
    }
    let stale = counters.stale.lock().clone();
    let stale_declared = stale
        .iter()
        .filter(|&&(from, at)| declared.covers(from, at))
        .count();
    let threads_after = {
        let deadline = Instant::now() + Duration::from_secs(10);
        while threads() > baseline && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        threads()
    };
    let deadline = Instant::now() + LEASE * 2 + Duration::from_secs(1);
    let (mut leaked_keys, mut connections) = (target.leaked_keys(), target.connections());
    while (leaked_keys > 0 || connections > 0) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        (leaked_keys, connections) = (target.leaked_keys(), target.connections());
    }
    let summary = Summary {
        backend: target.name(),
        ran,
        holds: counters.holds.load(Ordering::Relaxed),
        faults,
        violations,
        declared: declared_n,
        stale: stale.len() - stale_declared,
        stale_declared,
        refused: counters.refused.load(Ordering::Relaxed),
        writes: counters.writes.load(Ordering::Relaxed),
        errors: counters.errors.lock().clone(),
        fatal: counters.fatal.lock().clone(),
        stuck,
        leaked_keys,
        threads: threads_after as isize - baseline as isize,
        connections,
    };
    drop(target);
    summary
}

// --- memory -----------------------------------------------------------------------------

struct MemoryTarget {
    backend: Arc<MemoryBackend>,
}

impl MemoryTarget {
    fn new() -> Self {
        MemoryTarget {
            backend: Arc::new(MemoryBackend::new()),
        }
    }
}

impl Target for MemoryTarget {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        self.backend.clone()
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let faults = self.backend.faults();
        match rng.random_range(0..3) {
            0 => {
                faults.delay_calls(Duration::from_millis(50));
                thread::sleep(Duration::from_secs(3));
                faults.delay_calls(Duration::ZERO);
                "slow calls"
            }
            1 => {
                faults.fail_next(20, BackendErrorKind::Unavailable);
                thread::sleep(Duration::from_secs(1));
                "errors"
            }
            _ => {
                let name = format!("soak-{}", rng.random_range(0..LOCKS));
                declared.window(|| {
                    // A lease ending under its holder: what a clock jump does.
                    self.backend.expire_now(&name);
                    thread::sleep(Duration::from_millis(200));
                });
                "lease expired (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.backend.names()
    }

    fn connections(&self) -> usize {
        0
    }
}

// --- Redis ------------------------------------------------------------------------------

/// One Redis node as the soak runs it: AOF `always`, a shimmed clock, clients through a
/// fault proxy, and an admin connection straight to the server.
struct Node {
    server: RedisServer,
    proxy: FaultProxy,
    skew: ClockSkew,
}

impl Node {
    fn spawn() -> Node {
        let skew = ClockSkew::new();
        let server = RedisServer::builder()
            .appendonly(true)
            .clock_skew(&skew)
            .spawn();
        let proxy = FaultProxy::start(server.port());
        Node {
            server,
            proxy,
            skew,
        }
    }

    /// Kills the server and starts it again with its data gone.
    fn restart_empty(&mut self) {
        self.server.kill();
        let _ = std::fs::remove_dir_all(self.server.dir().join("appendonlydir"));
        self.server.restart();
    }

    fn leaked_keys(&self) -> usize {
        let mut c = self.server.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("dlm:*")
            .query(&mut c)
            .unwrap_or_default();
        keys.iter()
            .filter(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut c).unwrap_or(-2);
                !k.starts_with("dlm:fence:") || ttl == -1
            })
            .count()
    }

    fn connections(&self) -> usize {
        let mut c = self.server.connection();
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut c)
            .unwrap_or_default();
        // Our own admin connection is one of them.
        list.lines().count().saturating_sub(1) + self.proxy.connections()
    }

    /// The clock back by 10 s for 3 s, then forward again to where it was: the way back
    /// is a forward jump, so it is declared.
    fn clock_back_and_restore(&self, declared: &Declared) {
        let by = Duration::from_secs(10);
        self.skew.back(by);
        thread::sleep(Duration::from_secs(3));
        declared.window(|| {
            self.skew.forward(by);
            thread::sleep(Duration::from_millis(200));
        });
    }
}

struct SingleTarget {
    node: Node,
}

impl SingleTarget {
    fn new() -> Self {
        SingleTarget {
            node: Node::spawn(),
        }
    }
}

impl Target for SingleTarget {
    fn name(&self) -> &'static str {
        "single"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::builder(&self.node.proxy.url())
                .connect_timeout(Duration::from_millis(300))
                .io_timeout(Duration::from_millis(300))
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let node = &mut self.node;
        match rng.random_range(0..11) {
            0 => {
                node.server.pause();
                thread::sleep(LEASE + Duration::from_secs(1));
                node.server.resume();
                "pause > lease"
            }
            1 => {
                node.server.pause();
                thread::sleep(LEASE / 4);
                node.server.resume();
                "pause < lease"
            }
            2 => {
                node.server.restart();
                "kill + AOF restart"
            }
            3 => {
                declared.window(|| node.restart_empty());
                "restart empty (declared)"
            }
            4 => {
                node.proxy
                    .set_latency(Direction::Both, Duration::from_millis(50));
                thread::sleep(Duration::from_secs(3));
                node.proxy.heal();
                "latency 50 ms"
            }
            5 => {
                node.proxy.stall(Direction::ToServer);
                thread::sleep(Duration::from_secs(1));
                node.proxy.heal();
                "stall 1 s"
            }
            6 => {
                node.proxy.reset_all();
                "reset"
            }
            7 => {
                node.proxy.blackhole(Direction::Both);
                thread::sleep(LEASE + Duration::from_secs(1));
                node.proxy.heal();
                "black hole > lease"
            }
            8 => {
                node.proxy.drop_replies(3);
                thread::sleep(Duration::from_secs(1));
                node.proxy.heal();
                "lost replies"
            }
            9 => {
                node.clock_back_and_restore(declared);
                "clock back"
            }
            _ => {
                declared.window(|| {
                    node.skew.forward(Duration::from_secs(5));
                    thread::sleep(Duration::from_millis(200));
                });
                "clock forward (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.node.leaked_keys()
    }

    fn connections(&self) -> usize {
        self.node.connections()
    }
}

struct RedlockTarget {
    nodes: Vec<Node>,
}

impl RedlockTarget {
    fn new(n: usize) -> Self {
        RedlockTarget {
            nodes: (0..n).map(|_| Node::spawn()).collect(),
        }
    }

    /// `k` distinct nodes, at random.
    fn pick(&self, rng: &mut StdRng, k: usize) -> Vec<usize> {
        rand::seq::index::sample(rng, self.nodes.len(), k).into_vec()
    }
}

impl Target for RedlockTarget {
    fn name(&self) -> &'static str {
        "redlock-5"
    }

    fn clients(&self) -> usize {
        3
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.proxy.url()).collect();
        Arc::new(
            Redlock::builder(&urls)
                .connect_timeout(Duration::from_millis(200))
                .io_timeout(Duration::from_millis(200))
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let minority = self.nodes.len() / 2;
        match rng.random_range(0..11) {
            0 | 1 => {
                let (k, what) = if rng.random_bool(0.5) {
                    (minority, "minority pause > lease")
                } else {
                    (minority + 1, "majority pause > lease")
                };
                let picked = self.pick(rng, k);
                picked.iter().for_each(|&i| self.nodes[i].server.pause());
                thread::sleep(LEASE + Duration::from_secs(1));
                picked.iter().for_each(|&i| self.nodes[i].server.resume());
                what
            }
            2 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].server.restart();
                "kill + AOF restart"
            }
            3 => {
                let i = self.pick(rng, 1)[0];
                declared.window(|| self.nodes[i].restart_empty());
                "restart empty (declared)"
            }
            4 => {
                let picked = self.pick(rng, minority);
                for &i in &picked {
                    self.nodes[i]
                        .proxy
                        .set_latency(Direction::Both, Duration::from_millis(50));
                }
                thread::sleep(Duration::from_secs(3));
                picked.iter().for_each(|&i| self.nodes[i].proxy.heal());
                "minority latency 50 ms"
            }
            5 | 6 => {
                let (k, what) = if rng.random_bool(0.5) {
                    (minority, "minority black hole > lease")
                } else {
                    (minority + 1, "majority black hole > lease")
                };
                let picked = self.pick(rng, k);
                for &i in &picked {
                    self.nodes[i].proxy.blackhole(Direction::Both);
                }
                thread::sleep(LEASE + Duration::from_secs(1));
                picked.iter().for_each(|&i| self.nodes[i].proxy.heal());
                what
            }
            7 => {
                self.nodes.iter().for_each(|n| n.proxy.reset_all());
                "reset all"
            }
            8 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].proxy.stall(Direction::ToClient);
                thread::sleep(Duration::from_secs(1));
                self.nodes[i].proxy.heal();
                "stall 1 s"
            }
            9 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].clock_back_and_restore(declared);
                "clock back"
            }
            _ => {
                // Always the same majority, by the same amount: the skewed nodes agree with
                // each other, and every quorum holds one of them, so a node that restarts
                // empty later cannot issue a token below theirs (the documented assumption:
                // clocks agree within the time between a commit and a loss).
                declared.window(|| {
                    for n in &self.nodes[..=minority] {
                        n.skew.forward(Duration::from_secs(5));
                    }
                    thread::sleep(Duration::from_millis(200));
                });
                "majority clock forward (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.nodes.iter().map(Node::leaked_keys).sum()
    }

    fn connections(&self) -> usize {
        self.nodes.iter().map(Node::connections).sum()
    }
}
