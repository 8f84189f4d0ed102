//! The soak tier: each backend under mixed load for a set time while faults are injected
//! on a schedule, every hold checked afterwards.
//!
//! ```text
//! soak [--minutes N] [--backend memory|single|redlock|sentinel|cluster|all] [--seed S]
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
//!   majority;
//! - Sentinel (a master, 2 replicas, 3 sentinels; see `sentinel.rs`): the master stopped
//!   briefly, stopped until the sentinels fail it over, killed, failed over by `SENTINEL
//!   FAILOVER`; a replica and a sentinel killed and restarted;
//! - Cluster (3 masters with a replica each; see `cluster.rs`): a master stopped briefly and
//!   for longer than the lease (no failover), stopped until a replica takes over, killed,
//!   failed over by `CLUSTER FAILOVER` on its replica; a hot lock's slot migrated under
//!   load.
//!
//! Some faults break a documented assumption (a lease expired under its holder, data
//! loss, a forward clock jump): they open a *declared* window, and overlapping holds that
//! touch it are counted apart, as expected. A failover with asynchronous replication (any
//! but `CLUSTER FAILOVER`, which waits for the replica to catch up) can grant a lock
//! twice: it declares a window too, for overlaps only, since the new master's tokens are
//! still larger, so fencing must refuse every stale write through it. A failover that no
//! fault asked for (a loaded machine can miss the sentinels' or the cluster's deadline) is
//! found between faults and declared the same way, and counted. Token order is never
//! declared: tokens must stay ordered through every fault here, data loss included (the
//! clocks never go back across a loss). Anything else found wrong fails the run (exit
//! status 1), as do leaked lock keys, connections or threads after the load stops, and a
//! load that stops making progress.
//!
//! Sentinel and Cluster also keep a bulk holder: one more client holding 300
//! watchdog-renewed locks for the whole run (retaken when lost). A hold lost on a node the
//! last fault did not touch (a healthy cluster master while another is stopped; any node
//! through a stop too short for a failover) fails the run: the renewal of every node must
//! go on while one node does not answer.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_core::{FencedResource, Lock, LockClient};
use dlm_testkit::history::{History, Hold, Violation};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod bulk;
mod cluster;
mod sentinel;
mod targets;

use bulk::Bulk;
use cluster::ClusterTarget;
use sentinel::SentinelTarget;
use targets::{MemoryTarget, RedlockTarget, SingleTarget};

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
        "all" => &["memory", "single", "redlock", "sentinel", "cluster"],
        "memory" => &["memory"],
        "single" => &["single"],
        "redlock" => &["redlock"],
        "sentinel" => &["sentinel"],
        "cluster" => &["cluster"],
        _ => usage("--backend is memory, single, redlock, sentinel, cluster or all"),
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
            "redlock" => soak(RedlockTarget::new(5), run, rng),
            "sentinel" => soak(SentinelTarget::new(), run, rng),
            _ => soak(ClusterTarget::new(), run, rng),
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
    eprintln!(
        "usage: soak [--minutes N] [--backend memory|single|redlock|sentinel|cluster|all] [--seed S]"
    );
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
    /// How many locks the bulk holder keeps (none by default).
    fn bulk(&self) -> usize {
        0
    }
    /// Whether the last fault left the node that serves `name` alone, so that a bulk hold
    /// of it must have survived the fault.
    fn untouched(&self, _name: &str) -> bool {
        false
    }
    /// A failover that no fault asked for since the last call (the fault methods keep
    /// track of their own): declares its window and says what it was.
    fn unplanned(&mut self, _declared: &Declared) -> Option<&'static str> {
        None
    }
}

/// Windows in which a fault broke an assumption that mutual exclusion needs.
#[derive(Default)]
struct Declared(Mutex<Vec<Window>>);

struct Window {
    start: Instant,
    end: Instant,
    /// Whether stale writes accepted in it are excused too (tokens may go wrong), or
    /// only overlaps (a failover: the tokens stay ordered).
    fencing: bool,
}

impl Declared {
    /// Runs `fault` and declares the time it took (plus its aftermath).
    fn window<R>(&self, fault: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = fault();
        self.push(start, true);
        r
    }

    /// Declares a failover that began at `start` and has settled now (plus its
    /// aftermath): overlapping holds are excused, stale writes are not.
    fn failover(&self, start: Instant) {
        self.push(start, false);
    }

    fn push(&self, start: Instant, fencing: bool) {
        self.0.lock().push(Window {
            start,
            end: Instant::now() + AFTERMATH,
            fencing,
        });
    }

    /// Whether a hold over `[from, until)` touches a declared window.
    fn covers(&self, from: Instant, until: Instant) -> bool {
        self.0
            .lock()
            .iter()
            .any(|w| from < w.end && w.start < until)
    }

    /// Whether a write at `at` by a hold that began at `from` touches a window that
    /// excuses stale writes.
    fn covers_fencing(&self, from: Instant, at: Instant) -> bool {
        self.0
            .lock()
            .iter()
            .any(|w| w.fencing && from < w.end && w.start < at)
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
        // Read once, at the start of the hold (drawn then: the history read it), and
        // written with at the end too, without checking that the lock is still held.
        let token = guard.fencing_token().ok();
        let from = Instant::now();
        let write = |counters: &Counters| {
            let Some(token) = token else {
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
                Ok(Some(again)) if again.fencing_token().ok() == token => {}
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

/// The message of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".to_owned())
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
    bulk: Option<bulk::Outcome>,
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
            && self.bulk.as_ref().is_none_or(bulk::Outcome::passed)
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
        if let Some(b) = &self.bulk {
            let _ = write!(s, " {}", b.part());
        }
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
    let mut broke = Vec::new();
    if !load.progresses(100, Duration::from_secs(30)) {
        stuck.push("start");
    }
    let mut bulk = (target.bulk() > 0).then(|| Bulk::new(target.backend(), target.bulk()));
    let mut last = "start";
    while start.elapsed() < run && stuck.is_empty() && broke.is_empty() {
        // What the last fault (and the time since) did to the bulk holds, then the next.
        let step = catch_unwind(AssertUnwindSafe(|| {
            let unplanned = target.unplanned(&declared);
            if let Some(b) = &mut bulk {
                b.check(last, |name| unplanned.is_none() && target.untouched(name));
                b.refill();
            }
            (unplanned, target.fault(&mut rng, &declared))
        }));
        let kind = match step {
            Ok((unplanned, kind)) => {
                if let Some(u) = unplanned {
                    *faults.entry(u).or_default() += 1;
                }
                kind
            }
            Err(panic) => {
                broke.push(format!(
                    "a fault after {last} failed: {}",
                    panic_text(&*panic)
                ));
                break;
            }
        };
        *faults.entry(kind).or_default() += 1;
        last = kind;
        if !load.progresses(50, Duration::from_secs(30)) {
            stuck.push(kind);
        }
        thread::sleep(Duration::from_millis(rng.random_range(500..2000)));
    }
    let bulk = bulk.map(|mut b| {
        if broke.is_empty() {
            let unplanned = target.unplanned(&declared);
            if let Some(u) = unplanned {
                *faults.entry(u).or_default() += 1;
            }
            b.check(last, |name| unplanned.is_none() && target.untouched(name));
        }
        b.finish()
    });
    let ran = start.elapsed();
    let (counters, history) = load.stop();
    counters.fatal.lock().extend(broke);
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
        .filter(|&&(from, at)| declared.covers_fencing(from, at))
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
        bulk,
    };
    drop(target);
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failover_window_excuses_overlaps_but_not_stale_writes() {
        let declared = Declared::default();
        let before = Instant::now();
        thread::sleep(Duration::from_millis(5));
        declared.failover(Instant::now());
        let inside = Instant::now();
        assert!(declared.covers(before, inside));
        assert!(!declared.covers_fencing(before, inside));
        declared.window(|| ());
        assert!(declared.covers_fencing(before, Instant::now()));
        // A window covers from its start to its aftermath's end, not before.
        let early = Declared::default();
        let t0 = Instant::now();
        thread::sleep(Duration::from_millis(5));
        let t1 = Instant::now();
        early.failover(t1);
        assert!(!early.covers(t0, t1));
    }
}
