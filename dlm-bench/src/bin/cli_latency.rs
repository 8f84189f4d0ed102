//! What the `dlm` command adds around a command, against local redis-servers it starts,
//! side by side with `flock(1)` on the same machine in the same run: the time from
//! starting the process to the command starting, and from the command's exit to the
//! process's exit (for `dlm`: the lock released), each beside the bare command's.
//!
//! ```text
//! cargo build --release -p dlm-cli
//! cargo run --release -p dlm-bench --bin cli_latency -- [--runs N] [--dlm PATH]...
//! ```
//! The command is `cat FIFO`: it starts when it opens the FIFO (our open for writing
//! returns then) and exits once we close it. The systems run in interleaved rounds (bare,
//! flock, dlm on this machine (`--local`: no server, as flock), dlm on one server, dlm on
//! Redlock over three; each `--dlm PATH` adds the dlm rows for that binary, e.g. an
//! older build to compare with). CPU is the children's
//! user + system time from `/proc/self/stat` (clock ticks, averaged over the runs).

// A binary: nothing is exported.
#![allow(unreachable_pub)]

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::{RedisNodes, RedisServer};

const USAGE: &str =
    "usage: cli_latency [--runs N] [--dlm PATH]... (default: 200 runs, target/release/dlm)";

/// One system: how to start it around `cat FIFO`.
struct System {
    label: String,
    argv: Vec<String>,
    start: Vec<Duration>,
    exit: Vec<Duration>,
    /// The children's CPU time, in clock ticks, summed over the runs.
    cpu_ticks: u64,
}

fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort_unstable();
    // Nearest rank.
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The CPU time (user + system, in clock ticks) of the children waited for so far.
fn children_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name, which is in parentheses and may hold spaces:
    // cutime and cstime are fields 16 and 17 of the whole line.
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> u64 { fields[n - 3].parse().expect("a number") };
    field(16) + field(17)
}

/// One run of `argv` + FIFO (which must `cat` the FIFO): (spawn to start, close to exit).
fn once(argv: &[String], fifo: &Path) -> (Duration, Duration) {
    let t0 = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .arg(fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Blocks until the command opens the FIFO for reading: it has started. A command
    // that dies first (a binary that refuses an option) would leave this open blocked
    // for ever: a watcher waits for the child's exit without reaping it and then, if
    // the FIFO was not opened yet, opens its reading end itself.
    let opened = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (opened, fifo) = (opened.clone(), fifo.to_owned());
        let pid = rustix::process::Pid::from_child(&child);
        std::thread::spawn(move || {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::Pid(pid),
                rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
            );
            if !opened.load(Ordering::Acquire) {
                let _ = OpenOptions::new()
                    .read(true)
                    .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                    .open(&fifo);
            }
        })
    };
    let writer = OpenOptions::new()
        .write(true)
        .open(fifo)
        .expect("open the FIFO");
    opened.store(true, Ordering::Release);
    let started = t0.elapsed();
    let t1 = Instant::now();
    drop(writer); // EOF: cat exits
    let status = child.wait().expect("wait");
    let ended = t1.elapsed();
    let _ = watcher.join();
    assert!(status.success(), "{argv:?}: {status}");
    (started, ended)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut runs = 200usize;
    let mut dlms: Vec<PathBuf> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).expect(USAGE),
            "--dlm" => dlms.push(args.next().expect(USAGE).into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            n if n.parse::<usize>().is_ok() => runs = n.parse().expect("checked"),
            _ => panic!("{USAGE}"),
        }
    }
    if dlms.is_empty() {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| PathBuf::from("target"), PathBuf::from);
        dlms.push(target.join("release/dlm"));
    }
    for dlm in &dlms {
        assert!(
            dlm.exists(),
            "{} is missing: cargo build --release -p dlm-cli",
            dlm.display()
        );
    }
    let flock = which("flock").expect("flock(1) (util-linux) is needed as the anchor");
    let server = RedisServer::spawn();
    let nodes = RedisNodes::spawn(3);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let lock_file = dir.path().join("flock");

    let s = |label: String, argv: Vec<String>| System {
        label,
        argv,
        start: Vec::new(),
        exit: Vec::new(),
        cpu_ticks: 0,
    };
    let mut systems = vec![
        s("cat (bare)".into(), vec!["cat".into()]),
        s(
            "flock -n FILE cat".into(),
            vec![
                flock.display().to_string(),
                "-n".into(),
                lock_file.display().to_string(),
                "cat".into(),
            ],
        ),
    ];
    let redlock_urls = nodes.urls().join(",");
    for (i, dlm) in dlms.iter().enumerate() {
        let tag = if dlms.len() > 1 {
            format!(" [{i}]")
        } else {
            String::new()
        };
        let local_dir = dir.path().join("dlm-locks");
        systems.push(s(
            format!("dlm run -n (--local){tag}"),
            vec![
                dlm.display().to_string(),
                "run".into(),
                "-n".into(),
                "cli-latency".into(),
                "--dir".into(),
                local_dir.display().to_string(),
                "--".into(),
                "cat".into(),
            ],
        ));
        for (what, urls) in [
            ("1 server", server.url()),
            ("Redlock-3", redlock_urls.clone()),
        ] {
            systems.push(s(
                format!("dlm run -n ({what}){tag}"),
                vec![
                    dlm.display().to_string(),
                    "run".into(),
                    "-n".into(),
                    "cli-latency".into(),
                    "--redis".into(),
                    urls,
                    "--".into(),
                    "cat".into(),
                ],
            ));
        }
    }
    // Warm-up (page cache, the servers' scripts).
    for _ in 0..10 {
        for system in &systems {
            once(&system.argv, &fifo);
        }
    }
    let ticks_per_sec = 100.0; // USER_HZ on Linux
    for round in 0..runs {
        // Interleaved, starting with another system each round.
        let n = systems.len();
        for k in 0..n {
            let system = &mut systems[(round + k) % n];
            let cpu = children_cpu_ticks();
            let (start, exit) = once(&system.argv, &fifo);
            system.cpu_ticks += children_cpu_ticks() - cpu;
            system.start.push(start);
            system.exit.push(exit);
        }
    }
    for dlm in &dlms {
        println!(
            "[{}] {}",
            dlms.iter().position(|d| d == dlm).unwrap_or(0),
            dlm.display()
        );
    }
    println!(
        "{runs} runs each, interleaved; milliseconds (median / p90); over = minus the bare command's median"
    );
    println!(
        "{:<30} {:>15} {:>8} {:>15} {:>8} {:>9}",
        "system", "start", "over", "exit", "over", "CPU/run"
    );
    let (bare_start, bare_exit) = (
        quantile(&systems[0].start, 0.5),
        quantile(&systems[0].exit, 0.5),
    );
    for system in &systems {
        let (s50, s90) = (quantile(&system.start, 0.5), quantile(&system.start, 0.9));
        let (e50, e90) = (quantile(&system.exit, 0.5), quantile(&system.exit, 0.9));
        println!(
            "{:<30} {:>6.2} / {:>6.2} {:>+8.2} {:>6.2} / {:>6.2} {:>+8.2} {:>9.2}",
            system.label,
            ms(s50),
            ms(s90),
            ms(s50) - ms(bare_start),
            ms(e50),
            ms(e90),
            ms(e50) - ms(bare_exit),
            system.cpu_ticks as f64 / ticks_per_sec * 1e3 / runs as f64,
        );
    }
}

/// The path of `program` on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
