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
//!
//! [`FencedResource`]: dlm_core::FencedResource

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_testkit::history::{Hold, Violation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod bulk;
mod cluster;
mod declared;
mod load;
mod sentinel;
mod summary;
mod targets;

use bulk::Bulk;
use cluster::ClusterTarget;
use declared::Declared;
use load::Load;
use sentinel::SentinelTarget;
use summary::Summary;
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
