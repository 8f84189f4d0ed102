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
mod elections;
mod etcd;
mod file;
mod opts;
mod peers;
mod postgres;
mod proxy;
mod recorder;
mod report;
mod scenario;
mod system;
mod systems;

use std::sync::Arc;
use std::time::Duration;

use dlm_testkit::redis_server::{RedisNodes, RedisServer};

use crate::opts::Opts;
use crate::proxy::Proxy;
use crate::recorder::Atomics;
use crate::report::{Row, json, markdown};
use crate::scenario::{CONTENDERS, Counts, Fenced, Scenario, measure, ping_rtt, request_counts};
use crate::system::LockSystem;
use crate::systems::{Dlm, Minimal, MinimalPubSub, Primitive};

const TTL: Duration = Duration::from_secs(30);
/// The pub/sub-woken minimal client's row (contended scenarios only).
const PUBSUB_MINIMAL: &str = "minimal (pub/sub)";

/// The rows with metrics on and a recorder installed (uncontended only), and the row
/// each is compared with: the same system without a recorder.
const METERED: [(&str, &str); 3] = [
    ("dlm (memory, metrics)", "dlm (memory)"),
    ("dlm (metrics)", "dlm"),
    ("dlm (no fencing, metrics)", "dlm (no fencing)"),
];

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
    if urls.len() == 1 {
        // Contended and hand-over only: the bar woken by pub/sub instead of spinning.
        v.push(Box::new(MinimalPubSub::new(&urls[0], TTL)));
    }
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
    if let Ok(spec) = std::env::var(file::CHILD) {
        file::child(&spec);
        return;
    }
    let opts = Opts::parse();
    if opts.elections {
        elections::run(opts.election_rounds());
        return;
    }
    if opts.file {
        file::run(opts.rounds.unwrap_or(5));
        return;
    }
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
        Scenario::Contended {
            pause: None,
            threads: CONTENDERS,
        },
        Scenario::Contended {
            threads: CONTENDERS,
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
        let minimal = etcd::MinimalEtcd {
            base: base.clone(),
            checked: false,
        };
        let checked = etcd::MinimalEtcd {
            base: base.clone(),
            checked: true,
        };
        let service = etcd::EtcdLockService { base };
        for scenario in &scenarios {
            let chosen: Vec<&dyn LockSystem> = [
                &dlm_etcd as &dyn LockSystem,
                &minimal as &dyn LockSystem,
                &checked as &dyn LockSystem,
                &service as &dyn LockSystem,
            ]
            .into_iter()
            .filter(|s| opts.wants(&s.name(), scenario.name()))
            // The checked release is the uncontended bar's second reference only.
            .filter(|s| {
                matches!(scenario, Scenario::Uncontended { .. })
                    || s.name() != etcd::MINIMAL_ETCD_CHECKED
            })
            .collect();
            if !chosen.is_empty() {
                for row in measure(&chosen, *scenario, rounds, run_for) {
                    push(row, 1);
                }
            }
        }
    }

    // PostgreSQL, one server: dlm beside the minimal rows client (the same mechanism at
    // its least) and the raw session advisory-lock cycle.
    let postgres_rows = [
        "dlm (postgres)",
        report::MINIMAL_POSTGRES,
        postgres::MINIMAL_POSTGRES_DLM_SQL,
        "advisory lock (postgres)",
    ];
    if opts.nodes.is_none_or(|n| n == 1)
        && postgres_rows
            .iter()
            .any(|name| scenarios.iter().any(|s| opts.wants(name, s.name())))
    {
        let server = dlm_testkit::postgres::PostgresServer::spawn();
        let url = server.url();
        let backend = Arc::new(dlm_postgres::PostgresBackend::new(&url).unwrap());
        let minimal_dlm_sql = postgres::MinimalPostgres::with_statements_of(&url, TTL, &backend);
        let dlm_postgres = Dlm::new(postgres_rows[0], backend, TTL);
        let minimal = postgres::MinimalPostgres::new(&url, TTL);
        let advisory = postgres::AdvisoryLock { url };
        for scenario in &scenarios {
            let chosen: Vec<&dyn LockSystem> = [
                &dlm_postgres as &dyn LockSystem,
                &minimal as &dyn LockSystem,
                &minimal_dlm_sql as &dyn LockSystem,
                &advisory as &dyn LockSystem,
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
            // The semaphore and the read-write lock beside the mutex (issue #23): a
            // permit and a read hold uncontended; contended (4 threads, as every
            // contended row): 3 permits, and 1 writer with 3 readers.
            for (name, primitive) in [
                ("dlm semaphore (3 permits)", Primitive::Permit(3)),
                ("dlm read hold", Primitive::Read),
                (
                    "dlm rw (1 writer, 3 readers)",
                    Primitive::OneWriterIn(CONTENDERS),
                ),
                ("dlm rw (1 writer, 7 readers)", Primitive::OneWriterIn(8)),
                // A multi-lock of 3 names beside the same 3 names taken one by one.
                ("dlm multi-lock (3 names)", Primitive::Multi(3)),
                ("dlm 3 locks one by one", Primitive::OneByOne(3)),
            ] {
                let backend = dlm_redis::RedisBackend::new(&single.url()).unwrap();
                timed.push(Box::new(
                    Dlm::new(name, Arc::new(backend), TTL).primitive(primitive),
                ));
            }
        }
        let mut counts = Vec::new();
        for (system, counted) in timed.iter().zip(&counted) {
            counts.push(
                (opts.wants(&system.name(), "uncontended") && system.name() != PUBSUB_MINIMAL)
                    .then(|| request_counts(counted.as_ref(), &proxies, &servers, Fenced::No)),
            );
        }
        // On one node, 8 contenders too, for the semaphore and the read-write lock (issue
        // #23) beside the mutex.
        let eight = (nodes == 1).then_some(Scenario::Contended {
            pause: None,
            threads: 8,
        });
        for scenario in scenarios.into_iter().chain(eight) {
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
                // A client that waits differently: nothing to show when nobody waits.
                .filter(|s| {
                    !(matches!(scenario, Scenario::Uncontended { .. })
                        && s.name() == PUBSUB_MINIMAL)
                })
                // The read-write rows: contended only (with a key per cycle they would be
                // the read hold's), each with its own number of threads.
                .filter(|s| {
                    let rw = s.name().contains("1 writer");
                    match scenario {
                        Scenario::Uncontended { .. } => !rw,
                        _ if s.name().contains("7 readers") => scenario.name() == "contended-8",
                        _ => !rw || scenario.name() != "contended-8",
                    }
                })
                // 8 contenders: the mutex beside the semaphore and the read-write lock.
                .filter(|s| {
                    scenario.name() != "contended-8"
                        || s.name() == "dlm"
                        || s.name().starts_with("dlm semaphore")
                        || s.name().starts_with("dlm rw")
                })
                // Uncontended only: 8 readers never wait for each other.
                .filter(|s| {
                    !(matches!(scenario, Scenario::Contended { .. }) && s.name() == "dlm read hold")
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
        // one more round trip), the minimal client, which does not fence (the bar: what a
        // lock costs), and the minimal client drawing a token in its acquisition (the
        // floor: what the draw itself costs).
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
        // And the minimal client drawing a token in its acquisition: the floor of any
        // design that draws on the server in the acquisition's round trip.
        let (floor_timed, floor_counted) = (
            Minimal::fenced(&urls, TTL),
            Minimal::fenced(&proxy_urls, TTL),
        );
        for (fenced, scenario_name) in [
            (Fenced::OneName, "fenced-use"),
            (Fenced::NewNames, "fenced-new-names"),
            (Fenced::NewNames, "fenced-new-names-warm"),
        ] {
            let warm = scenario_name == "fenced-new-names-warm";
            if warm {
                // Redlock only: one node has no commit round to save.
                if nodes == 1 || !opts.wants("dlm", scenario_name) {
                    continue;
                }
                warm_fencing_streams(&servers);
            }
            let fenced_use = |s: &&dyn LockSystem| {
                matches!(
                    s.name().as_str(),
                    "dlm" | "dlm (drawn when read)" | "minimal" | "minimal (fenced)"
                ) && opts.wants(&s.name(), scenario_name)
            };
            let fenced_counts: Vec<(String, Counts)> = counted
                .iter()
                .map(|s| s.as_ref())
                .chain([fenced_counted.as_ref(), &floor_counted as &dyn LockSystem])
                .filter(fenced_use)
                .map(|s| (s.name(), request_counts(s, &proxies, &servers, fenced)))
                .collect();
            for threads in [1, 8] {
                let scenario = if fenced == Fenced::OneName {
                    Scenario::FencedUse { threads }
                } else {
                    Scenario::FencedNewNames { threads, warm }
                };
                let chosen: Vec<&dyn LockSystem> = timed
                    .iter()
                    .map(|s| s.as_ref())
                    .chain([fenced_timed.as_ref(), &floor_timed as &dyn LockSystem])
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

/// Makes the fencing stream of every hash slot on each of `servers` (an ID from the
/// server's clock, the expiry dlm gives it), as on servers that have served holds of
/// some 100,000 names: the state the `fenced-new-names-warm` scenario starts from.
fn warm_fencing_streams(servers: &[&RedisServer]) {
    let (keys, ttl) = dlm_redis::bench_internals::fencing_streams();
    for server in servers {
        let mut con = server.connection();
        for chunk in keys.chunks(1024) {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.cmd("XADD")
                    .arg(key)
                    .arg("MAXLEN")
                    .arg(0)
                    .arg("*")
                    .arg("f")
                    .arg(1)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(key)
                    .arg(ttl.as_millis() as u64)
                    .ignore();
            }
            pipe.query::<()>(&mut con)
                .expect("warming the fencing streams");
        }
    }
}
