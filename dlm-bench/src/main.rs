//! dlm-bench: dlm side by side with a minimal client and the Rust peers, in one run,
//! against redis-server processes it starts itself.
//!
//! ```text
//! cargo run --release -p dlm-bench -- [--quick | --smoke] [--no-peers] [--json FILE]
//! ```
//! Prints a markdown table (each figure also as a ratio to the minimal client of the same
//! scenario) and optionally writes one JSON object per (system, scenario, nodes, threads).

// A binary: `pub` marks what the modules share, nothing is exported.
#![allow(unreachable_pub)]

mod peers;
mod proxy;
mod system;
mod systems;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::{RedisNodes, RedisServer};

use crate::proxy::Proxy;
use crate::system::LockSystem;
use crate::systems::{Dlm, Minimal};

const TTL: Duration = Duration::from_secs(30);
const CONTENDERS: usize = 4;

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
    /// Only systems whose name contains this.
    only: Option<String>,
    /// Only this scenario.
    scenario: Option<String>,
}

impl Opts {
    fn parse() -> Opts {
        let mut opts = Opts {
            mode: Mode::Full,
            peers: true,
            json: None,
            only: None,
            scenario: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => opts.mode = Mode::Quick,
                "--smoke" => opts.mode = Mode::Smoke,
                "--no-peers" => opts.peers = false,
                "--json" => opts.json = Some(args.next().expect("--json needs a file")),
                "--only" => opts.only = Some(args.next().expect("--only needs a name")),
                "--scenario" => {
                    opts.scenario = Some(args.next().expect("--scenario needs a name"));
                }
                "--bench" => {} // passed by `cargo bench`
                other => {
                    eprintln!(
                        "unknown argument {other:?}\nusage: dlm-bench [--quick | --smoke] [--no-peers] [--json FILE] [--only SYSTEM] [--scenario uncontended|contended|handoff]"
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

    fn run_for(&self) -> Duration {
        match self.mode {
            Mode::Smoke => Duration::from_millis(300),
            Mode::Quick => Duration::from_millis(1500),
            Mode::Full => Duration::from_secs(5),
        }
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
    new_connections_per_cycle: Option<f64>,
    ping_rtt_us: Option<f64>,
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

/// Uncontended: every thread locks and unlocks fresh keys; each lock must succeed first try.
fn uncontended(system: &dyn LockSystem, threads: usize, run_for: Duration) -> Row {
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Arc::new(AtomicBool::new(true));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut h = system.handle();
            let (start, stop, warm) = (start.clone(), stop.clone(), warm.clone());
            thread::spawn(move || {
                let mut samples = Vec::with_capacity(1 << 16);
                let mut failures = 0u64;
                start.wait();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("u{t}-{i}-{:x}", rand::random::<u32>());
                    i += 1;
                    let t0 = Instant::now();
                    if !h.try_lock(&key) {
                        failures += 1;
                        continue;
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
    thread::sleep(run_for / 5);
    warm.store(false, Ordering::Relaxed);
    let measured = Instant::now();
    thread::sleep(run_for);
    stop.store(true, Ordering::Relaxed);
    let elapsed = measured.elapsed();
    let mut samples = Vec::new();
    let mut failures = 0;
    for h in handles {
        let (s, f) = h.join().unwrap();
        samples.extend(s);
        failures += f;
    }
    if failures > 0 {
        eprintln!("{}: {failures} uncontended attempts failed", system.name());
    }
    samples.sort_unstable();
    Row {
        system: system.name(),
        scenario: "uncontended",
        threads,
        cycles_per_sec: Some(samples.len() as f64 / elapsed.as_secs_f64()),
        p50_us: percentile(&samples, 0.5),
        p99_us: percentile(&samples, 0.99),
        ..Row::default()
    }
}

/// Contended: `CONTENDERS` threads take one key in turn (with `pause` after each release).
fn contended(system: &dyn LockSystem, pause: Option<Duration>, run_for: Duration) -> Row {
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
    let mut max_wait = waiting_since
        .iter()
        .map(|w| w.load(Ordering::Relaxed))
        .filter(|w| *w > 0)
        .map(|w| end.saturating_sub(w))
        .max()
        .unwrap_or(0);
    let mut log = Vec::new();
    let mut per_thread = [0u64; CONTENDERS];
    for h in handles {
        for entry in h.join().unwrap() {
            per_thread[entry.1] += 1;
            log.push(entry);
        }
    }
    log.sort_unstable_by_key(|e| e.0);
    let mut waits: Vec<Duration> = log.iter().map(|e| e.3).collect();
    max_wait = max_wait.max(waits.iter().map(|w| w.as_nanos() as u64).max().unwrap_or(0));
    waits.sort_unstable();
    let mut gaps: Vec<Duration> = log
        .windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| Duration::from_nanos(w[1].2.saturating_sub(w[0].4)))
        .collect();
    gaps.sort_unstable();
    let total: f64 = per_thread.iter().sum::<u64>() as f64;
    let squares: f64 = per_thread.iter().map(|x| (*x as f64).powi(2)).sum();
    Row {
        system: system.name(),
        scenario: if pause.is_some() {
            "handoff"
        } else {
            "contended"
        },
        threads: CONTENDERS,
        cycles_per_sec: Some(log.len() as f64 / ((end - began) as f64 / 1e9)),
        p50_us: percentile(&waits, 0.5),
        p99_us: percentile(&waits, 0.99),
        handoff_p50_us: percentile(&gaps, 0.5),
        max_wait_us: Some(max_wait as f64 / 1e3),
        fairness: (squares > 0.0).then(|| total * total / (CONTENDERS as f64 * squares)),
        ..Row::default()
    }
}

/// Requests per node and new connections per uncontended cycle, counted by proxies.
fn request_counts(system: &dyn LockSystem, proxies: &[Proxy]) -> (f64, f64) {
    const CYCLES: u64 = 200;
    let mut h = system.handle();
    for i in 0..20 {
        let key = format!("rc-warm-{i}-{:x}", rand::random::<u32>());
        assert!(h.try_lock(&key), "{}: warm-up lock failed", system.name());
        h.unlock();
    }
    let before: Vec<(u64, u64)> = proxies.iter().map(Proxy::snapshot).collect();
    for i in 0..CYCLES {
        let key = format!("rc-{i}-{:x}", rand::random::<u32>());
        assert!(h.try_lock(&key), "{}: lock failed", system.name());
        h.unlock();
    }
    let (mut conns, mut reqs) = (0, 0);
    for (p, (c0, r0)) in proxies.iter().zip(before) {
        let (c1, r1) = p.snapshot();
        conns += c1 - c0;
        reqs += r1 - r0;
    }
    (
        reqs as f64 / (CYCLES * proxies.len() as u64) as f64,
        conns as f64 / CYCLES as f64,
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
fn systems(urls: &[String], opts: &Opts) -> Vec<Box<dyn LockSystem>> {
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
    if opts.peers {
        v.extend(peers::peers(urls, TTL.as_millis() as u64));
    }
    v
}

fn main() {
    let opts = Opts::parse();
    let run_for = opts.run_for();
    let single = RedisServer::spawn();
    let five = RedisNodes::spawn(5);
    let rtt = ping_rtt(&single);
    eprintln!("PING round trip p50: {rtt:.1} us");
    let mut rows: Vec<Row> = Vec::new();
    let mut push = |mut row: Row, nodes: usize| {
        row.nodes = nodes;
        row.ping_rtt_us = Some(rtt);
        eprintln!(
            "{:<28} {:<11} nodes={} threads={} cycles/s={:.0} p50={:.1}us",
            row.system,
            row.scenario,
            row.nodes,
            row.threads,
            row.cycles_per_sec.unwrap_or(0.0),
            row.p50_us.unwrap_or(0.0)
        );
        rows.push(row);
    };

    // The embedded backend, for reference (no network).
    let memory = Dlm::new(
        "dlm (memory)",
        Arc::new(dlm_memory::MemoryBackend::new()),
        TTL,
    );
    for threads in [1, 8] {
        if opts.wants(&memory.name(), "uncontended") {
            push(uncontended(&memory, threads, run_for), 0);
        }
    }
    if opts.wants(&memory.name(), "contended") {
        push(contended(&memory, None, run_for), 0);
    }

    for (nodes, urls) in [(1, vec![single.url()]), (5, five.urls())] {
        let servers: Vec<&RedisServer> = if nodes == 1 {
            vec![&single]
        } else {
            (0..5).map(|i| five.get(i)).collect()
        };
        let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.port())).collect();
        let proxy_urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let counted = systems(&proxy_urls, &opts);
        let timed = systems(&urls, &opts);
        for (system, counted) in timed.iter().zip(&counted) {
            let name = system.name();
            if opts.wants(&name, "uncontended") {
                let (requests, connections) = request_counts(counted.as_ref(), &proxies);
                for threads in [1, 8] {
                    let mut row = uncontended(system.as_ref(), threads, run_for);
                    row.requests_per_cycle = Some(requests);
                    row.new_connections_per_cycle = Some(connections);
                    push(row, nodes);
                }
            }
            if nodes == 1 || name.starts_with("dlm") || name == "minimal" {
                if opts.wants(&name, "contended") {
                    push(contended(system.as_ref(), None, run_for), nodes);
                }
                if opts.wants(&name, "handoff") {
                    let pause = Some(Duration::from_millis(1));
                    push(contended(system.as_ref(), pause, run_for), nodes);
                }
            }
        }
    }

    print!("{}", markdown(&rows, rtt));
    if let Some(path) = &opts.json {
        std::fs::write(path, json(&rows)).expect("write the JSON file");
        eprintln!("wrote {path}");
    }
}

fn ratio(v: Option<f64>, base: Option<f64>) -> String {
    match (v, base) {
        (Some(v), Some(b)) if b > 0.0 => format!(" ({:.2}x)", v / b),
        _ => String::new(),
    }
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn markdown(rows: &[Row], rtt: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PING round trip p50: {rtt:.1} us. Ratios in parentheses: to the minimal client of the same scenario, nodes and threads.\n"
    );
    let _ = writeln!(
        out,
        "| system | scenario | nodes | threads | cycles/s | p50 us | p99 us | handoff p50 us | max wait us | fairness | requests/node/cycle | new conns/cycle |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let base = rows.iter().find(|b| {
            b.system == "minimal"
                && b.scenario == r.scenario
                && b.nodes == r.nodes
                && b.threads == r.threads
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {}{} | {}{} | {} | {}{} | {} | {} | {} | {} |",
            r.system,
            r.scenario,
            r.nodes,
            r.threads,
            num(r.cycles_per_sec, 0),
            ratio(r.cycles_per_sec, base.and_then(|b| b.cycles_per_sec)),
            num(r.p50_us, 1),
            ratio(r.p50_us, base.and_then(|b| b.p50_us)),
            num(r.p99_us, 1),
            num(r.handoff_p50_us, 1),
            r.handoff_p50_us
                .map(|h| format!(" ({:.1} RTT)", h / rtt))
                .unwrap_or_default(),
            num(r.max_wait_us, 0),
            num(r.fairness, 2),
            num(r.requests_per_cycle, 2),
            num(r.new_connections_per_cycle, 3),
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
            "  {{\"system\": {:?}, \"scenario\": {:?}, \"nodes\": {}, \"threads\": {}, \"cycles_per_sec\": {}, \"p50_us\": {}, \"p99_us\": {}, \"handoff_p50_us\": {}, \"max_wait_us\": {}, \"fairness\": {}, \"requests_per_cycle\": {}, \"new_connections_per_cycle\": {}, \"ping_rtt_us\": {}}}{}",
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
            f(r.new_connections_per_cycle),
            f(r.ping_rtt_us),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    out.push_str("]\n");
    out
}
