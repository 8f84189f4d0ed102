//! dlm-bench: dlm side by side with a minimal client and the Rust peers, in one run,
//! against redis-server processes it starts itself.
//!
//! ```text
//! cargo run --release -p dlm-bench -- [--quick | --smoke] [--no-peers] [--json FILE] [--svg FILE]
//! ```
//! Prints a markdown table (each figure also as a ratio to the minimal client of the same
//! scenario) and optionally writes one JSON object per (system, scenario, nodes, threads),
//! and an SVG chart of the ratios to the minimal client with their round-to-round range.
//! Within a scenario the systems run in interleaved rounds (A B C, B C A, ...), so that
//! the machine's slow and fast spells fall on all of them alike: the ratios are what this
//! harness is for.

// A binary: `pub` marks what the modules share, nothing is exported.
#![allow(unreachable_pub)]

mod chart;
mod etcd;
mod peers;
mod proxy;
mod recorder;
mod system;
mod systems;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::{RedisNodes, RedisServer};

use crate::proxy::Proxy;
use crate::recorder::Atomics;
use crate::system::LockSystem;
use crate::systems::{Dlm, Minimal};

const TTL: Duration = Duration::from_secs(30);
const CONTENDERS: usize = 4;
/// Unmeasured time at the start of each uncontended round (connections, caches).
const WARM_UP: Duration = Duration::from_millis(200);
/// The rows with metrics on and a recorder installed (uncontended only), and the row
/// each is compared with: the same system without a recorder.
const METERED: [(&str, &str); 3] = [
    ("dlm (memory, metrics)", "dlm (memory)"),
    ("dlm (metrics)", "dlm"),
    ("dlm (no fencing, metrics)", "dlm (no fencing)"),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Smoke,
    Quick,
    Full,
}

struct Opts {
    mode: Mode,
    peers: bool,
    json: Option<String>,
    /// Where to write the chart.
    svg: Option<String>,
    /// Only systems whose name contains this.
    only: Option<String>,
    /// Only this scenario.
    scenario: Option<String>,
    /// Only this many Redis nodes (1 or 5).
    nodes: Option<usize>,
    /// Rounds per scenario, instead of the mode's.
    rounds: Option<usize>,
}

impl Opts {
    fn parse() -> Opts {
        let mut opts = Opts {
            mode: Mode::Full,
            peers: true,
            json: None,
            svg: None,
            only: None,
            scenario: None,
            nodes: None,
            rounds: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => opts.mode = Mode::Quick,
                "--smoke" => opts.mode = Mode::Smoke,
                "--no-peers" => opts.peers = false,
                "--json" => opts.json = Some(args.next().expect("--json needs a file")),
                "--svg" => opts.svg = Some(args.next().expect("--svg needs a file")),
                "--only" => opts.only = Some(args.next().expect("--only needs a name")),
                "--scenario" => {
                    opts.scenario = Some(args.next().expect("--scenario needs a name"));
                }
                "--nodes" => {
                    opts.nodes = args.next().and_then(|n| n.parse().ok());
                    if !matches!(opts.nodes, Some(1 | 5)) {
                        eprintln!("--nodes needs 1 or 5");
                        std::process::exit(2);
                    }
                }
                "--rounds" => {
                    opts.rounds = args.next().and_then(|n| n.parse().ok()).filter(|n| *n > 0);
                    if opts.rounds.is_none() {
                        eprintln!("--rounds needs a positive count");
                        std::process::exit(2);
                    }
                }
                "--bench" => {} // passed by `cargo bench`
                other => {
                    eprintln!(
                        "unknown argument {other:?}
usage: dlm-bench [--quick | --smoke] [--no-peers] [--json FILE] [--svg FILE] [--only SYSTEM] [--scenario uncontended|contended|handoff|paused-minority|fenced-use] [--nodes 1|5] [--rounds N]"
                    );
                    std::process::exit(2);
                }
            }
        }
        if opts.mode == Mode::Smoke {
            opts.peers = false;
        }
        opts
    }

    fn wants(&self, system: &str, scenario: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| system.contains(o.as_str()))
            && self.scenario.as_ref().is_none_or(|s| s == scenario)
    }

    /// How many rounds each scenario runs, and how long each system runs per round.
    fn rounds(&self) -> (usize, Duration) {
        let (rounds, run_for) = match self.mode {
            Mode::Smoke => (1, Duration::from_millis(300)),
            Mode::Quick => (3, Duration::from_millis(500)),
            Mode::Full => (5, Duration::from_secs(1)),
        };
        (self.rounds.unwrap_or(rounds), run_for)
    }
}

/// One row of results.
#[derive(Clone, Default)]
struct Row {
    system: String,
    scenario: &'static str,
    nodes: usize,
    threads: usize,
    cycles_per_sec: Option<f64>,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    handoff_p50_us: Option<f64>,
    max_wait_us: Option<f64>,
    fairness: Option<f64>,
    requests_per_cycle: Option<f64>,
    commands_per_cycle: Option<f64>,
    new_connections_per_cycle: Option<f64>,
    /// The servers' CPU time (user + system, `INFO cpu`) per node per counted cycle.
    server_us_per_cycle: Option<f64>,
    ping_rtt_us: Option<f64>,
    /// Cycles per second of each round (the spread behind `cycles_per_sec`).
    round_rates: Vec<f64>,
    /// The system this row is compared with (same scenario and threads, any nodes),
    /// instead of the minimal client: for the replicated deployments.
    base: Option<&'static str>,
}

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
    per_thread: [u64; CONTENDERS],
    /// Uncontended attempts that failed.
    failures: u64,
    /// Cycles per second of each round, in round order.
    round_rates: Vec<f64>,
}

/// A scenario: how one round of one system is run.
#[derive(Clone, Copy)]
enum Scenario {
    Uncontended {
        threads: usize,
    },
    /// `CONTENDERS` threads on one key, with this pause after each release.
    Contended {
        pause: Option<Duration>,
    },
    /// Uncontended, one thread, with one of five Redlock nodes stopped (SIGSTOP).
    PausedMinority,
    /// Uncontended, each thread on one name of its own: lock, read the fencing token and
    /// write with it to a `FencedResource`, unlock (the minimal client: lock, unlock).
    FencedUse {
        threads: usize,
    },
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Uncontended { .. } => "uncontended",
            Scenario::Contended { pause: None } => "contended",
            Scenario::Contended { pause: Some(_) } => "handoff",
            Scenario::PausedMinority => "paused-minority",
            Scenario::FencedUse { .. } => "fenced-use",
        }
    }

    fn threads(self) -> usize {
        match self {
            Scenario::Uncontended { threads } => threads,
            Scenario::Contended { .. } => CONTENDERS,
            Scenario::PausedMinority => 1,
            Scenario::FencedUse { threads } => threads,
        }
    }

    fn run(self, system: &dyn LockSystem, run_for: Duration, tally: &mut Tally) {
        let (cycles, elapsed) = (tally.cycles, tally.elapsed);
        match self {
            Scenario::Uncontended { threads } => {
                uncontended(system, threads, false, run_for, tally)
            }
            Scenario::PausedMinority => uncontended(system, 1, false, run_for, tally),
            Scenario::FencedUse { threads } => uncontended(system, threads, true, run_for, tally),
            Scenario::Contended { pause } => contended(system, pause, run_for, tally),
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
        | Scenario::FencedUse { .. } = self
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
        row.fairness = (squares > 0.0).then(|| total * total / (CONTENDERS as f64 * squares));
        row
    }
}

/// Runs `scenario` for every system in `rounds` rounds of `run_for` each, rotating the
/// order, so that a slow spell of the machine hits every system alike. One row per
/// system, in the order given.
fn measure(
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
fn uncontended(
    system: &dyn LockSystem,
    threads: usize,
    fenced: bool,
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
                    let key = if fenced {
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
                    if fenced && !h.use_token() {
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

/// Contended: `CONTENDERS` threads take one key in turn (with `pause` after each release).
fn contended(
    system: &dyn LockSystem,
    pause: Option<Duration>,
    run_for: Duration,
    tally: &mut Tally,
) {
    let key = format!("contended-{:x}", rand::random::<u32>());
    let origin = Instant::now();
    let ns = move || origin.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let waiting_since: Arc<Vec<AtomicU64>> =
        Arc::new((0..CONTENDERS).map(|_| AtomicU64::new(0)).collect());
    let start = Arc::new(Barrier::new(CONTENDERS + 1));
    let handles: Vec<_> = (0..CONTENDERS)
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
type Counts = (f64, f64, f64, f64);

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
/// proxies, and the servers' CPU time per node per cycle. With `fenced`, the cycle of
/// `fenced-use`: one key, its token read and used.
fn request_counts(
    system: &dyn LockSystem,
    proxies: &[Proxy],
    servers: &[&RedisServer],
    fenced: bool,
) -> Counts {
    const CYCLES: u64 = 2_000;
    let mut h = system.handle();
    let own = format!("rc-own-{:x}", rand::random::<u32>());
    let cycle = |h: &mut Box<dyn crate::system::LockHandle>, key: String| {
        let key = if fenced { own.clone() } else { key };
        assert!(h.try_lock(&key), "{}: lock failed", system.name());
        if fenced {
            assert!(h.use_token(), "{}: no token", system.name());
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

fn ping_rtt(server: &RedisServer) -> f64 {
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

/// The systems for one set of servers.
fn systems(urls: &[String], opts: &Opts, recorder: &Arc<Atomics>) -> Vec<Box<dyn LockSystem>> {
    let mut v: Vec<Box<dyn LockSystem>> = Vec::new();
    if urls.len() == 1 {
        let fenced = dlm_redis::RedisBackend::new(&urls[0]).unwrap();
        v.push(Box::new(Dlm::new("dlm", Arc::new(fenced), TTL)));
        let plain = dlm_redis::RedisBackend::builder(&urls[0])
            .fencing(false)
            .build()
            .unwrap();
        v.push(Box::new(Dlm::new("dlm (no fencing)", Arc::new(plain), TTL)));
    } else {
        let fenced = dlm_redis::Redlock::new(urls).unwrap();
        v.push(Box::new(Dlm::new("dlm", Arc::new(fenced), TTL)));
        let plain = dlm_redis::Redlock::builder(urls)
            .fencing(false)
            .build()
            .unwrap();
        v.push(Box::new(Dlm::new("dlm (no fencing)", Arc::new(plain), TTL)));
    }
    v.push(Box::new(Minimal::new(urls, TTL)));
    // The transport A/B: the same minimal client over dlm's own connection.
    v.push(Box::new(Minimal::over_dlm_transport(urls, TTL)));
    // dlm with a recorder installed, beside dlm without: the cost of its metrics.
    for (name, fencing) in [
        ("dlm (metrics)", true),
        ("dlm (no fencing, metrics)", false),
    ] {
        if !opts.wants(name, "uncontended") {
            continue;
        }
        let backend = metrics::with_local_recorder(recorder.as_ref(), || {
            let b: Arc<dyn dlm_core::backend::LockBackend> = if urls.len() == 1 {
                let b = dlm_redis::RedisBackend::builder(&urls[0]).fencing(fencing);
                Arc::new(b.build().unwrap())
            } else {
                let b = dlm_redis::Redlock::builder(urls).fencing(fencing);
                Arc::new(b.build().unwrap())
            };
            b
        });
        v.push(Box::new(
            Dlm::new(name, backend, TTL).with_metrics(recorder.clone()),
        ));
    }
    if opts.peers {
        v.extend(peers::peers(urls, TTL.as_millis() as u64));
    }
    v
}

fn main() {
    let opts = Opts::parse();
    let (rounds, run_for) = opts.rounds();
    let recorder = Arc::new(Atomics::default());
    // The single server has a TLS port too (test CA), for dlm over rediss:// beside plain.
    let pki = dlm_testkit::tls::TestPki::new();
    let single = RedisServer::builder()
        .tls(&pki, dlm_testkit::tls::ServerCert::Valid)
        .spawn();
    let five = RedisNodes::spawn(5);
    let rtt = ping_rtt(&single);
    eprintln!("PING round trip p50: {rtt:.1} us");
    let mut rows: Vec<Row> = Vec::new();
    let mut push = |mut row: Row, nodes: usize| {
        row.nodes = nodes;
        if let Some((_, base)) = METERED.iter().find(|(name, _)| *name == row.system) {
            row.base = Some(base);
        }
        row.ping_rtt_us = Some(rtt);
        eprintln!(
            "{:<28} {:<11} nodes={} threads={} cycles/s={:.0} p50={:.1}us p99={:.1}us",
            row.system,
            row.scenario,
            row.nodes,
            row.threads,
            row.cycles_per_sec.unwrap_or(0.0),
            row.p50_us.unwrap_or(0.0),
            row.p99_us.unwrap_or(0.0)
        );
        rows.push(row);
    };
    let scenarios = [
        Scenario::Uncontended { threads: 1 },
        Scenario::Uncontended { threads: 8 },
        Scenario::Contended { pause: None },
        Scenario::Contended {
            pause: Some(Duration::from_millis(1)),
        },
    ];

    // The embedded backend, for reference (no network, nothing to compare with).
    let memory = Dlm::new(
        "dlm (memory)",
        Arc::new(dlm_memory::MemoryBackend::new()),
        TTL,
    );
    let memory_metered = Dlm::new(
        METERED[0].0,
        Arc::new(dlm_memory::MemoryBackend::new()),
        TTL,
    )
    .with_metrics(recorder.clone());
    for scenario in &scenarios[..3] {
        let chosen: Vec<&dyn LockSystem> = [&memory as &dyn LockSystem, &memory_metered]
            .into_iter()
            .filter(|s| opts.wants(&s.name(), scenario.name()))
            .filter(|s| {
                matches!(scenario, Scenario::Uncontended { .. }) || !s.name().contains("metrics")
            })
            .collect();
        if !chosen.is_empty() {
            for row in measure(&chosen, *scenario, rounds, run_for) {
                push(row, 0);
            }
        }
    }

    // etcd, one member: dlm beside the minimal gateway client and etcd's lock service.
    if opts.nodes.is_none_or(|n| n == 1) {
        let member = dlm_testkit::etcd::EtcdServer::spawn();
        let base = member.url();
        let dlm_etcd = Dlm::new(
            "dlm (etcd)",
            Arc::new(dlm_etcd::EtcdBackend::new(&[base.as_str()]).unwrap()),
            TTL,
        );
        let minimal = etcd::MinimalEtcd { base: base.clone() };
        let service = etcd::EtcdLockService { base };
        for scenario in &scenarios {
            let chosen: Vec<&dyn LockSystem> = [
                &dlm_etcd as &dyn LockSystem,
                &minimal as &dyn LockSystem,
                &service as &dyn LockSystem,
            ]
            .into_iter()
            .filter(|s| opts.wants(&s.name(), scenario.name()))
            .collect();
            if !chosen.is_empty() {
                for row in measure(&chosen, *scenario, rounds, run_for) {
                    push(row, 1);
                }
            }
        }
    }

    for (nodes, urls) in [(1, vec![single.url()]), (5, five.urls())] {
        if opts.nodes.is_some_and(|n| n != nodes) {
            continue;
        }
        let servers: Vec<&RedisServer> = if nodes == 1 {
            vec![&single]
        } else {
            (0..5).map(|i| five.get(i)).collect()
        };
        let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.port())).collect();
        let proxy_urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let counted = systems(&proxy_urls, &opts, &recorder);
        let mut timed = systems(&urls, &opts, &recorder);
        if nodes == 1 {
            // TLS (uncontended only; not counted: the proxy cannot read TLS).
            let tls = || dlm_redis::TlsOptions::new().ca_file(pki.ca_file());
            for (name, fencing) in [("dlm (TLS)", true), ("dlm (TLS, no fencing)", false)] {
                let backend = dlm_redis::RedisBackend::builder(&single.tls_url())
                    .tls(tls())
                    .fencing(fencing)
                    .build()
                    .unwrap();
                timed.push(Box::new(Dlm::new(name, Arc::new(backend), TTL)));
            }
        }
        let mut counts = Vec::new();
        for (system, counted) in timed.iter().zip(&counted) {
            counts.push(
                opts.wants(&system.name(), "uncontended")
                    .then(|| request_counts(counted.as_ref(), &proxies, &servers, false)),
            );
        }
        for scenario in scenarios {
            // Peers poll while they wait: on five nodes only dlm and the bar are timed
            // under contention (the peers' figures there add minutes, not information).
            let chosen: Vec<&dyn LockSystem> = timed
                .iter()
                .map(|s| s.as_ref())
                .filter(|s| opts.wants(&s.name(), scenario.name()))
                .filter(|s| {
                    matches!(scenario, Scenario::Uncontended { .. })
                        || !(s.name().contains("TLS") || s.name().contains("metrics"))
                })
                .filter(|s| {
                    nodes == 1
                        || matches!(scenario, Scenario::Uncontended { .. })
                        || s.name().starts_with("dlm")
                        || s.name() == "minimal"
                })
                .collect();
            if chosen.is_empty() {
                continue;
            }
            for mut row in measure(&chosen, scenario, rounds, run_for) {
                if let Scenario::Uncontended { .. } = scenario
                    && let Some(Some((trips, cmds, conns, cpu))) = timed
                        .iter()
                        .position(|s| s.name() == row.system)
                        .and_then(|i| counts.get(i).copied())
                {
                    row.requests_per_cycle = Some(trips);
                    row.commands_per_cycle = Some(cmds);
                    row.new_connections_per_cycle = Some(conns);
                    row.server_us_per_cycle = Some(cpu);
                }
                push(row, nodes);
            }
        }
        // Fencing that is used: dlm (fenced; the token drawn with the acquisition once a
        // hold of the lock has read it) beside dlm drawing on read (`TokenDraw::WhenRead`,
        // one more round trip) and the minimal client, which does not fence (the bar:
        // what a lock costs).
        let when_read = |urls: &[String]| -> Box<dyn LockSystem> {
            let backend: Arc<dyn dlm_core::backend::LockBackend> = if urls.len() == 1 {
                Arc::new(dlm_redis::RedisBackend::new(&urls[0]).unwrap())
            } else {
                Arc::new(dlm_redis::Redlock::new(urls).unwrap())
            };
            Box::new(
                Dlm::new("dlm (drawn when read)", backend, TTL)
                    .token_draw(dlm_core::TokenDraw::WhenRead),
            )
        };
        let (fenced_timed, fenced_counted) = (when_read(&urls), when_read(&proxy_urls));
        let fenced_use = |s: &&dyn LockSystem| {
            matches!(
                s.name().as_str(),
                "dlm" | "dlm (drawn when read)" | "minimal"
            ) && opts.wants(&s.name(), "fenced-use")
        };
        let fenced_counts: Vec<(String, Counts)> = counted
            .iter()
            .map(|s| s.as_ref())
            .chain([fenced_counted.as_ref()])
            .filter(fenced_use)
            .map(|s| (s.name(), request_counts(s, &proxies, &servers, true)))
            .collect();
        for threads in [1, 8] {
            let scenario = Scenario::FencedUse { threads };
            let chosen: Vec<&dyn LockSystem> = timed
                .iter()
                .map(|s| s.as_ref())
                .chain([fenced_timed.as_ref()])
                .filter(fenced_use)
                .collect();
            if chosen.len() < 2 {
                continue;
            }
            for mut row in measure(&chosen, scenario, rounds, run_for) {
                if let Some((_, (trips, cmds, conns, cpu))) =
                    fenced_counts.iter().find(|(name, _)| *name == row.system)
                {
                    row.requests_per_cycle = Some(*trips);
                    row.commands_per_cycle = Some(*cmds);
                    row.new_connections_per_cycle = Some(*conns);
                    row.server_us_per_cycle = Some(*cpu);
                }
                push(row, nodes);
            }
        }
        // One of five nodes stopped: dlm only (the minimal client and the peers have no
        // per-node timeout worth the name: they would wait for the stopped node).
        let scenario = Scenario::PausedMinority;
        let chosen: Vec<&dyn LockSystem> = timed
            .iter()
            .map(|s| s.as_ref())
            .filter(|s| {
                s.name().starts_with("dlm")
                    && !s.name().contains("metrics")
                    && opts.wants(&s.name(), scenario.name())
            })
            .collect();
        if nodes == 5 && !chosen.is_empty() {
            five.get(4).pause();
            for row in measure(&chosen, scenario, rounds, run_for) {
                push(row, nodes);
            }
            five.get(4).resume();
        }
    }

    // Replicated deployments: a master with one replica, and a cluster of three masters
    // with a replica each; with and without `wait_for_replicas(1, ...)`, uncontended.
    let replicated = [
        ("dlm (1 replica)", None, "dlm"),
        ("dlm (1 replica, WAIT 1)", Some(1), "dlm (1 replica)"),
        ("dlm (cluster)", None, "dlm"),
        ("dlm (cluster, WAIT 1)", Some(1), "dlm (cluster)"),
    ];
    if replicated
        .iter()
        .any(|(name, ..)| opts.wants(name, "uncontended"))
    {
        let master = RedisServer::spawn();
        let replica = RedisServer::builder()
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(&master.port().to_string())
            .spawn();
        wait_for_replica(&replica);
        let cluster = dlm_testkit::cluster::RedisCluster::spawn();
        let wait = Duration::from_millis(500);
        let mut groups: Vec<(usize, Vec<Box<dyn LockSystem>>)> = Vec::new();
        for (nodes, pair) in [(2, &replicated[..2]), (6, &replicated[2..])] {
            let mut systems: Vec<Box<dyn LockSystem>> = Vec::new();
            for (name, replicas, _) in pair {
                let backend = match (nodes, replicas) {
                    (2, Some(n)) => dlm_redis::RedisBackend::builder(&master.url())
                        .wait_for_replicas(*n, wait)
                        .build(),
                    (2, None) => dlm_redis::RedisBackend::new(&master.url()),
                    (_, Some(n)) => dlm_redis::RedisBackend::cluster_builder(&cluster.seed_urls())
                        .wait_for_replicas(*n, wait)
                        .build(),
                    (_, None) => dlm_redis::RedisBackend::cluster(&cluster.seed_urls()),
                };
                systems.push(Box::new(Dlm::new(name, Arc::new(backend.unwrap()), TTL)));
            }
            groups.push((nodes, systems));
        }
        for scenario in &scenarios[..2] {
            for (nodes, systems) in &groups {
                let chosen: Vec<&dyn LockSystem> = systems
                    .iter()
                    .map(|s| s.as_ref())
                    .filter(|s| opts.wants(&s.name(), scenario.name()))
                    .collect();
                if chosen.is_empty() {
                    continue;
                }
                for mut row in measure(&chosen, *scenario, rounds, run_for) {
                    row.base = replicated
                        .iter()
                        .find(|(name, ..)| *name == row.system)
                        .map(|(.., base)| *base);
                    push(row, *nodes);
                }
            }
        }
        drop(replica);
    }

    let summary = recorder.summary();
    if !summary.is_empty() {
        eprintln!("what the (metrics) rows recorded:\n{summary}");
    }
    print!("{}", markdown(&rows, rtt, rounds, run_for));
    if let Some(path) = &opts.json {
        std::fs::write(path, json(&rows)).expect("write the JSON file");
        eprintln!("wrote {path}");
    }
    if let Some(path) = &opts.svg {
        let caption = format!(
            "dlm-bench: cycles/s as a ratio to the minimal client; {rounds} round(s) of {run_for:?} per system"
        );
        std::fs::write(path, chart::svg(&rows, &caption)).expect("write the SVG file");
        eprintln!("wrote {path}");
    }
}

/// Waits until `replica` has synchronised with its master (at most 10 s).
fn wait_for_replica(replica: &RedisServer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replica
        .info("replication")
        .contains("master_link_status:up")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica did not connect"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ratio(v: Option<f64>, base: Option<f64>) -> String {
    match (v, base) {
        (Some(v), Some(b)) if b > 0.0 => format!(" ({:.2}x)", v / b),
        _ => String::new(),
    }
}

/// The lowest and highest ratio of `rates` to `base` over rounds run side by side
/// (round k of one system against round k of the other); `None` below two rounds.
fn round_range(rates: &[f64], base: &[f64]) -> Option<(f64, f64)> {
    let ratios: Vec<f64> = rates
        .iter()
        .zip(base)
        .filter(|(_, b)| **b > 0.0)
        .map(|(r, b)| r / b)
        .collect();
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (ratios.len() >= 2).then_some((lo, hi))
}

/// [`round_range`] for the table.
fn round_ratios(rates: &[f64], base: &[f64]) -> String {
    round_range(rates, base).map_or_else(|| "-".into(), |(lo, hi)| format!("{lo:.2}-{hi:.2}"))
}

/// The minimal client etcd's rows are compared with (a put-if-absent transaction and a
/// delete over the gateway).
pub(crate) const MINIMAL_ETCD: &str = "minimal (etcd gateway)";

/// The name of the minimal client `system` is compared with: the etcd gateway client for
/// etcd's rows, the Redis one for the others.
pub(crate) fn minimal_name(system: &str) -> &'static str {
    if system.contains("etcd") {
        MINIMAL_ETCD
    } else {
        "minimal"
    }
}

/// The row of the minimal client of `r`'s kind ([`minimal_name`]) with the same
/// scenario, nodes and threads as `r`.
fn minimal_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    let minimal = minimal_name(&r.system);
    rows.iter().find(|b| {
        b.system == minimal
            && b.scenario == r.scenario
            && b.nodes == r.nodes
            && b.threads == r.threads
    })
}

/// The row `r` is compared with in the table: its `base` (same scenario and threads, on
/// the same nodes if there is one, else on any), the same system's uncontended row for
/// paused-minority, else the minimal client.
fn base_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    if let Some(base) = r.base {
        let same =
            |b: &&Row| b.system == base && b.scenario == r.scenario && b.threads == r.threads;
        return rows
            .iter()
            .filter(same)
            .find(|b| b.nodes == r.nodes)
            .or_else(|| rows.iter().find(same));
    }
    if r.scenario == "paused-minority" {
        return rows.iter().find(|b| {
            b.system == r.system
                && b.scenario == "uncontended"
                && b.nodes == r.nodes
                && b.threads == r.threads
        });
    }
    minimal_of(rows, r)
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn markdown(rows: &[Row], rtt: f64, rounds: usize, run_for: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PING round trip p50: {rtt:.1} us. Each scenario: {rounds} interleaved round(s) of {run_for:?} per system. Ratios in parentheses: to the minimal client of the same scenario, nodes and threads (for etcd's rows: the minimal etcd gateway client; paused-minority: to the same system's uncontended row on the five healthy nodes; a master with a replica and the cluster: to dlm on the single server; their WAIT rows: to the same deployment without WAIT; the (metrics) rows, with a recorder installed: to the same system without one); by round: the lowest and highest ratio of cycles/s between rounds run side by side. Requests: round trips per node; commands: what they carried (pipelined commands share a round trip); server us: the servers' CPU time (INFO cpu, user + system) per node per cycle, over 2,000 cycles of one client.\n"
    );
    let _ = writeln!(
        out,
        "| system | scenario | nodes | threads | cycles/s | by round | p50 us | p99 us | handoff p50 us | max wait us | fairness | requests/node/cycle | commands/node/cycle | new conns/cycle | server us/node/cycle |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let base = base_of(rows, r);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {}{} | {} | {}{} | {}{} | {}{} | {} | {} | {} | {} | {} | {}{} |",
            r.system,
            r.scenario,
            r.nodes,
            r.threads,
            num(r.cycles_per_sec, 0),
            ratio(r.cycles_per_sec, base.and_then(|b| b.cycles_per_sec)),
            base.filter(|b| b.system != r.system).map_or_else(
                || "-".into(),
                |b| round_ratios(&r.round_rates, &b.round_rates)
            ),
            num(r.p50_us, 1),
            ratio(r.p50_us, base.and_then(|b| b.p50_us)),
            num(r.p99_us, 1),
            ratio(r.p99_us, base.and_then(|b| b.p99_us)),
            num(r.handoff_p50_us, 1),
            r.handoff_p50_us
                .map(|h| format!(" ({:.1} RTT)", h / rtt))
                .unwrap_or_default(),
            num(r.max_wait_us, 0),
            num(r.fairness, 2),
            num(r.requests_per_cycle, 2),
            num(r.commands_per_cycle, 2),
            num(r.new_connections_per_cycle, 3),
            num(r.server_us_per_cycle, 1),
            ratio(
                r.server_us_per_cycle,
                base.and_then(|b| b.server_us_per_cycle)
            ),
        );
    }
    out
}

fn json(rows: &[Row]) -> String {
    let f = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| format!("{v:.3}"));
    let mut out = String::from("[\n");
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {{\"system\": {:?}, \"scenario\": {:?}, \"nodes\": {}, \"threads\": {}, \"cycles_per_sec\": {}, \"p50_us\": {}, \"p99_us\": {}, \"handoff_p50_us\": {}, \"max_wait_us\": {}, \"fairness\": {}, \"requests_per_cycle\": {}, \"commands_per_cycle\": {}, \"new_connections_per_cycle\": {}, \"server_us_per_cycle\": {}, \"ping_rtt_us\": {}, \"cycles_per_sec_rounds\": [{}]}}{}",
            r.system,
            r.scenario,
            r.nodes,
            r.threads,
            f(r.cycles_per_sec),
            f(r.p50_us),
            f(r.p99_us),
            f(r.handoff_p50_us),
            f(r.max_wait_us),
            f(r.fairness),
            f(r.requests_per_cycle),
            f(r.commands_per_cycle),
            f(r.new_connections_per_cycle),
            f(r.server_us_per_cycle),
            f(r.ping_rtt_us),
            r.round_rates
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    out.push_str("]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, cps: f64) -> Row {
        Row {
            system: system.to_owned(),
            scenario: "uncontended",
            nodes: 1,
            threads: 1,
            cycles_per_sec: Some(cps),
            round_rates: vec![cps, cps],
            ..Row::default()
        }
    }

    #[test]
    fn etcd_rows_are_compared_with_the_minimal_gateway_client_not_with_redis() {
        let rows = [
            row("minimal", 10_000.0),
            row("dlm", 9_000.0),
            row(MINIMAL_ETCD, 400.0),
            row("dlm (etcd)", 380.0),
            row("etcd /v3/lock", 200.0),
        ];
        for (system, base) in [
            ("dlm", "minimal"),
            ("dlm (etcd)", MINIMAL_ETCD),
            ("etcd /v3/lock", MINIMAL_ETCD),
        ] {
            let r = rows.iter().find(|r| r.system == system).unwrap();
            assert_eq!(base_of(&rows, r).unwrap().system, base, "{system}");
        }
        let table = markdown(&rows, 50.0, 2, Duration::from_millis(500));
        let etcd = table
            .lines()
            .find(|l| l.starts_with("| dlm (etcd) "))
            .unwrap();
        assert!(etcd.contains("| 380 (0.95x) |"), "{etcd}");
    }
}
