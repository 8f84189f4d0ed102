//! `dlm-bench --file`: the file backend beside a minimal client of the same mechanism, in
//! interleaved rounds of one run:
//! - `dlm (file)`: `FileBackend` through the front (a fixed 30 s lease: no watchdog), lock
//!   and unlock of a name of its own per thread (uncontended);
//! - `minimal (flock, same protocol)`: what dlm-file does for one cycle of a name locked
//!   again and again (its file kept between holds), written directly:
//!   `openat(O_CREAT | O_NOFOLLOW)`, `flock(LOCK_EX | LOCK_NB)`, `fstat` (a regular
//!   file of this user, still linked), the lease end written into the file; at the
//!   release `fstat` (still linked), `LOCK_UN` and `close`. Ratios are to this row;
//! - `the same, the file made and removed per hold`: what dlm-file does for a name used
//!   once (the release looks the path up, and `unlinkat` before the close);
//! - `open + flock + close, file kept`: what `flock(1)` does per run (no check, no
//!   removal: a file per name ever locked stays);
//! - `flock on a kept file`: `flock` and `LOCK_UN` on a file opened once, for scale (no
//!   release by removal, no check: the floor of any flock lock).
//!
//! The same two first rows with 8 processes (this binary run as children, a name each).
//!
//! And the hand-over between two backends (as two processes would be): the time from the
//! release's call to the waiting client's lock returning, p50 and p99.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_file::FileBackend;
use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};

/// Opens (making it if need be) and locks `name` in `dir`, without following links.
fn open_and_lock(dir: &OwnedFd, name: &str) -> OwnedFd {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).unwrap();
    fd
}

/// The hold's part of dlm-file's protocol: the locked file is checked (one `fstat`: a
/// regular file of this user, still linked: not removed by a release meanwhile), and the
/// lease end is written into it.
fn check_and_stamp(fd: &OwnedFd) {
    let locked = rustix::fs::fstat(fd).unwrap();
    assert!(locked.st_nlink > 0 && locked.st_mode & 0o170_000 == 0o100_000);
    rustix::io::pwrite(fd, &0i64.to_le_bytes(), 0).unwrap();
}

/// One cycle of the minimal client on `name` in the directory `dir`: what dlm-file does
/// for a hot name (its file kept between holds): open, lock, check the locked file, write
/// the lease end; at the release, check that it still has a link, unlock, close.
fn minimal_cycle(dir: &OwnedFd, name: &str) {
    let fd = open_and_lock(dir, name);
    check_and_stamp(&fd);
    assert!(rustix::fs::fstat(&fd).unwrap().st_nlink > 0);
    rustix::fs::flock(&fd, FlockOperation::Unlock).unwrap();
}

/// The same with the file made and removed at each hold (what dlm-file does for a name
/// used once).
fn made_and_removed_cycle(dir: &OwnedFd, name: &str) {
    let fd = open_and_lock(dir, name);
    check_and_stamp(&fd);
    let locked = rustix::fs::fstat(&fd).unwrap();
    let at = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    assert_eq!((locked.st_dev, locked.st_ino), (at.st_dev, at.st_ino));
    rustix::fs::unlinkat(dir, name, AtFlags::empty()).unwrap();
}

/// flock(1)'s way: open the file (made once, kept), lock it, close it (which unlocks).
fn open_lock_close_cycle(dir: &OwnedFd, name: &str) {
    drop(open_and_lock(dir, name));
}

fn kept_cycle(fd: &OwnedFd) {
    rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive).unwrap();
    rustix::fs::flock(fd, FlockOperation::Unlock).unwrap();
}

/// Cycles per second of `threads` threads running `cycle(thread)` for `run_for`.
fn throughput(threads: usize, run_for: Duration, cycle: impl Fn(usize) + Sync) -> f64 {
    let count = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let elapsed = thread::scope(|s| {
        for t in 0..threads {
            let (count, stop, start, cycle) = (&count, &stop, &start, &cycle);
            s.spawn(move || {
                start.wait();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    cycle(t);
                    n += 1;
                }
                count.fetch_add(n, Ordering::Relaxed);
            });
        }
        start.wait();
        let began = Instant::now();
        thread::sleep(run_for);
        stop.store(true, Ordering::Relaxed);
        began.elapsed()
    });
    count.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

/// The environment variable that makes `dlm-bench` a child process of the 8-process rows:
/// `MODE DIR START_NS RUN_MS INDEX` (MODE `dlm` or `minimal`; START_NS on the monotonic
/// clock, which every process shares).
pub const CHILD: &str = "DLM_BENCH_FILE_CHILD";

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap()
}

/// A child of the 8-process rows: from START_NS, cycles on a name of its own for RUN_MS;
/// prints how many.
pub fn child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let (mode, path, start, run_ms, index) = (
        f[0],
        f[1],
        f[2].parse::<u64>().unwrap(),
        f[3].parse::<u64>().unwrap(),
        f[4],
    );
    let name = format!("{mode}-p{index}");
    let client = LockClient::builder(FileBackend::new(path).unwrap())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.get_lock(&name).unwrap();
    let dir = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let now = monotonic_ns();
    thread::sleep(Duration::from_nanos(start.saturating_sub(now)));
    let end = start + run_ms * 1_000_000;
    let mut n = 0u64;
    while monotonic_ns() < end {
        if mode == "dlm" {
            lock.lock().unwrap().unlock().unwrap();
        } else {
            minimal_cycle(&dir, &name);
        }
        n += 1;
    }
    println!("{n}");
}

/// Cycles per second of 8 processes running `mode`'s cycle for `run_for`, each on a name
/// of its own, started together.
fn processes(mode: &str, path: &std::path::Path, run_for: Duration) -> f64 {
    let start = monotonic_ns() + 300_000_000;
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..8)
        .map(|i| {
            std::process::Command::new(&me)
                .env(
                    CHILD,
                    format!(
                        "{mode} {} {start} {} {i}",
                        path.display(),
                        run_for.as_millis()
                    ),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let total: u64 = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    total as f64 / run_for.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the file bench and prints its tables.
pub fn run(rounds: usize) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let path = tmp.path().join("locks");
    let backend = FileBackend::builder(&path)
        .build()
        .expect("the lock directory");
    let client = LockClient::builder(backend.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let dir = rustix::fs::open(
        &path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let kept: Vec<OwnedFd> = (0..8)
        .map(|t| {
            rustix::fs::openat(
                &dir,
                format!("kept-{t}").as_str(),
                OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap()
        })
        .collect();
    let locks: Vec<_> = (0..8)
        .map(|t| client.get_lock(&format!("bench-{t}")).unwrap())
        .collect();
    let run_for = Duration::from_millis(500);
    println!(
        "File backend: uncontended lock + unlock, a name per thread; {rounds} interleaved rounds of {run_for:?}; cycles/s, median of the rounds (ratio to the minimal client)."
    );
    println!("| system | threads | cycles/s | ratio |");
    println!("|---|---|---|---|");
    for threads in [1, 8] {
        let (mut dlm, mut minimal, mut floor) = (Vec::new(), Vec::new(), Vec::new());
        let mut flock1 = Vec::new();
        let mut removed = Vec::new();
        for _ in 0..rounds {
            dlm.push(throughput(threads, run_for, |t| {
                locks[t].lock().unwrap().unlock().unwrap();
            }));
            minimal.push(throughput(threads, run_for, |t| {
                minimal_cycle(&dir, &format!("minimal-{t}"));
            }));
            removed.push(throughput(threads, run_for, |t| {
                made_and_removed_cycle(&dir, &format!("removed-{t}"));
            }));
            flock1.push(throughput(threads, run_for, |t| {
                open_lock_close_cycle(&dir, &format!("flock1-{t}"));
            }));
            floor.push(throughput(threads, run_for, |t| kept_cycle(&kept[t])));
        }
        let base = median(minimal.clone());
        for (system, v) in [
            ("dlm (file)", dlm),
            ("minimal (flock, same protocol)", minimal),
            ("the same, the file made and removed per hold", removed),
            ("open + flock + close, file kept (flock(1)'s way)", flock1),
            ("flock on a kept file", floor),
        ] {
            let m = median(v);
            println!("| {system} | {threads} | {m:.0} | {:.2}x |", m / base);
        }
    }
    // 8 processes, a name each.
    let (mut dlm, mut minimal) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        dlm.push(processes("dlm", &path, run_for));
        minimal.push(processes("minimal", &path, run_for));
    }
    let base = median(minimal.clone());
    for (system, v) in [
        ("dlm (file), 8 processes", dlm),
        ("minimal (flock, same protocol), 8 processes", minimal),
    ] {
        let m = median(v);
        println!("| {system} | 8 | {m:.0} | {:.2}x |", m / base);
    }
    // Hand-over between two backends of one directory.
    let (a, b) = (
        LockClient::new(FileBackend::new(&path).unwrap()),
        LockClient::new(FileBackend::new(&path).unwrap()),
    );
    let mut samples = Vec::new();
    for i in 0..rounds * 50 {
        let (holder, next) = if i % 2 == 0 {
            (&a, b.clone())
        } else {
            (&b, a.clone())
        };
        let held = holder.get_lock("handover").unwrap().lock().unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let g = next.get_lock("handover").unwrap().lock().unwrap();
            tx.send(Instant::now()).unwrap();
            drop(g);
        });
        // A settle, so that the other client waits (it is woken by the release either way).
        thread::sleep(Duration::from_millis(10));
        let released = Instant::now();
        held.unlock().unwrap();
        samples.push(rx.recv().unwrap() - released);
        waiter.join().unwrap();
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "Hand-over between two backends of one directory (as two processes): p50 {:?}, p99 {:?} ({} hand-overs).",
        pct(0.5),
        pct(0.99),
        samples.len()
    );
    drop(kept);
}
