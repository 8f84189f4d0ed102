//! What `dlm run` adds around a command, against a local redis-server it starts: the time
//! from starting `dlm run` to the command starting, and from the command's exit to the
//! lock being free (`dlm` releases before it exits), each as a ratio to the same moments
//! of the bare command.
//!
//! ```text
//! cargo build --release -p dlm-cli && cargo run --release -p dlm-bench --bin cli_latency -- [RUNS]
//! ```
//! The command is `cat FIFO`: it starts when it opens the FIFO (our open for writing
//! returns then) and exits once we close it; the bare run is the same `cat`.

// A binary: nothing is exported.
#![allow(unreachable_pub)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlm_testkit::redis_server::RedisServer;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// One run of `cmd` (which must `cat` the FIFO): (spawn to start, close to exit).
fn once(mut cmd: Command, fifo: &Path) -> (Duration, Duration) {
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Blocks until the command opens the FIFO for reading: it has started.
    let writer = OpenOptions::new()
        .write(true)
        .open(fifo)
        .expect("open the FIFO");
    let started = t0.elapsed();
    let t1 = Instant::now();
    drop(writer); // EOF: cat exits
    let status = child.wait().expect("wait");
    let ended = t1.elapsed();
    assert!(status.success(), "{status}");
    (started, ended)
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map_or(200, |s| s.parse().expect("RUNS is a number"));
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let dlm = target.join("release/dlm");
    assert!(
        dlm.exists(),
        "{} is missing: cargo build --release -p dlm-cli",
        dlm.display()
    );
    let server = RedisServer::spawn();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());

    let bare = || {
        let mut c = Command::new("cat");
        c.arg(&fifo);
        c
    };
    let locked = || {
        let mut c = Command::new(&dlm);
        c.args([
            "run",
            "-n",
            "cli-latency",
            "--redis",
            &server.url(),
            "--",
            "cat",
        ])
        .arg(&fifo);
        c
    };
    // Warm-up (page cache, the server's scripts).
    for _ in 0..10 {
        once(bare(), &fifo);
        once(locked(), &fifo);
    }
    let (mut bare_start, mut bare_end, mut dlm_start, mut dlm_end) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (s, e) = once(bare(), &fifo);
        bare_start.push(s);
        bare_end.push(e);
        let (s, e) = once(locked(), &fifo);
        dlm_start.push(s);
        dlm_end.push(e);
    }
    let (bs, be, ds, de) = (
        median(bare_start),
        median(bare_end),
        median(dlm_start),
        median(dlm_end),
    );
    println!("{runs} runs each, interleaved; medians:");
    println!(
        "start:  bare cat {:>8.2?}  dlm run -- cat {:>8.2?}  ratio {:.2}x  (+{:.2?})",
        bs,
        ds,
        ds.as_secs_f64() / bs.as_secs_f64(),
        ds.saturating_sub(bs)
    );
    println!(
        "exit:   bare cat {:>8.2?}  dlm run -- cat {:>8.2?}  ratio {:.2}x  (+{:.2?}: the release and dlm's exit)",
        be,
        de,
        de.as_secs_f64() / be.as_secs_f64(),
        de.saturating_sub(be)
    );
}
