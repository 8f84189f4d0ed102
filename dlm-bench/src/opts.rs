//! The command line: the options (`--quick`, `--smoke`, `--only`, `--scenario`, `--nodes`,
//! `--rounds`, ...) and what they select.

use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Smoke,
    Quick,
    Full,
}

pub struct Opts {
    mode: Mode,
    pub peers: bool,
    pub json: Option<String>,
    /// Where to write the chart.
    pub svg: Option<String>,
    /// Only systems whose name contains this.
    only: Option<String>,
    /// Only this scenario.
    scenario: Option<String>,
    /// Only this many Redis nodes (1 or 5).
    pub nodes: Option<usize>,
    /// Rounds per scenario, instead of the mode's.
    pub rounds: Option<usize>,
    /// Only the election bench (`elections.rs`).
    pub elections: bool,
    /// Only the file backend's bench (`file.rs`).
    pub file: bool,
}

const USAGE: &str = "usage: dlm-bench [--quick | --smoke] [--no-peers] [--json FILE] [--svg FILE] \
[--only SYSTEM] [--scenario uncontended|contended|contended-8|handoff|paused-minority|fenced-use|fenced-new-names|fenced-new-names-warm] [--nodes 1|5] \
[--rounds N] [--elections] [--file]
--file runs the file backend's bench alone (uncontended, 1 and 8 threads and 8 processes, against a minimal flock client of the same protocol, and the hand-over; --rounds N: 5 by default).
--elections runs the election bench alone (hand-over and observe latency beside etcd's /v3/election; --rounds N: N of each, 200 by default).
--only SYSTEM[,SYSTEM...] runs the systems whose name contains one of them (e.g. \"dlm\", \"semaphore\", \"minimal\", \"etcd\", \"postgres\"), or is =NAME exactly (\"=dlm\").";

impl Opts {
    pub fn parse() -> Opts {
        let mut opts = Opts {
            mode: Mode::Full,
            peers: true,
            json: None,
            svg: None,
            only: None,
            scenario: None,
            nodes: None,
            rounds: None,
            elections: false,
            file: false,
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
                "--elections" => opts.elections = true,
                "--file" => opts.file = true,
                "--bench" => {} // passed by `cargo bench`
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => {
                    eprintln!("unknown argument {other:?}\n{USAGE}");
                    std::process::exit(2);
                }
            }
        }
        if opts.mode == Mode::Smoke {
            opts.peers = false;
        }
        opts
    }

    pub fn wants(&self, system: &str, scenario: &str) -> bool {
        self.only.as_ref().is_none_or(|o| {
            o.split(',').any(|o| match o.strip_prefix('=') {
                Some(exact) => system == exact,
                None => system.contains(o),
            })
        }) && self.scenario.as_ref().is_none_or(|s| s == scenario)
    }

    /// The election bench's rounds: `--rounds`, else 200 (20 with --smoke).
    pub fn election_rounds(&self) -> usize {
        self.rounds
            .unwrap_or(if self.mode == Mode::Smoke { 20 } else { 200 })
    }

    /// How many rounds each scenario runs, and how long each system runs per round.
    pub fn rounds(&self) -> (usize, Duration) {
        let (rounds, run_for) = match self.mode {
            Mode::Smoke => (1, Duration::from_millis(300)),
            Mode::Quick => (3, Duration::from_millis(500)),
            Mode::Full => (5, Duration::from_secs(1)),
        };
        (self.rounds.unwrap_or(rounds), run_for)
    }
}
