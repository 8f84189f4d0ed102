//! The real `dlm` binary against real redis-servers (the testkit's, on free loopback
//! ports, killed when dropped): mutual exclusion (single and Redlock over 3), the waiting
//! flags, exit statuses and the command's environment, signals, lost locks, bad input,
//! secrets, `status --json`, `unlock --force`, and `--cluster`, `--sentinel` and
//! `--wait-replicas`.
//!
//! Timing-sensitive: every test takes `SERIAL`, so they run one at a time even without
//! `--test-threads=1`, with wide margins (CI machines have 2 cores). Every `dlm` is waited
//! for with a deadline and killed if the test ends first; the command's own processes are
//! killed by a `Reaper` when they are not `dlm`'s to kill.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    Clock, Json, Proc, Reaper, SERIAL, alive, children_of, dlm, held, read, read_pid, run, server,
    wait_until,
};
use dlm_redis::redis;
use dlm_testkit::history::{History, Hold};
use dlm_testkit::redis_server::{RedisNodes, RedisServer, require_redis_server};

const SECOND: Duration = Duration::from_secs(1);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A shell-quoted path.
fn q(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

/// `DEL`s lock `name`'s key by hand (`dlm:{name}`, see dlm-redis's crate docs), asserting
/// it was there.
fn delete_key(server: &RedisServer, name: &str) {
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(deleted, 1, "no key dlm:{{{name}}}: is that the lock's key?");
}

/// Waits until a waiter has marked lock `name` (dlm-redis appends `~` to the holder's
/// value once a waiter waits for its release): the waiter is past its first attempt and
/// waiting.
fn wait_for_a_waiter(server: &RedisServer, name: &str) {
    let mut con = server.connection();
    wait_until(Duration::from_secs(10), "a waiter to wait", || {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("dlm:{{{name}}}"))
            .query(&mut con)
            .unwrap();
        v.is_some_and(|v| v.ends_with('~'))
    });
}

/// `dlm run -n NAME -- true`: 0 when it got the lock, 1 when it is held.
fn try_once(urls: &str, name: &str) -> i32 {
    let code = run(dlm().args(["run", "-n", "--redis", urls, name, "--", "true"])).code();
    assert!(code == 0 || code == 1, "dlm run -n exited {code}");
    code
}

// --- 1. Mutual exclusion -------------------------------------------------------------

const PROCESSES: usize = 4;
const ROUNDS: usize = 5;

/// Runs `PROCESSES` sequences of `ROUNDS` critical sections concurrently, each one the
/// command `launch(script)` gives: the script appends a start line, its token and an end
/// line to one file (`date +%s%N` readings on the start and end lines), with a sleep
/// inside. Returns the file's text.
fn critical_sections(launch: impl Fn(&str) -> std::process::Command + Sync) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo \"start $ID $(date +%s%N)\" >> {f}; echo \"token $ID $DLM_FENCING_TOKEN\" >> {f}; \
         sleep 0.05; echo \"end $ID $(date +%s%N)\" >> {f}",
        f = q(&log)
    );
    let started = Instant::now();
    std::thread::scope(|s| {
        for p in 0..PROCESSES {
            let (script, launch) = (&script, &launch);
            s.spawn(move || {
                for i in 0..ROUNDS {
                    run(launch(script).env("ID", format!("{p}.{i}"))).expect(0);
                }
            });
        }
    });
    eprintln!(
        "{} critical sections in {:?}",
        PROCESSES * ROUNDS,
        started.elapsed()
    );
    read(&log)
}

/// What the file of [`critical_sections`] shows: the holds (from the start and end lines'
/// readings, as `Instant`s), the tokens in file order, and whether two sections interleave
/// in file order.
fn sections(text: &str, clock: &Clock) -> (History, Vec<u64>, bool) {
    let history = History::new();
    let mut tokens = Vec::new();
    let mut interleaved = false;
    let mut open = std::collections::HashMap::new();
    let mut current = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 3, "bad line {line:?} in\n{text}");
        let (what, id) = (f[0], f[1]);
        match what {
            "start" => {
                interleaved |= current.is_some();
                current = Some(id);
                assert!(
                    open.insert(id, (clock.at(f[2]), None)).is_none(),
                    "{id} ran twice\n{text}"
                );
            }
            "token" => {
                interleaved |= current != Some(id);
                let t: u64 = f[2]
                    .parse()
                    .unwrap_or_else(|_| panic!("DLM_FENCING_TOKEN {:?} is not a number", f[2]));
                tokens.push(t);
                open.get_mut(id).expect("a token before its start").1 = Some(t);
            }
            "end" => {
                interleaved |= current != Some(id);
                current = None;
                let (from, token) = open.remove(id).expect("an end before its start");
                history.push(Hold::new("mutex", id, from, clock.at(f[2]), token));
            }
            _ => panic!("bad line {line:?} in\n{text}"),
        }
    }
    assert!(open.is_empty(), "sections never ended: {open:?}\n{text}");
    assert_eq!(history.len(), PROCESSES * ROUNDS, "{text}");
    (history, tokens, interleaved)
}

/// 4 processes run `dlm run` 5 times each, concurrently, on one lock: in file order the
/// critical sections never interleave and the tokens strictly increase; with the `date`
/// readings as windows (wall clock mapped to `Instant`s), the history checker finds no
/// overlap and no token out of order.
fn mutual_exclusion(urls: &str) {
    let clock = Clock::now();
    let text = critical_sections(|script| {
        let mut c = dlm();
        c.args(["run", "--redis", urls, "mutex", "-c", script]);
        c
    });
    let (history, tokens, interleaved) = sections(&text, &clock);
    assert!(!interleaved, "critical sections interleave:\n{text}");
    history.check().assert_clean();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing in file order: {tokens:?}"
    );
}

/// The negative control: the same sections without `dlm` (plain `sh -c`, token 0)
/// do overlap, and both checks see it.
#[test]
fn the_overlap_checks_see_sections_run_without_dlm() {
    let _serial = SERIAL.lock();
    let clock = Clock::now();
    let text = critical_sections(|script| {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", script])
            .env("DLM_FENCING_TOKEN", "0")
            .stdin(std::process::Stdio::null());
        c
    });
    let (history, _, interleaved) = sections(&text, &clock);
    assert!(interleaved, "unlocked sections did not interleave:\n{text}");
    assert!(history.check().has_overlap(), "no overlap seen:\n{text}");
}

#[test]
fn concurrent_runs_never_overlap_and_tokens_increase_single() {
    let _serial = SERIAL.lock();
    let server = server();
    mutual_exclusion(&server.url());
}

#[test]
fn concurrent_runs_never_overlap_and_tokens_increase_redlock3() {
    let _serial = SERIAL.lock();
    require_redis_server();
    let nodes = RedisNodes::spawn(3);
    mutual_exclusion(&nodes.urls().join(","));
}

// --- 2. Waiting flags ----------------------------------------------------------------

/// With the lock held: `-n` fails at once, `-w 1` after about a second, `-E 75` changes
/// the status. SIGTERM to the holder: forwarded to `sleep`, the lock released.
#[test]
fn no_wait_wait_and_conflict_status_while_held() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let mut holder =
        Proc::spawn(dlm().args(["run", "--redis", &url, "flags", "--", "sleep", "30"]));
    wait_until(Duration::from_secs(10), "the holder to hold", || {
        held(&url, "flags").is_some()
    });
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let attempt = |flags: &[&str]| {
        run(dlm()
            .arg("run")
            .args(flags)
            .args(["--redis", &url, "flags", "-c"])
            .arg(format!("echo ran >> {}", q(&ran))))
    };

    let no_wait = attempt(&["-n"]);
    no_wait.expect(1);
    assert!(no_wait.took < 2 * SECOND, "-n took {:?}", no_wait.took);

    let wait = attempt(&["-w", "1"]);
    wait.expect(1);
    assert!(
        wait.took >= secs(0.9) && wait.took < 5 * SECOND,
        "-w 1 took {:?}",
        wait.took
    );

    attempt(&["-n", "-E", "75"]).expect(75);
    attempt(&["-w", "0.2", "--conflict-exit-code", "0"]).expect(0);
    assert_eq!(read(&ran), "", "a command ran without the lock");

    holder.signal("TERM");
    let done = holder.wait(Duration::from_secs(10));
    // `sleep` got the forwarded SIGTERM: 128 + 15.
    done.expect(143);
    assert_eq!(
        held(&url, "flags"),
        None,
        "still held after the holder exited"
    );
    attempt(&["-n"]).expect(0);
    assert_eq!(read(&ran), "ran\n");
}

// --- 3. Exit statuses and the command's environment ---------------------------------

#[test]
fn the_commands_status_arguments_and_environment_pass_through() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let in_lock = |args: &[&str]| run(dlm().args(["run", "--redis", &url, "codes"]).args(args));

    in_lock(&["--", "sh", "-c", "exit 7"]).expect(7);
    in_lock(&["--", "sh", "-c", "kill -9 $$"]).expect(128 + 9);
    in_lock(&["--", "sh", "-c", "kill -TERM $$"]).expect(128 + 15);
    in_lock(&["-c", "exit 3"]).expect(3);
    in_lock(&["-c", "true"]).expect(0);
    in_lock(&["--", "false"]).expect(1);

    let missing = in_lock(&["--", "/nonexistent/dlm-test-command", "arg"]);
    missing.expect(127);
    assert!(
        missing.stderr.contains("/nonexistent/dlm-test-command"),
        "{}",
        missing.stderr
    );
    in_lock(&["--", "dlm-test-command-not-on-path"]).expect(127);
    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\necho hi\n").unwrap();
    let done = in_lock(&["--", not_executable.to_str().unwrap()]);
    done.expect(126);
    assert!(done.stderr.contains("script.sh"), "{}", done.stderr);
    in_lock(&["--", dir.path().to_str().unwrap()]).expect(126);

    // Arguments arrive verbatim (spaces, empty, quotes, a leading dash).
    let args = in_lock(&["--", "printf", "%s|", "a b", "", "c'd", "-x"]);
    args.expect(0);
    assert_eq!(args.stdout, "a b||c'd|-x|");

    let env = in_lock(&[
        "-c",
        "printf '%s\\n' \"$DLM_LOCK_NAME\" \"$DLM_FENCING_TOKEN\" \"$DLM_LEASE_MS\"",
    ]);
    env.expect(0);
    let lines: Vec<&str> = env.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{:?}", env.stdout);
    assert_eq!(lines[0], "codes");
    let first: u64 = lines[1]
        .parse()
        .unwrap_or_else(|_| panic!("DLM_FENCING_TOKEN {:?}", lines[1]));
    assert_eq!(lines[2], "30000");

    let env = in_lock(&[
        "--lease",
        "1.5",
        "-c",
        "printf '%s %s\\n' \"$DLM_LEASE_MS\" \"$DLM_FENCING_TOKEN\"",
    ]);
    env.expect(0);
    let (lease, token) = env.stdout.trim().split_once(' ').unwrap();
    assert_eq!(lease, "1500");
    let second: u64 = token.parse().unwrap();
    assert!(second > first, "token {second} after {first}");
    let env = in_lock(&["--watchdog", "2", "-c", "echo \"$DLM_LEASE_MS\""]);
    env.expect(0);
    assert_eq!(env.stdout, "2000\n");
    let both = in_lock(&["--watchdog", "2", "--lease", "2", "--", "true"]);
    both.expect(2);
}

// --- 4. Signals ----------------------------------------------------------------------

/// SIGTERM (and SIGHUP) sent to `dlm` reach the command, which traps it, records it and
/// exits; `dlm` exits with the command's status and the lock is free.
#[test]
fn signals_to_dlm_are_forwarded_and_the_lock_released() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    for (sig, code) in [("TERM", 5), ("HUP", 6)] {
        let file = dir.path().join(format!("{sig}.log"));
        let pid_file = dir.path().join(format!("{sig}.pid"));
        let mut reaper = Reaper::default();
        let mut holder = Proc::spawn(dlm().args(["run", "--redis", &url, "sig", "-c"]).arg(
            format!(
                "trap 'echo got {sig} >> {f}; exit {code}' {sig}; echo $$ > {p}; \
                 while true; do sleep 0.05; done",
                f = q(&file),
                p = q(&pid_file)
            ),
        ));
        let child = read_pid(&pid_file);
        reaper.add(child);
        assert!(held(&url, "sig").is_some());
        holder.signal(sig);
        let done = holder.wait(Duration::from_secs(10));
        done.expect(code);
        assert_eq!(read(&file), format!("got {sig}\n"));
        assert!(!alive(child), "the command still runs");
        assert_eq!(held(&url, "sig"), None, "held after SIG{sig}");
    }
}

/// `--watchdog 1`: the lock outlives three of its 1 s leases while the command runs
/// (renewed). SIGKILL to `dlm`: its command (`sleep 60`, exec'd by the shell that wrote
/// its pid) dies with it, and the lock is taken again once its last lease has run out.
#[test]
fn sigkill_of_dlm_kills_the_command_and_the_lease_frees_the_lock() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut reaper = Reaper::default();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--watchdog", "1", "--redis", &url, "killed", "--"])
            .args([
                "sh",
                "-c",
                &format!("echo $$ > {}; exec sleep 60", q(&pid_file)),
            ]),
    );
    let child = read_pid(&pid_file);
    reaper.add(child);
    assert!(alive(child));
    // The passage of time is what is tested: three leases' worth, renewed.
    std::thread::sleep(3 * SECOND);
    assert_eq!(try_once(&url, "killed"), 1, "lost while renewed");
    holder.signal("KILL");
    let killed = Instant::now();
    let done = holder.wait(Duration::from_secs(5));
    assert_eq!(done.status.signal(), Some(9), "{:?}", done.status);
    wait_until(
        Duration::from_secs(5),
        "the command to die with dlm",
        || !alive(child),
    );
    assert_eq!(try_once(&url, "killed"), 1, "free right after the SIGKILL");
    wait_until(Duration::from_secs(10), "the lock to be free again", || {
        try_once(&url, "killed") == 0
    });
    let free_after = killed.elapsed();
    eprintln!("SIGKILL of dlm -> `dlm run -n` succeeds: {free_after:?} (--watchdog 1)");
    // Renewed every third of the lease: at least 2/3 s of it was left at the SIGKILL.
    assert!(
        free_after >= secs(0.6) && free_after < 4 * SECOND,
        "free {free_after:?} after the SIGKILL, with a 1 s renewed lease"
    );
}

/// `dlm ARGS...` run from a terminal (a pseudo-terminal from `script(1)`), as its
/// foreground job, followed by the shell commands `then` (`sh -c` is the session leader,
/// as a login shell would be, when `then` is not empty); what is written to the returned
/// stdin is typed at the terminal (keep it open until the run ends).
fn on_a_terminal(args: &str, then: &str) -> (std::process::Child, std::process::ChildStdin) {
    use std::process::Stdio;
    let line = format!("{} {args}{then}", env!("CARGO_BIN_EXE_dlm"));
    let mut script = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("DLM_REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script(1) (util-linux) is needed for a pseudo-terminal");
    let typed = script.stdin.take().unwrap();
    (script, typed)
}

/// Waits for `script` (see [`on_a_terminal`]) to end and returns its status and output;
/// after 20 s kills it and everything under it, and fails with `hang`.
fn terminal_run(mut script: std::process::Child, hang: &str) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let deadline = Instant::now() + 20 * SECOND;
    let status = loop {
        if let Some(status) = script.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            // Everything under `script` (dlm and what it started), then `script`.
            let mut tree = vec![i32::try_from(script.id()).unwrap()];
            let mut i = 0;
            while i < tree.len() {
                tree.extend(children_of(tree[i]));
                i += 1;
            }
            for pid in tree.into_iter().rev() {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            let _ = script.wait();
            panic!("{hang}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    script
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (status, out)
}

/// Run from a terminal, as its foreground job, `dlm` keeps the command in its own (dlm's)
/// process group: the command reads the terminal. (In a group of its own it would be a
/// background job there, stopped by SIGTTIN: the run would hang.)
#[test]
fn a_command_run_from_a_terminal_can_read_it() {
    use std::io::Write;
    let _serial = SERIAL.lock();
    let server = server();
    let (script, mut typed) = on_a_terminal(
        &format!("run --redis {} tty -c 'read x; echo got:$x'", server.url()),
        "",
    );
    typed.write_all(b"hello\n").unwrap();
    let (status, out) = terminal_run(
        script,
        "the run from a terminal hangs: the command cannot read the terminal",
    );
    drop(typed);
    assert!(status.success(), "{status}: {out}");
    assert!(
        out.contains("got:hello"),
        "the command did not read the line: {out:?}"
    );
}

/// The documented limit of that mode: from a terminal, `end` (a lost lock, SIGTERM to
/// `dlm`, SIGKILL of `dlm`) stops the command (the shell) but not what it started, which
/// runs on once the lock is free. (Elsewhere the command's own group is stopped whole:
/// [`descendants_stop_with_the_command`].) The shell that runs `dlm` stays, reading the
/// terminal, as an interactive one would: a session leader's exit would hang up the
/// terminal's foreground group.
fn from_a_terminal_the_commands_descendants_outlive(end: End) {
    use std::io::Write;
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut reaper = Reaper::default();
    let (lease, status) = match end {
        End::Lost => ("--lease 1 --kill-after 1", 70),
        End::Term => ("", 128 + 15),
        End::Kill => ("--lease 1", 128 + 9),
    };
    let (script, mut typed) = on_a_terminal(
        &format!(
            "run {lease} --redis {url} tty-tree -c 'echo $$ > {}; sleep 60; exit 0'",
            q(&pid_file)
        ),
        "; echo dlm-exit:$?; read end",
    );
    let shell = read_pid(&pid_file);
    reaper.add(shell);
    let mut grandchild = None;
    wait_until(Duration::from_secs(10), "the shell to start sleep", || {
        grandchild = children_of(shell).first().copied();
        grandchild.is_some()
    });
    let grandchild = grandchild.unwrap();
    reaper.add(grandchild);
    // In this mode the command is dlm's own child (no keeper).
    let stat = read(Path::new(&format!("/proc/{shell}/stat")));
    let dlm: i32 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    match end {
        End::Lost => {}
        End::Term => common::signal(dlm, "TERM"),
        End::Kill => common::signal(dlm, "KILL"),
    }
    wait_until(Duration::from_secs(10), "the shell to be stopped", || {
        !alive(shell)
    });
    wait_until(Duration::from_secs(10), "the lock to be free", || {
        try_once(&url, "tty-tree") == 0
    });
    assert!(
        alive(grandchild),
        "{end:?}: the shell's `sleep` was stopped too: the documented limit no longer holds (update the README)"
    );
    common::signal(grandchild, "KILL");
    typed.write_all(b"\n").unwrap();
    let (done, out) = terminal_run(script, "the terminal's shell did not end");
    drop(typed);
    assert!(done.success(), "{done}: {out}");
    assert!(
        out.contains(&format!("dlm-exit:{status}")),
        "{end:?}: dlm's status was not {status}: {out:?}"
    );
}

#[test]
fn from_a_terminal_a_lost_lock_leaves_the_commands_descendants() {
    from_a_terminal_the_commands_descendants_outlive(End::Lost);
}

#[test]
fn from_a_terminal_sigterm_to_dlm_leaves_the_commands_descendants() {
    from_a_terminal_the_commands_descendants_outlive(End::Term);
}

#[test]
fn from_a_terminal_sigkill_of_dlm_leaves_the_commands_descendants() {
    from_a_terminal_the_commands_descendants_outlive(End::Kill);
}

/// A `dlm` waiting for a held lock (not running anything yet) ends at SIGINT with 130,
/// and at SIGTERM with 143, promptly; its command never runs; the holder keeps the lock.
#[test]
fn a_signal_ends_a_wait_for_the_lock() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        // A lock of its own: a waiter's mark outlives the waiter, and must be this one's.
        let name = format!("wait-{sig}");
        let mut holder =
            Proc::spawn(dlm().args(["run", "--redis", &url, &name, "--", "sleep", "30"]));
        wait_until(Duration::from_secs(10), "the holder to hold", || {
            held(&url, &name).is_some()
        });
        let mut waiter = Proc::spawn(
            dlm()
                .args(["run", "--redis", &url, &name, "-c"])
                .arg(format!("echo ran >> {}", q(&ran))),
        );
        wait_for_a_waiter(&server, &name);
        let sent = Instant::now();
        waiter.signal(sig);
        let done = waiter.wait(Duration::from_secs(5));
        done.expect(code);
        let took = done.at - sent;
        assert!(took < 2 * SECOND, "SIG{sig} ended the wait after {took:?}");
        assert!(done.stderr.contains("interrupted"), "{}", done.stderr);
        assert!(held(&url, &name).is_some(), "the holder lost the lock");
        holder.signal("TERM");
        holder.wait(Duration::from_secs(10)).expect(143);
    }
    assert_eq!(read(&ran), "", "a waiter's command ran");
}

/// A waiter gets the lock of a holder killed with SIGKILL when that holder's lease runs
/// out (nobody releases it, so no release wakes the waiter).
#[test]
fn a_waiter_gets_a_killed_holders_lock_when_its_lease_ends() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let ran = dir.path().join("ran");
    let mut reaper = Reaper::default();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--lease", "1", "--redis", &url, "expiring", "-c"])
            .arg(format!("echo $$ > {}; exec sleep 60", q(&pid_file))),
    );
    reaper.add(read_pid(&pid_file));
    let mut waiter = Proc::spawn(
        dlm()
            .args(["run", "--redis", &url, "expiring", "-c"])
            .arg(format!("echo \"$DLM_FENCING_TOKEN\" >> {}", q(&ran))),
    );
    wait_for_a_waiter(&server, "expiring");
    holder.signal("KILL");
    let killed = Instant::now();
    let gone = holder.wait(Duration::from_secs(5));
    assert_eq!(gone.status.signal(), Some(9), "{:?}", gone.status);
    let done = waiter.wait(Duration::from_secs(10));
    done.expect(0);
    let took = done.at - killed;
    eprintln!("waiter got a SIGKILLed holder's lock (lease 1 s) {took:?} after the kill");
    assert!(took < 4 * SECOND, "{took:?}");
    assert!(read(&ran).trim().parse::<u64>().is_ok(), "{:?}", read(&ran));
}

// --- 5. Lost locks -------------------------------------------------------------------

/// A command that records SIGTERM with a timestamp and goes on (SIGKILL is needed to
/// stop it); it writes its pid once the trap is set.
fn stubborn(events: &Path, pid_file: &Path) -> String {
    format!(
        "trap 'echo TERM $(date +%s%N) >> {e}' TERM; echo $$ > {p}; \
         while true; do sleep 0.1; done",
        e = q(events),
        p = q(pid_file)
    )
}

/// A command that records SIGTERM with a timestamp and exits 0 at it.
fn obedient(events: &Path, pid_file: &Path) -> String {
    format!(
        "trap 'echo TERM $(date +%s%N) >> {e}; exit 0' TERM; echo $$ > {p}; \
         while true; do sleep 0.1; done",
        e = q(events),
        p = q(pid_file)
    )
}

/// The `date +%s%N` readings of `TERM` lines in `events`.
fn term_times(events: &Path) -> Vec<String> {
    read(events)
        .lines()
        .map(|l| {
            l.strip_prefix("TERM ")
                .unwrap_or_else(|| panic!("unexpected line {l:?}"))
                .to_owned()
        })
        .collect()
}

/// `--lease 1 --kill-after 1`: the fixed lease runs out after 1 s, the command gets
/// SIGTERM (which it ignores), then SIGKILL 1 s later; `dlm` exits 70.
#[test]
fn a_fixed_lease_running_out_stops_the_command_term_then_kill() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (events, pid_file) = (dir.path().join("events"), dir.path().join("pid"));
    let mut reaper = Reaper::default();
    let clock = Clock::now();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--lease", "1", "--kill-after", "1"])
            .args(["--redis", &url, "lost", "-c", &stubborn(&events, &pid_file)]),
    );
    let child = read_pid(&pid_file);
    reaper.add(child);
    let done = holder.wait(Duration::from_secs(15));
    done.expect(70);
    assert!(
        done.stderr.contains("lost") && done.stderr.contains("SIGKILL"),
        "{}",
        done.stderr
    );
    let terms = term_times(&events);
    assert_eq!(terms.len(), 1, "{:?}", read(&events));
    let term_at = clock.since(&terms[0]);
    assert!(
        term_at >= secs(0.8) && term_at < 3 * SECOND,
        "SIGTERM {term_at:?} after the start, with a 1 s lease"
    );
    assert!(
        done.took >= secs(1.9) && done.took < 6 * SECOND,
        "dlm exited {:?} after the start (1 s lease, 1 s grace)",
        done.took
    );
    assert!(!alive(child), "the command survived SIGKILL");
    eprintln!(
        "--lease 1 --kill-after 1: SIGTERM at {term_at:?}, dlm exited 70 at {:?}",
        done.took
    );
}

/// `--on-lost kill`: no SIGTERM, SIGKILL at once when the lease runs out.
#[test]
fn on_lost_kill_kills_at_once() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (events, pid_file) = (dir.path().join("events"), dir.path().join("pid"));
    let mut reaper = Reaper::default();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--lease", "0.5", "--on-lost", "kill"])
            .args([
                "--redis",
                &url,
                "killed",
                "-c",
                &stubborn(&events, &pid_file),
            ]),
    );
    let child = read_pid(&pid_file);
    reaper.add(child);
    let done = holder.wait(Duration::from_secs(10));
    done.expect(70);
    assert!(
        done.took >= secs(0.4) && done.took < 3 * SECOND,
        "{:?}",
        done.took
    );
    assert_eq!(read(&events), "", "the command got SIGTERM");
    assert!(!alive(child));
}

/// The key deleted by hand under a fixed lease: the lock is free for others at once (the
/// holder is not told), and the holder finds out when its lease runs out, not before.
#[test]
fn a_deleted_key_under_a_fixed_lease_is_noticed_at_the_lease_end() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (events, pid_file) = (dir.path().join("events"), dir.path().join("pid"));
    let mut reaper = Reaper::default();
    let clock = Clock::now();
    let started = Instant::now();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--lease", "2", "--redis", &url, "deleted", "-c"])
            .arg(obedient(&events, &pid_file)),
    );
    reaper.add(read_pid(&pid_file));
    delete_key(&server, "deleted");
    let deleted = started.elapsed();
    assert_eq!(try_once(&url, "deleted"), 0, "not free after the DEL");
    let done = holder.wait(Duration::from_secs(10));
    done.expect(70);
    let terms = term_times(&events);
    assert_eq!(terms.len(), 1, "{:?}", read(&events));
    let term_at = clock.since(&terms[0]);
    assert!(
        term_at >= secs(1.5) && term_at < 5 * SECOND,
        "SIGTERM {term_at:?} after the start (lease 2 s; key deleted at {deleted:?})"
    );
}

/// The key deleted by hand under the watchdog, while the command runs; the command then
/// ends by itself before the next renewal: the release finds the lock gone, and `dlm`
/// says the command may not have run alone (70).
#[test]
fn a_deleted_key_under_the_watchdog_is_reported_at_the_release() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let mut holder = Proc::spawn(dlm().args(["run", "--redis", &url, "deleted", "-c"]).arg(
        format!(
            "echo started >> {o}; while [ ! -e {g} ]; do sleep 0.05; done; echo finished >> {o}",
            o = q(&out),
            g = q(&go)
        ),
    ));
    wait_until(Duration::from_secs(10), "the command to start", || {
        read(&out) == "started\n"
    });
    delete_key(&server, "deleted");
    std::fs::write(&go, "").unwrap();
    let done = holder.wait(Duration::from_secs(10));
    done.expect(70);
    assert_eq!(read(&out), "started\nfinished\n", "the command was stopped");
    assert!(
        done.stderr.contains("may not have run alone"),
        "{}",
        done.stderr
    );
}

/// The key deleted by hand under the default watchdog (a 30 s lease renewed every 10 s;
/// `dlm` has no option to shorten it, so this test takes ~10 s): the next renewal finds
/// it gone and the command is stopped (70).
#[test]
fn a_deleted_key_under_the_watchdog_is_noticed_by_the_next_renewal() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (events, pid_file) = (dir.path().join("events"), dir.path().join("pid"));
    let mut reaper = Reaper::default();
    let clock = Clock::now();
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--redis", &url, "watched", "-c"])
            .arg(obedient(&events, &pid_file)),
    );
    reaper.add(read_pid(&pid_file));
    delete_key(&server, "watched");
    let done = holder.wait(Duration::from_secs(25));
    done.expect(70);
    assert!(
        done.stderr.contains("renewal found it gone"),
        "{}",
        done.stderr
    );
    let terms = term_times(&events);
    assert_eq!(terms.len(), 1, "{:?}", read(&events));
    let term_at = clock.since(&terms[0]);
    eprintln!(
        "key deleted: the watchdog's renewal stopped the command {term_at:?} after the start"
    );
    assert!(
        term_at >= 8 * SECOND && term_at < 16 * SECOND,
        "SIGTERM {term_at:?} after the start (renewals every 10 s)"
    );
}

/// `--on-lost ignore`: the lease runs out under the command, which runs to its end; `dlm`
/// warns and exits with the command's status.
#[test]
fn on_lost_ignore_lets_the_command_finish() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for code in [0, 4] {
        let done = run(dlm()
            .args(["run", "--lease", "0.5", "--on-lost", "ignore"])
            .args(["--redis", &url, "ignored", "-c"])
            .arg(format!(
                "sleep 1.5; echo done {code} >> {}; exit {code}",
                q(&out)
            )));
        done.expect(code);
        assert!(done.stderr.contains("lost"), "no warning: {}", done.stderr);
    }
    assert_eq!(read(&out), "done 0\ndone 4\n");
}

// --- Redlock quorum ------------------------------------------------------------------

/// Redlock over 3: one node down still gives a quorum; two down is the backend's failure
/// (69), for `run` and `status`.
#[test]
fn redlock_needs_a_quorum() {
    let _serial = SERIAL.lock();
    require_redis_server();
    let mut nodes = RedisNodes::spawn(3);
    let urls = nodes.urls().join(",");
    nodes.get_mut(2).kill();
    let done = run(dlm().args([
        "run",
        "--redis",
        &urls,
        "quorum",
        "-c",
        "echo $DLM_FENCING_TOKEN",
    ]));
    done.expect(0);
    assert!(done.stdout.trim().parse::<u64>().is_ok(), "{}", done.stdout);
    nodes.get_mut(1).kill();
    let done = run(dlm().args(["run", "--redis", &urls, "quorum", "--", "true"]));
    done.expect(69);
    assert!(done.stderr.contains("quorum"), "{}", done.stderr);
    let done = run(dlm().args(["status", "--redis", &urls, "quorum"]));
    done.expect(69);
}

// --- 6. Bad input --------------------------------------------------------------------

#[test]
fn bad_input_gets_a_clear_message_and_its_status() {
    let _serial = SERIAL.lock();
    let good = server();
    let url = good.url();
    let secured = RedisServer::builder().password("Right-Pa55word").spawn();
    let wrong = format!("redis://:Wrong-Pa55word@127.0.0.1:{}/", secured.port());
    let long = "x".repeat(513);
    let longest = "x".repeat(512);
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<String>>();
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            s(&["run", "--redis", "foo://x", "n", "--", "true"]),
            2,
            "scheme",
        ),
        (
            s(&["run", "--redis", "redis://127.0.0.1:1", "n", "--", "true"]),
            69,
            "127.0.0.1:1",
        ),
        (
            s(&["run", "--redis", &wrong, "n", "--", "true"]),
            69,
            "auth",
        ),
        (s(&["status", "--redis", &wrong, "n"]), 69, "auth"),
        (s(&["run", "--redis", &url, "", "--", "true"]), 2, "empty"),
        (
            s(&["run", "--redis", &url, &long, "--", "true"]),
            2,
            "513 bytes",
        ),
        (
            s(&["run", "--redis", &url, "a\tb", "--", "true"]),
            2,
            "control",
        ),
        (s(&["status", "--redis", &url, ""]), 2, "empty"),
        (s(&["run", "--redis", &url, "n"]), 2, "no command"),
        (s(&["run", "n", "--", "true"]), 2, "no backend"),
        (s(&["status", "n"]), 2, "no backend"),
        (s(&["unlock", "--redis", &url, "n"]), 2, "--force"),
        (
            s(&["run", "--redis", &url, "--lease", "0", "n", "--", "true"]),
            2,
            "lease",
        ),
        (
            s(&["run", "--redis", &url, "-w", "x", "n", "--", "true"]),
            2,
            "seconds",
        ),
        (
            s(&["run", "--redis", &url, "-n", "-w", "1", "n", "--", "true"]),
            2,
            "--wait",
        ),
        (
            s(&["run", "--redis", &format!("{url},{url}"), "n", "--", "true"]),
            2,
            "same server",
        ),
        (s(&["frobnicate"]), 2, "unrecognized subcommand"),
    ];
    for (args, code, says) in &cases {
        let done = run(dlm().args(args));
        done.expect(*code);
        let err = done.stderr.to_lowercase();
        assert!(
            err.contains(&says.to_lowercase()),
            "{args:?}: the message does not say {says:?}:\n{}",
            done.stderr
        );
        assert!(
            done.stderr.starts_with("dlm: ") || done.stderr.starts_with("error: "),
            "{args:?}: {}",
            done.stderr
        );
        assert!(!done.stderr.contains("Pa55word"), "{}", done.stderr);
    }
    // The longest name is fine.
    run(dlm().args(["run", "--redis", &url, &longest, "--", "true"])).expect(0);
}

// --- 7. Secrets ----------------------------------------------------------------------

/// A password with URL-special characters, given in the URL, in `DLM_REDIS_PASSWORD` or
/// in `--password-file`, right or wrong, with `-vv`: it shows in no output (neither raw
/// nor percent-encoded), nor in the command lines of `dlm` and its command.
#[test]
fn passwords_never_show() {
    let _serial = SERIAL.lock();
    const PW: &str = "s3cr3t@Pa55:w/rd";
    const WRONG: &str = "wr0ng@Pa55:w/rd";
    let server = RedisServer::builder().password(PW).spawn();
    let port = server.port();
    let plain = format!("redis://127.0.0.1:{port}/");
    let in_url = |pw: &str| {
        format!(
            "redis://:{}@127.0.0.1:{port}/",
            pw.replace('@', "%40")
                .replace(':', "%3A")
                .replace('/', "%2F")
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let right_file = dir.path().join("right");
    std::fs::write(&right_file, format!("{PW}\n")).unwrap();
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, format!("{WRONG}\n")).unwrap();
    let leaks = |text: &str| text.contains("s3cr3t") || text.contains("wr0ng");

    // How the password is given, and the status that follows.
    let ways = [
        (Way::Url(PW), 0),
        (Way::Env(PW), 0),
        (Way::File(&right_file), 0),
        (Way::Url(WRONG), 69),
        (Way::Env(WRONG), 69),
        (Way::File(&wrong_file), 69),
    ];
    let cmd = |way: &Way<'_>, args: &[&str]| {
        // The subcommand, then the backend's options, then the rest (maybe after `--`).
        let mut c = dlm();
        c.arg(args[0]);
        match *way {
            Way::Url(pw) => c.args(["--redis", &in_url(pw)]),
            Way::Env(pw) => c.env("DLM_REDIS_PASSWORD", pw).args(["--redis", &plain]),
            // And the URL from the environment.
            Way::File(path) => c
                .env("DLM_REDIS_URL", &plain)
                .arg("--password-file")
                .arg(path),
        };
        c.args(&args[1..]);
        c
    };
    for (way, code) in &ways {
        // Every subcommand with the right password; `run` and `status` with a wrong one
        // (each failure takes ~1 s: the connection pool's timeout).
        let subs: &[&[&str]] = if *code == 0 {
            &[
                &["run", "-vv", "pw", "--", "true"],
                &["status", "-vv", "pw"],
                &["status", "-vv", "--json", "pw"],
                &["unlock", "-vv", "--force", "--yes", "pw"],
            ]
        } else {
            &[
                &["run", "-vv", "pw", "--", "true"],
                &["status", "-vv", "pw"],
            ]
        };
        for &sub in subs {
            let done = run(&mut cmd(way, sub));
            done.expect(*code);
            let all = format!("{}\n{}", done.stdout, done.stderr);
            assert!(!leaks(&all), "{way:?} {sub:?} showed a password:\n{all}");
            if *code == 0 {
                assert!(
                    done.stderr.contains("dlm: info:"),
                    "-vv said nothing: {}",
                    done.stderr
                );
            } else {
                assert!(done.stderr.contains("auth"), "{way:?}: {}", done.stderr);
            }
        }
        if *code == 0 {
            // While the command runs: neither `dlm`'s command line nor its command's.
            let ready = dir.path().join(format!("ready-{}", way.label()));
            let go = dir.path().join(format!("go-{}", way.label()));
            let script = format!(
                "echo $$ > {r}; while [ ! -e {g} ]; do sleep 0.05; done",
                r = q(&ready),
                g = q(&go)
            );
            let mut holder = Proc::spawn(&mut cmd(way, &["run", "-vv", "pw", "-c", &script]));
            let child = read_pid(&ready);
            for pid in [holder.pid(), child] {
                let cmdline = read(Path::new(&format!("/proc/{pid}/cmdline")));
                assert!(!cmdline.is_empty());
                if !matches!(way, Way::Url(_)) {
                    assert!(!leaks(&cmdline), "{way:?}: in ps: {cmdline:?}");
                }
            }
            std::fs::write(&go, "").unwrap();
            let done = holder.wait(Duration::from_secs(10));
            done.expect(0);
            assert!(!leaks(&format!("{}{}", done.stdout, done.stderr)));
        }
    }
}

/// How [`passwords_never_show`] gives the password.
#[derive(Debug)]
enum Way<'a> {
    /// In the `--redis` URL (percent-encoded).
    Url(&'a str),
    /// In `DLM_REDIS_PASSWORD`.
    Env(&'a str),
    /// In `--password-file`.
    File(&'a Path),
}

impl Way<'_> {
    fn label(&self) -> &'static str {
        match self {
            Way::Url(_) => "url",
            Way::Env(_) => "env",
            Way::File(_) => "file",
        }
    }
}

/// A password with a `%` followed by two hex digits (and the URL's own delimiters), given
/// in `DLM_REDIS_PASSWORD` or `--password-file`, is sent as it is (it was percent-decoded:
/// `ab%41cd` authenticated as `abAcd`).
#[test]
fn a_password_with_percent_escapes_is_sent_verbatim() {
    let _serial = SERIAL.lock();
    const PW: &str = "ab%41cd:@/#?+ é";
    let server = RedisServer::builder().password(PW).spawn();
    let plain = format!("redis://127.0.0.1:{}/", server.port());
    // The testkit's URL (percent-encoded properly) works: the server is fine.
    run(dlm().args(["run", "--redis", &server.url(), "pct", "--", "true"])).expect(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{PW}\n")).unwrap();
    run(dlm()
        .env("DLM_REDIS_PASSWORD", PW)
        .args(["run", "--redis", &plain, "pct", "--", "true"]))
    .expect(0);
    run(dlm()
        .args(["run", "--redis", &plain, "--password-file"])
        .arg(&file)
        .args(["pct", "--", "true"]))
    .expect(0);
}

// --- 8. status --json and unlock --force ---------------------------------------------

#[test]
fn status_json_and_forced_unlock() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let odd = "free \"quoted\" back\\slash é";
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--redis", &url, "admin", "-c"])
            .arg(format!(
                "echo started >> {o}; while [ ! -e {g} ]; do sleep 0.05; done; echo finished >> {o}",
                o = q(&out),
                g = q(&go)
            )),
    );
    wait_until(Duration::from_secs(10), "the command to start", || {
        read(&out) == "started\n"
    });

    let done = run(dlm().args(["status", "--redis", &url, "admin", odd, "--json"]));
    done.expect(0);
    let rows = Json::parse(&done.stdout);
    let rows = rows.array();
    assert_eq!(rows.len(), 2, "{}", done.stdout);
    assert_eq!(rows[0].get("name").str(), "admin");
    assert_eq!(rows[0].get("held"), &Json::Bool(true));
    let remaining = rows[0].get("remaining_ms").u64();
    assert!(
        remaining > 0 && remaining <= 30_000,
        "remaining_ms {remaining}"
    );
    assert_eq!(rows[1].get("name").str(), odd);
    assert_eq!(rows[1].get("held"), &Json::Bool(false));
    assert_eq!(rows[1].get("remaining_ms"), &Json::Null);

    let plain = run(dlm().args(["status", "--redis", &url, "admin", "other"]));
    plain.expect(0);
    let lines: Vec<&str> = plain.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", plain.stdout);
    assert!(
        lines[0].starts_with("admin\theld\t") && lines[0].ends_with("s left"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "other\tfree");

    let done = run(dlm().args(["unlock", "--force", "--redis", &url, "admin", "--yes"]));
    done.expect(0);
    assert_eq!(done.stdout, "admin\treleased\n");
    assert_eq!(held(&url, "admin"), None, "held after unlock --force");
    let again = run(dlm().args(["unlock", "--force", "--yes", "--redis", &url, "admin"]));
    again.expect(0);
    assert_eq!(again.stdout, "admin\tfree (was not held)\n");
    // The holder is not told: its command runs on, and another run gets the lock.
    assert_eq!(try_once(&url, "admin"), 0);
    assert_eq!(holder.stderr_now(), "");

    std::fs::write(&go, "").unwrap();
    let done = holder.wait(Duration::from_secs(10));
    done.expect(70);
    assert_eq!(read(&out), "started\nfinished\n");
    assert!(done.stderr.contains("lost"), "{}", done.stderr);
}

// --- The command's descendants -------------------------------------------

/// How `dlm` goes away in [`descendants_stop_with_the_command`].
#[derive(Clone, Copy, Debug)]
enum End {
    /// SIGKILL to `dlm`.
    Kill,
    /// SIGTERM to `dlm` (forwarded to the command).
    Term,
    /// The fixed lease runs out (`--lease 1 --kill-after 1`).
    Lost,
}

/// `-c 'echo $$ > P; sleep 60'`: the shell runs `sleep` as its child (dash does not exec
/// the last command). Once `dlm` is gone and another run can take the lock, nothing of the
/// first command may still run, or two commands run "under" the lock at once.
fn descendants_stop_with_the_command(end: End) {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut reaper = Reaper::default();
    let lease: &[&str] = match end {
        End::Lost => &["--lease", "1", "--kill-after", "1"],
        End::Kill => &["--lease", "1"],
        End::Term => &[],
    };
    let mut holder = Proc::spawn(
        dlm()
            .arg("run")
            .args(lease)
            .args(["--redis", &url, "tree", "-c"])
            .arg(format!("echo $$ > {}; sleep 60; exit 0", q(&pid_file))),
    );
    let shell = read_pid(&pid_file);
    reaper.add(shell);
    let mut grandchild = None;
    wait_until(Duration::from_secs(10), "the shell to start sleep", || {
        grandchild = children_of(shell).first().copied();
        grandchild.is_some()
    });
    let grandchild = grandchild.unwrap();
    reaper.add(grandchild);
    match end {
        End::Kill => holder.signal("KILL"),
        End::Term => holder.signal("TERM"),
        End::Lost => {}
    }
    let done = holder.wait(Duration::from_secs(15));
    eprintln!("{end:?}: dlm ended with {}", done.status);
    wait_until(Duration::from_secs(10), "the lock to be free", || {
        try_once(&url, "tree") == 0
    });
    // A correct `dlm` kills the whole command (e.g. its process group); give it 2 s.
    let gone = Instant::now() + 2 * SECOND;
    while alive(grandchild) && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(grandchild),
        "{end:?}: the lock is free again but the command's `sleep 60` (pid {grandchild}) still runs"
    );
}

#[test]
fn sigkill_of_dlm_stops_the_commands_descendants() {
    descendants_stop_with_the_command(End::Kill);
}

#[test]
fn sigterm_to_dlm_stops_the_commands_descendants() {
    descendants_stop_with_the_command(End::Term);
}

#[test]
fn a_lost_lock_stops_the_commands_descendants() {
    descendants_stop_with_the_command(End::Lost);
}

// --- Redis Cluster and Sentinel -------------------------------------------------------

/// `--cluster`: the URLs are seeds; a second run is refused while the first holds the
/// lock, and `status` sees it. `--sentinel NAME`: the lock lives on the master the
/// sentinels name, with the password (here from the environment) for the data nodes and
/// `--wait-replicas 2`. Bad combinations are usage errors.
#[test]
fn cluster_and_sentinel_backends() {
    let _serial = SERIAL.lock();
    require_redis_server();
    let cluster = dlm_testkit::cluster::RedisCluster::spawn();
    let seed = cluster.seed_urls()[0].clone();
    let on_cluster = |args: &[&str]| {
        let mut c = dlm();
        c.arg(args[0])
            .args(["--cluster", "--redis", &seed])
            .args(&args[1..]);
        c
    };
    run(&mut on_cluster(&[
        "run",
        "-n",
        "cl-job",
        "--",
        "sh",
        "-c",
        "test -n \"$DLM_FENCING_TOKEN\"",
    ]))
    .expect(0);
    let mut holder = Proc::spawn(&mut on_cluster(&["run", "cl-job", "--", "sleep", "30"]));
    let status_held = || {
        let done = run(&mut on_cluster(&["status", "--json", "cl-job"]));
        done.expect(0);
        Json::parse(&done.stdout).array()[0].get("held") == &Json::Bool(true)
    };
    wait_until(Duration::from_secs(10), "the holder to hold", status_held);
    run(&mut on_cluster(&["run", "-n", "cl-job", "--", "true"])).expect(1);
    holder.signal("TERM");
    holder.wait(Duration::from_secs(10)).expect(143);
    assert!(!status_held(), "still held after the holder exited");
    // A server without cluster mode: refused as bad input.
    let single = server();
    run(dlm().args([
        "run",
        "--cluster",
        "--redis",
        &single.url(),
        "x",
        "--",
        "true",
    ]))
    .expect(2);

    let t = dlm_testkit::sentinel::SentinelTopology::builder()
        .password("data-pw")
        .spawn();
    let sentinels = t.sentinel_urls().join(",");
    let script = format!(
        "redis-cli -p {} -a data-pw --no-auth-warning EXISTS 'dlm:{{sn-job}}' | grep -qx 1",
        t.master().port()
    );
    run(dlm()
        .env("DLM_REDIS_PASSWORD", "data-pw")
        .args([
            "run",
            "-n",
            "--sentinel",
            t.master_name(),
            "--redis",
            &sentinels,
        ])
        .args(["--wait-replicas", "2", "sn-job", "-c", &script]))
    .expect(0);
    // An unknown master name, and --wait-replicas with Redlock: usage errors.
    run(dlm().env("DLM_REDIS_PASSWORD", "data-pw").args([
        "run",
        "--sentinel",
        "nope",
        "--redis",
        &sentinels,
        "x",
        "--",
        "true",
    ]))
    .expect(2);
    let urls = format!("{},{},{}", single.url(), single.url(), single.url());
    run(dlm().args([
        "run",
        "--wait-replicas",
        "1",
        "--redis",
        &urls,
        "x",
        "--",
        "true",
    ]))
    .expect(2);
    run(dlm().args([
        "run",
        "--cluster",
        "--sentinel",
        "m",
        "--redis",
        &seed,
        "x",
        "--",
        "true",
    ]))
    .expect(2);
}
