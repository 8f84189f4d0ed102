//! The scenarios and how they are measured: one round of one system (uncontended,
//! contended, hand-over, a paused minority, fenced use), the interleaved rounds of
//! [`measure`], and the request and server-CPU counts of one cycle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::RedisServer;

use crate::proxy::Proxy;
use crate::report::Row;
use crate::system::LockSystem;

pub const CONTENDERS: usize = 4;
/// Unmeasured time at the start of each uncontended round (connections, caches).
const WARM_UP: Duration = Duration::from_millis(200);

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(us(sorted[((sorted.len() - 1) as f64 * p).round() as usize]))
}

/// What one system did in one scenario, summed over the rounds.
#[derive(Default)]
struct Tally {
    /// Measured time.
    elapsed: Duration,
    /// Completed cycles (uncontended) or acquisitions (contended).
    cycles: u64,
    /// Cycle latencies (uncontended) or waits (contended).
    samples: Vec<Duration>,
    /// Release-to-acquire gaps of hand-overs: the next holder is another thread, already
    /// waiting at the release (contended).
    gaps: Vec<Duration>,
    /// The longest wait, those unfinished at the end of a round included (contended).
    max_wait: Duration,
    /// Acquisitions per thread (contended).
    per_thread: Vec<u64>,
    /// Uncontended attempts that failed.
    failures: u64,
    /// Cycles per second of each round, in round order.
    round_rates: Vec<f64>,
}

/// A scenario: how one round of one system is run.
#[derive(Clone, Copy)]
pub enum Scenario {
    Uncontended {
        threads: usize,
    },
    /// `threads` threads on one key (`CONTENDERS` unless a scenario says otherwise), with
    /// this pause after each release.
    Contended {
        pause: Option<Duration>,
        threads: usize,
    },
    /// Uncontended, one thread, with one of five Redlock nodes stopped (SIGSTOP).
    PausedMinority,
    /// Uncontended, each thread on one name of its own: lock, read the fencing token and
    /// write with it to a `FencedResource`, unlock (the minimal client: lock, unlock).
    FencedUse {
        threads: usize,
    },
    /// `fenced-use` with a new name every cycle (a lock per entity: `order-123`), written
    /// to a fresh resource each time. `warm`: on servers whose fencing streams (one per
    /// hash slot) all exist already, as after some 100,000 holds of new names; otherwise
    /// most holds are the first of their slot.
    FencedNewNames {
        threads: usize,
        warm: bool,
    },
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Uncontended { .. } => "uncontended",
            Scenario::Contended {
                pause: None,
                threads: CONTENDERS,
            } => "contended",
            Scenario::Contended { pause: None, .. } => "contended-8",
            Scenario::Contended { pause: Some(_), .. } => "handoff",
            Scenario::PausedMinority => "paused-minority",
            Scenario::FencedUse { .. } => "fenced-use",
            Scenario::FencedNewNames { warm: false, .. } => "fenced-new-names",
            Scenario::FencedNewNames { warm: true, .. } => "fenced-new-names-warm",
        }
    }

    fn threads(self) -> usize {
        match self {
            Scenario::Uncontended { threads } => threads,
            Scenario::Contended { threads, .. } => threads,
            Scenario::PausedMinority => 1,
            Scenario::FencedUse { threads } | Scenario::FencedNewNames { threads, .. } => threads,
        }
    }

    fn run(self, system: &dyn LockSystem, run_for: Duration, tally: &mut Tally) {
        let (cycles, elapsed) = (tally.cycles, tally.elapsed);
        match self {
            Scenario::Uncontended { threads } => {
                uncontended(system, threads, Fenced::No, run_for, tally)
            }
            Scenario::PausedMinority => uncontended(system, 1, Fenced::No, run_for, tally),
            Scenario::FencedUse { threads } => {
                uncontended(system, threads, Fenced::OneName, run_for, tally)
            }
            Scenario::FencedNewNames { threads, .. } => {
                uncontended(system, threads, Fenced::NewNames, run_for, tally)
            }
            Scenario::Contended { pause, threads } => {
                contended(system, pause, threads, run_for, tally)
            }
        }
        let secs = (tally.elapsed - elapsed).as_secs_f64();
        if secs > 0.0 {
            tally
                .round_rates
                .push((tally.cycles - cycles) as f64 / secs);
        }
    }

    fn row(self, system: &dyn LockSystem, mut t: Tally) -> Row {
        let secs = t.elapsed.as_secs_f64();
        t.samples.sort_unstable();
        t.gaps.sort_unstable();
        let mut row = Row {
            system: system.name(),
            scenario: self.name(),
            threads: self.threads(),
            cycles_per_sec: (secs > 0.0).then(|| t.cycles as f64 / secs),
            p50_us: percentile(&t.samples, 0.5),
            p99_us: percentile(&t.samples, 0.99),
            round_rates: std::mem::take(&mut t.round_rates),
            ..Row::default()
        };
        if let Scenario::Uncontended { .. }
        | Scenario::PausedMinority
        | Scenario::FencedUse { .. }
        | Scenario::FencedNewNames { .. } = self
        {
            if t.failures > 0 {
                eprintln!(
                    "{}: {} uncontended attempts failed",
                    system.name(),
                    t.failures
                );
            }
            return row;
        }
        let total: f64 = t.per_thread.iter().sum::<u64>() as f64;
        let squares: f64 = t.per_thread.iter().map(|x| (*x as f64).powi(2)).sum();
        row.handoff_p50_us = percentile(&t.gaps, 0.5);
        row.max_wait_us = Some(us(t.max_wait));
        let n = t.per_thread.len().max(1) as f64;
        row.fairness = (squares > 0.0).then(|| total * total / (n * squares));
        row
    }
}

/// Runs `scenario` for every system in `rounds` rounds of `run_for` each, rotating the
/// order, so that a slow spell of the machine hits every system alike. One row per
/// system, in the order given.
pub fn measure(
    systems: &[&dyn LockSystem],
    scenario: Scenario,
    rounds: usize,
    run_for: Duration,
) -> Vec<Row> {
    let mut tallies: Vec<Tally> = systems.iter().map(|_| Tally::default()).collect();
    for round in 0..rounds {
        for k in 0..systems.len() {
            let i = (k + round) % systems.len();
            scenario.run(systems[i], run_for, &mut tallies[i]);
        }
    }
    systems
        .iter()
        .zip(tallies)
        .map(|(system, t)| scenario.row(*system, t))
        .collect()
}

/// Uncontended: every thread locks and unlocks fresh keys; each lock must succeed first
/// try. With `fenced`, each thread locks one key of its own instead (its resource's), and
/// uses the token under the lock (`LockHandle::use_token`).
/// Whether an uncontended cycle reads and uses its token, and on which names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Lock and unlock a new name each cycle.
    No,
    /// One name per thread, its token read and used (`fenced-use`).
    OneName,
    /// A new name each cycle, its token read and used (`fenced-new-names`).
    NewNames,
}

fn uncontended(
    system: &dyn LockSystem,
    threads: usize,
    fenced: Fenced,
    run_for: Duration,
    tally: &mut Tally,
) {
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Arc::new(AtomicBool::new(true));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut h = system.handle();
            let (start, stop, warm) = (start.clone(), stop.clone(), warm.clone());
            thread::spawn(move || {
                let mut samples = Vec::with_capacity(1 << 14);
                let mut failures = 0u64;
                start.wait();
                let mut i = 0u64;
                let own = format!("f{t}-{:x}", rand::random::<u32>());
                while !stop.load(Ordering::Relaxed) {
                    let key = if fenced == Fenced::OneName {
                        own.clone()
                    } else {
                        format!("u{t}-{i}-{:x}", rand::random::<u32>())
                    };
                    i += 1;
                    let t0 = Instant::now();
                    if !h.try_lock(&key) {
                        failures += 1;
                        continue;
                    }
                    if fenced != Fenced::No && !h.use_token(fenced == Fenced::NewNames) {
                        failures += 1;
                    }
                    h.unlock();
                    if !warm.load(Ordering::Relaxed) {
                        samples.push(t0.elapsed());
                    }
                }
                (samples, failures)
            })
        })
        .collect();
    start.wait();
    thread::sleep(WARM_UP.min(run_for / 5));
    warm.store(false, Ordering::Relaxed);
    let measured = Instant::now();
    thread::sleep(run_for);
    stop.store(true, Ordering::Relaxed);
    tally.elapsed += measured.elapsed();
    for h in handles {
        let (s, f) = h.join().unwrap();
        tally.cycles += s.len() as u64;
        tally.samples.extend(s);
        tally.failures += f;
    }
}

/// Contended: `threads` threads take one key in turn (with `pause` after each release).
fn contended(
    system: &dyn LockSystem,
    pause: Option<Duration>,
    threads: usize,
    run_for: Duration,
    tally: &mut Tally,
) {
    let key = format!("contended-{:x}", rand::random::<u32>());
    let origin = Instant::now();
    let ns = move || origin.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let waiting_since: Arc<Vec<AtomicU64>> =
        Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut h = system.handle();
            let (key, stop, seq, waiting_since, start) = (
                key.clone(),
                stop.clone(),
                seq.clone(),
                waiting_since.clone(),
                start.clone(),
            );
            thread::spawn(move || {
                // (seq, thread, acquired_ns, wait, released_ns)
                let mut log: Vec<(u64, usize, u64, Duration, u64)> = Vec::new();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    waiting_since[t].store(ns().max(1), Ordering::Relaxed);
                    let got = h.lock(&key, 2_000);
                    waiting_since[t].store(0, Ordering::Relaxed);
                    if !got {
                        continue;
                    }
                    let acquired = ns();
                    let wait = t0.elapsed();
                    let s = seq.fetch_add(1, Ordering::SeqCst);
                    h.unlock();
                    log.push((s, t, acquired, wait, ns()));
                    if let Some(p) = pause {
                        thread::sleep(p);
                    }
                }
                log
            })
        })
        .collect();
    start.wait();
    let began = ns();
    thread::sleep(run_for);
    let end = ns();
    stop.store(true, Ordering::Relaxed);
    // Waits still running at the end count too.
    let unfinished = waiting_since
        .iter()
        .map(|w| w.load(Ordering::Relaxed))
        .filter(|w| *w > 0)
        .map(|w| end.saturating_sub(w))
        .max()
        .unwrap_or(0);
    tally.max_wait = tally.max_wait.max(Duration::from_nanos(unfinished));
    tally.elapsed += Duration::from_nanos(end - began);
    let mut log = Vec::new();
    for h in handles {
        for entry in h.join().unwrap() {
            if tally.per_thread.len() < threads {
                tally.per_thread.resize(threads, 0);
            }
            tally.per_thread[entry.1] += 1;
            log.push(entry);
        }
    }
    log.sort_unstable_by_key(|e| e.0);
    tally.cycles += log.len() as u64;
    for e in &log {
        tally.max_wait = tally.max_wait.max(e.3);
        tally.samples.push(e.3);
    }
    // A hand-over: the next holder is another thread that was already waiting when the
    // lock was released (otherwise the gap would measure idle time, not the lock).
    tally.gaps.extend(
        log.windows(2)
            .filter(|w| {
                let next_started = w[1].2.saturating_sub(w[1].3.as_nanos() as u64);
                w[0].1 != w[1].1 && next_started < w[0].4
            })
            .map(|w| Duration::from_nanos(w[1].2.saturating_sub(w[0].4))),
    );
}

/// What one uncontended cycle costs per node: round trips, commands, new connections
/// (counted by proxies) and the server's CPU time in us.
pub type Counts = (f64, f64, f64, f64);

/// The servers' CPU time so far (user + system, `INFO cpu`), in us.
fn server_cpu_us(server: &RedisServer) -> f64 {
    let info = server.info("cpu");
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (field("used_cpu_user") + field("used_cpu_sys")) * 1e6
}

/// Round trips, commands per node and new connections per uncontended cycle, counted by
/// proxies, and the servers' CPU time per node per cycle, for the cycle of `fenced`.
pub fn request_counts(
    system: &dyn LockSystem,
    proxies: &[Proxy],
    servers: &[&RedisServer],
    fenced: Fenced,
) -> Counts {
    const CYCLES: u64 = 2_000;
    let mut h = system.handle();
    let own = format!("rc-own-{:x}", rand::random::<u32>());
    let cycle = |h: &mut Box<dyn crate::system::LockHandle>, key: String| {
        let key = if fenced == Fenced::OneName {
            own.clone()
        } else {
            key
        };
        assert!(h.try_lock(&key), "{}: lock failed", system.name());
        if fenced != Fenced::No {
            assert!(
                h.use_token(fenced == Fenced::NewNames),
                "{}: no token",
                system.name()
            );
        }
        h.unlock();
    };
    for i in 0..20 {
        cycle(&mut h, format!("rc-warm-{i}-{:x}", rand::random::<u32>()));
    }
    let before: Vec<(u64, u64, u64)> = proxies.iter().map(Proxy::snapshot).collect();
    let cpu_before: f64 = servers.iter().map(|s| server_cpu_us(s)).sum();
    for i in 0..CYCLES {
        cycle(&mut h, format!("rc-{i}-{:x}", rand::random::<u32>()));
    }
    let cpu: f64 = servers.iter().map(|s| server_cpu_us(s)).sum::<f64>() - cpu_before;
    let (mut conns, mut trips, mut cmds) = (0, 0, 0);
    for (p, (c0, t0, m0)) in proxies.iter().zip(before) {
        let (c1, t1, m1) = p.snapshot();
        conns += c1 - c0;
        trips += t1 - t0;
        cmds += m1 - m0;
    }
    let per_node_cycle = (CYCLES * proxies.len() as u64) as f64;
    (
        trips as f64 / per_node_cycle,
        cmds as f64 / per_node_cycle,
        conns as f64 / CYCLES as f64,
        cpu / per_node_cycle,
    )
}

pub fn ping_rtt(server: &RedisServer) -> f64 {
    let mut con = server.connection();
    let mut samples: Vec<Duration> = (0..2_000)
        .map(|_| {
            let t = Instant::now();
            let _: String = redis::cmd("PING").query(&mut con).unwrap();
            t.elapsed()
        })
        .collect();
    samples.sort_unstable();
    percentile(&samples, 0.5).unwrap()
}
