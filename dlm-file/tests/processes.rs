//! Real processes on one directory: this test binary runs itself as the children (the
//! `child` test, ignored in a normal run, with `DLM_FILE_CHILD` saying what to do).
//! Times cross processes as the machine's monotonic clock (`CLOCK_MONOTONIC`, which every
//! process shares), in ns.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_file::FileBackend;

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap()
}

/// What a child does, from `DLM_FILE_CHILD` (`MODE DIR NAME [N]`):
/// - `contend DIR NAME N`: takes NAME N times; prints `hold START END TOKEN` per hold;
/// - `hold DIR NAME`: takes NAME, prints `held TOKEN`, waits for its stdin to end;
/// - `wait DIR NAME`: makes one attempt (prints `refused` or `took`), then takes NAME and
///   prints `acquired AT TOKEN`.
#[test]
#[ignore = "a child process of the other tests (run with DLM_FILE_CHILD)"]
fn child() {
    let spec = std::env::var("DLM_FILE_CHILD").expect("DLM_FILE_CHILD: run by the other tests");
    let args: Vec<&str> = spec.split(' ').collect();
    let client = LockClient::builder(FileBackend::new(args[1]).unwrap())
        .watchdog_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = client.get_lock(args[2]).unwrap();
    let kind = std::env::var("DLM_FILE_KIND").unwrap_or_else(|_| "mutex".into());
    let mut out = std::io::stdout().lock();
    match args[0] {
        "contend" => {
            for i in 0..args[3].parse::<u32>().unwrap() {
                let asked = now_ns();
                // `rw`: every fourth hold writes, the others read.
                let (guard, what) = match kind.as_str() {
                    "mutex" => (lock.lock().unwrap(), "hold"),
                    "permit" => (
                        client.get_semaphore(args[2], 3).unwrap().acquire().unwrap(),
                        "hold",
                    ),
                    "rw" if i % 4 == 0 => (
                        client
                            .get_rw_lock(args[2])
                            .unwrap()
                            .write()
                            .unwrap()
                            .into_guard(),
                        "write",
                    ),
                    "rw" => (client.get_rw_lock(args[2]).unwrap().read().unwrap(), "read"),
                    other => panic!("unknown kind {other}"),
                };
                let start = now_ns();
                let token = guard.fencing_token().unwrap();
                if kind != "mutex" {
                    // Long enough for holds of other processes to overlap.
                    std::thread::sleep(Duration::from_micros(300));
                }
                let end = now_ns();
                writeln!(out, "{what} {asked} {start} {end} {token}").unwrap();
                guard.unlock().unwrap();
            }
        }
        "hold" | "wait" => {
            // The lock, or (`permit`) the one permit of a semaphore: one attempt, or a
            // wait.
            let sem = client.get_semaphore(args[2], 1).unwrap();
            let take = |wait: bool| match (kind.as_str(), wait) {
                ("permit", true) => Some(sem.acquire().unwrap()),
                ("permit", false) => sem.try_acquire().unwrap(),
                (_, true) => Some(lock.lock().unwrap()),
                (_, false) => lock.try_lock().unwrap(),
            };
            if args[0] == "hold" {
                let guard = take(true).unwrap();
                writeln!(out, "held {}", guard.fencing_token().unwrap()).unwrap();
                out.flush().unwrap();
                let _ = std::io::stdin().lines().count();
                drop(guard);
                return;
            }
            let first = take(false);
            writeln!(out, "{}", if first.is_some() { "took" } else { "refused" }).unwrap();
            out.flush().unwrap();
            let guard = first.or_else(|| take(true)).unwrap();
            let at = now_ns();
            writeln!(out, "acquired {at} {}", guard.fencing_token().unwrap()).unwrap();
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// A child's lines, read on a thread of their own so that a child that never answers
/// fails the test instead of hanging it.
struct Lines(crossbeam_channel::Receiver<String>);

fn spawn(spec: &str) -> (Child, Lines) {
    spawn_kind(spec, "mutex")
}

/// A child taking holds of `kind` (`mutex`, `permit` or `rw`).
fn spawn_kind(spec: &str, kind: &str) -> (Child, Lines) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DLM_FILE_CHILD", spec)
        .env("DLM_FILE_KIND", kind)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, Lines(rx))
}

/// The part of `line` from `prefix` on: the child's own words (the test harness prints
/// `test child ... ` before the first of them, on the same line).
fn own(line: &str, prefix: &str) -> Option<String> {
    line.find(prefix).map(|i| line[i..].trim_end().to_owned())
}

/// The child's next line of its own that starts with `prefix` (within 60 s).
fn next_line(out: &mut Lines, prefix: &str) -> String {
    loop {
        let line = out
            .0
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no {prefix:?} from the child: {e}"));
        if let Some(own) = own(&line, prefix) {
            return own;
        }
    }
}

/// Every line of its own that starts with `prefix`, until the child's output ends.
fn all_lines(out: &mut Lines, prefix: &str) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        match out.0.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => lines.extend(own(&line, prefix)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return lines,
            Err(e) => panic!("the child's output did not end: {e}"),
        }
    }
}

#[test]
fn eight_processes_contending_never_overlap_and_tokens_follow_the_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    FileBackend::new(&dir).unwrap();
    const EACH: usize = 40;
    let children: Vec<_> = (0..8)
        .map(|_| spawn(&format!("contend {} shared {EACH}", dir.display())))
        .collect();
    let mut holds: Vec<(u64, u64, u64)> = Vec::new();
    for (mut child, mut out) in children {
        for line in all_lines(&mut out, "hold ") {
            let f: Vec<u64> = line[5..].split(' ').map(|x| x.parse().unwrap()).collect();
            holds.push((f[1], f[2], f[3])); // asked, start, end, token
        }
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(holds.len(), 8 * EACH);
    holds.sort();
    for w in holds.windows(2) {
        let ((_, end, token), (start, _, next_token)) = (w[0], w[1]);
        assert!(
            end < start,
            "two processes held the lock at once: {:?} and {:?}",
            w[0],
            w[1]
        );
        assert!(
            token < next_token,
            "tokens out of order: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files,
        vec![std::ffi::OsString::from(".tokens")],
        "no lock file left"
    );
}

/// One hold a child made: what kind, when it was asked for, when it was held from (after
/// the grant) and to (before the release), its token.
#[derive(Debug)]
struct Hold {
    what: String,
    asked: u64,
    start: u64,
    end: u64,
    token: u64,
}

/// The holds 8 processes of `kind` made, 40 each, sorted by start; and the files left in
/// the directory.
fn contend(kind: &str) -> (Vec<Hold>, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    FileBackend::new(&dir).unwrap();
    let children: Vec<_> = (0..8)
        .map(|_| spawn_kind(&format!("contend {} shared 40", dir.display()), kind))
        .collect();
    let mut holds = Vec::new();
    for (mut child, mut out) in children {
        for line in all_lines(&mut out, "") {
            // The harness may print `test child ... ` before the first line.
            let Some(at) = ["hold ", "read ", "write "]
                .iter()
                .filter_map(|p| line.find(p))
                .min()
            else {
                continue;
            };
            let f: Vec<&str> = line[at..].split(' ').collect();
            let n: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
            holds.push(Hold {
                what: f[0].to_owned(),
                asked: n[0],
                start: n[1],
                end: n[2],
                token: n[3],
            });
        }
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(holds.len(), 8 * 40);
    holds.sort_by_key(|h| h.start);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    (holds, files)
}

/// The holds of `holds` that overlap `h` (itself excluded).
fn overlapping<'a>(holds: &'a [Hold], h: &'a Hold) -> impl Iterator<Item = &'a Hold> {
    holds
        .iter()
        .filter(move |o| !std::ptr::eq(*o, h) && o.start < h.end && h.start < o.end)
}

#[test]
fn eight_processes_on_a_semaphore_never_exceed_its_permits() {
    let (holds, files) = contend("permit");
    let mut most = 0;
    for h in &holds {
        // The holds that began before h and still hold when it begins: at most 2.
        let at_start = overlapping(&holds, h)
            .filter(|o| o.start <= h.start)
            .count();
        most = most.max(at_start + 1);
        assert!(
            at_start < 3,
            "{} holders at once of a 3-permit semaphore at {h:?}",
            at_start + 1
        );
        // A permit's token is above every token of the holds that ended before it was
        // asked for (its grant came later; its start is known only after the grant).
        for o in holds.iter().filter(|o| o.end < h.asked) {
            assert!(o.token < h.token, "token of {h:?} after {o:?}");
        }
    }
    assert!(most >= 2, "the permits were never shared ({most} at most)");
    assert_eq!(files, vec![".tokens".to_owned()], "no lock file left");
}

#[test]
fn eight_processes_on_a_read_write_lock_never_write_beside_anyone() {
    let (holds, files) = contend("rw");
    // Hand-overs are woken, never waited out: the longest gap between two holds is
    // far below a lease (2 s) or a writer's mark.
    let gap = holds
        .windows(2)
        .map(|w| w[1].start.saturating_sub(w[0].end))
        .max()
        .unwrap();
    assert!(
        gap < 500_000_000,
        "a {} ms gap between holds",
        gap / 1_000_000
    );
    let mut shared = 0;
    for h in &holds {
        let others: Vec<_> = overlapping(&holds, h).collect();
        if h.what == "write" {
            assert!(
                others.is_empty(),
                "a write beside other holds: {h:?} {others:?}"
            );
        } else {
            assert!(
                others.iter().all(|o| o.what == "read"),
                "a read beside a write: {h:?} {others:?}"
            );
            shared += usize::from(!others.is_empty());
        }
        // Every hold's token is above the tokens of the writes that ended before it was
        // asked for.
        for o in holds
            .iter()
            .filter(|o| o.what == "write" && o.end < h.asked)
        {
            assert!(o.token < h.token, "token of {h:?} after a write's {o:?}");
        }
    }
    assert!(shared > 0, "readers never shared the lock");
    assert_eq!(files, vec![".tokens".to_owned()], "no lock file left");
}

#[test]
fn a_killed_holders_lock_goes_to_the_next_waiter_at_once() {
    killed_holder_hands_over("mutex");
}

#[test]
fn a_killed_holders_permit_goes_to_the_next_waiter_at_once() {
    killed_holder_hands_over("permit");
}

fn killed_holder_hands_over(kind: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    FileBackend::new(&dir).unwrap();
    let mut gaps = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..10 {
        let (mut holder, mut held) = spawn_kind(&format!("hold {} job", dir.display()), kind);
        let token: u64 = next_line(&mut held, "held ")[5..].parse().unwrap();
        let (mut waiter, mut waited) = spawn_kind(&format!("wait {} job", dir.display()), kind);
        assert_eq!(next_line(&mut waited, "refused").as_str(), "refused");
        let killed = now_ns();
        holder.kill().unwrap();
        let line = next_line(&mut waited, "acquired ");
        let f: Vec<u64> = line[9..].split(' ').map(|x| x.parse().unwrap()).collect();
        gaps.push(Duration::from_nanos(f[0].saturating_sub(killed)));
        tokens.push((token, f[1]));
        holder.wait().unwrap();
        assert!(waiter.wait().unwrap().success());
    }
    gaps.sort();
    eprintln!("{kind}: from SIGKILL to the waiter holding it: {gaps:?}");
    let median = gaps[gaps.len() / 2];
    assert!(
        median < Duration::from_millis(10),
        "median {median:?}: {gaps:?}"
    );
    for (killed, next) in &tokens {
        assert!(
            killed < next,
            "the next holder's token {next} is not above the killed one's {killed}"
        );
    }
    for w in tokens.windows(2) {
        assert!(
            w[0].1 < w[1].0,
            "tokens went back across processes: {tokens:?}"
        );
    }
}

#[test]
fn tokens_increase_across_crashes_and_new_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    FileBackend::new(&dir).unwrap();
    let mut last = 0;
    for round in 0..12 {
        let (mut child, mut out) = spawn(&format!("hold {} t", dir.display()));
        let token: u64 = next_line(&mut out, "held ")[5..].parse().unwrap();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        if round % 2 == 0 {
            child.kill().unwrap(); // a crash while holding
        } else {
            drop(child.stdin.take()); // a release
        }
        child.wait().unwrap();
    }
    // And this process, after all of them.
    let guard = LockClient::new(FileBackend::new(&dir).unwrap())
        .get_lock("t")
        .unwrap()
        .lock()
        .unwrap();
    assert!(guard.fencing_token().unwrap().get() > last);
}

#[test]
fn a_stopped_holder_keeps_its_lock_past_its_lease() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let (mut holder, mut out) = spawn(&format!("hold {} paused", dir.display()));
    let pid = holder.id().to_string();
    next_line(&mut out, "held ");
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Past its 2 s watchdog lease, by time (the point of the test), stopped all along.
    let stopped = Instant::now();
    let client = LockClient::new(FileBackend::new(&dir).unwrap());
    let lock = client.get_lock("paused").unwrap();
    while stopped.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        lock.try_lock().unwrap().is_none(),
        "a stopped process keeps its kernel lock: nothing outside it can end it"
    );
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
    assert!(
        lock.try_lock_timeout(Duration::from_secs(10))
            .unwrap()
            .is_some()
    );
}
