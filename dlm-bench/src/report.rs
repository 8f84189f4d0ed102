//! The report: one [`Row`] per system and scenario, its comparison base, and the
//! markdown table and JSON written from the rows.

use std::fmt::Write as _;
use std::time::Duration;

/// One row of results.
#[derive(Clone, Default)]
pub struct Row {
    pub system: String,
    pub scenario: &'static str,
    pub nodes: usize,
    pub threads: usize,
    pub cycles_per_sec: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub handoff_p50_us: Option<f64>,
    pub max_wait_us: Option<f64>,
    pub fairness: Option<f64>,
    pub requests_per_cycle: Option<f64>,
    pub commands_per_cycle: Option<f64>,
    pub new_connections_per_cycle: Option<f64>,
    /// The servers' CPU time (user + system, `INFO cpu`) per node per counted cycle.
    pub server_us_per_cycle: Option<f64>,
    pub ping_rtt_us: Option<f64>,
    /// Cycles per second of each round (the spread behind `cycles_per_sec`).
    pub round_rates: Vec<f64>,
    /// The system this row is compared with (same scenario and threads, any nodes),
    /// instead of the minimal client: for the replicated deployments.
    pub base: Option<&'static str>,
}

fn ratio(v: Option<f64>, base: Option<f64>) -> String {
    match (v, base) {
        (Some(v), Some(b)) if b > 0.0 => format!(" ({:.2}x)", v / b),
        _ => String::new(),
    }
}

/// The lowest and highest ratio of `rates` to `base` over rounds run side by side
/// (round k of one system against round k of the other); `None` below two rounds.
pub fn round_range(rates: &[f64], base: &[f64]) -> Option<(f64, f64)> {
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
pub const MINIMAL_ETCD: &str = "minimal (etcd gateway)";

/// The minimal client PostgreSQL's rows are compared with (a lease as a row of an
/// unlogged table: one upsert to acquire, one delete to release).
pub const MINIMAL_POSTGRES: &str = "minimal (postgres rows)";

/// The name of the minimal client `system` is compared with: the etcd gateway client for
/// etcd's rows, the rows client for PostgreSQL's, the Redis one for the others.
pub fn minimal_name(system: &str) -> &'static str {
    if system.contains("etcd") {
        MINIMAL_ETCD
    } else if system.contains("postgres") {
        MINIMAL_POSTGRES
    } else {
        "minimal"
    }
}

/// The row of the minimal client of `r`'s kind ([`minimal_name`]) with the same
/// scenario, nodes and threads as `r`.
pub fn minimal_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
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

pub fn markdown(rows: &[Row], rtt: f64, rounds: usize, run_for: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PING round trip p50: {rtt:.1} us. Each scenario: {rounds} interleaved round(s) of {run_for:?} per system. Ratios in parentheses: to the minimal client of the same scenario, nodes and threads (for etcd's rows: the minimal etcd gateway client; for PostgreSQL's rows: the minimal rows client; paused-minority: to the same system's uncontended row on the five healthy nodes; a master with a replica and the cluster: to dlm on the single server; their WAIT rows: to the same deployment without WAIT; the (metrics) rows, with a recorder installed: to the same system without one); by round: the lowest and highest ratio of cycles/s between rounds run side by side. Requests: round trips per node; commands: what they carried (pipelined commands share a round trip); server us: the servers' CPU time (INFO cpu, user + system) per node per cycle, over 2,000 cycles of one client.\n"
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

pub fn json(rows: &[Row]) -> String {
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

    #[test]
    fn postgres_rows_are_compared_with_the_minimal_rows_client_not_with_redis() {
        let rows = [
            row("minimal", 10_000.0),
            row("dlm", 9_000.0),
            row(MINIMAL_ETCD, 400.0),
            row("dlm (etcd)", 380.0),
            row(MINIMAL_POSTGRES, 2_000.0),
            row("dlm (postgres)", 1_900.0),
            row("advisory lock (postgres)", 3_000.0),
        ];
        for (system, base) in [
            ("dlm", "minimal"),
            ("dlm (etcd)", MINIMAL_ETCD),
            ("dlm (postgres)", MINIMAL_POSTGRES),
            ("advisory lock (postgres)", MINIMAL_POSTGRES),
            (MINIMAL_POSTGRES, MINIMAL_POSTGRES),
        ] {
            let r = rows.iter().find(|r| r.system == system).unwrap();
            assert_eq!(base_of(&rows, r).unwrap().system, base, "{system}");
        }
        let table = markdown(&rows, 50.0, 2, Duration::from_millis(500));
        let line = |prefix: &str| table.lines().find(|l| l.starts_with(prefix)).unwrap();
        let dlm = line("| dlm (postgres) ");
        assert!(dlm.contains("| 1900 (0.95x) | 0.95-0.95 |"), "{dlm}");
        let advisory = line("| advisory lock (postgres) ");
        assert!(advisory.contains("| 3000 (1.50x) |"), "{advisory}");
        let minimal = line("| minimal (postgres rows) ");
        assert!(minimal.contains("| 2000 (1.00x) | - |"), "{minimal}");
    }
}
