//! The real `dlm` binary running commands under a lock, against real redis-servers (the
//! testkit's, on free loopback ports, killed when dropped): mutual exclusion (single and
//! Redlock over 3), the waiting flags, a server that starts late, exit statuses and the
//! command's environment.
//!
//! Timing-sensitive: every test takes `SERIAL`, so they run one at a time even without
//! `--test-threads=1`, with wide margins (CI machines have 2 cores). Every `dlm` is waited
//! for with a deadline and killed if the test ends first.

mod common;

use std::time::{Duration, Instant};

use common::{
    Clock, LIMIT, Proc, SECOND, SERIAL, alive, dlm, held, q, read, run, secs, server, wait_until,
};
use dlm_redis::redis;
use dlm_testkit::history::{History, Hold};
use dlm_testkit::redis_server::{RedisNodes, require_redis_server};

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

// --- A server that starts late ------------------------------------------------------

/// `dlm run` started while its Redis is down, the server started on that port a second
/// later: with `-w 10` and with the default wait, dlm retries the unreachable server
/// within the wait, gets the lock once the server is up and runs the command (exit 0).
/// (It used to make one attempt before waiting and exit 69 at once.) `-n` stays one
/// attempt: 69 at once.
#[test]
fn a_wait_rides_out_a_server_that_starts_late() {
    let _serial = SERIAL.lock();
    let mut server = server();
    let url = server.url();
    server.kill();
    let once = run(dlm().args(["run", "-n", "--redis", &url, "late", "--", "echo", "ran"]));
    once.expect(69);
    assert!(once.took < 5 * SECOND, "-n took {:?}", once.took);
    assert_eq!(once.stdout, "");
    for wait in [&["-w", "10"][..], &[]] {
        let mut p = Proc::spawn(
            dlm()
                .args(["run", "-v", "--redis", &url])
                .args(wait)
                .args(["late", "--", "echo", "ran"]),
        );
        // dlm has built its backend and goes on to the lock: its first attempts find the
        // server down. The server comes up a second later.
        wait_until(Duration::from_secs(10), "dlm to start", || {
            p.stderr_now().contains("backend: 1 server")
        });
        let started = Instant::now();
        std::thread::sleep(SECOND);
        assert!(
            alive(p.pid()),
            "dlm run {wait:?} gave up while the server was down:\n{}",
            p.stderr_now()
        );
        server.restart();
        let done = p.wait(LIMIT);
        done.expect(0);
        assert_eq!(done.stdout, "ran\n", "{wait:?}");
        assert!(done.at >= started + SECOND, "{wait:?}");
        server.kill();
    }
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
    both.expect(64);
}

// --- The server-settings check -------------------------------------------------------

/// How many times the server ran `CONFIG GET` (its command statistics).
fn config_gets(server: &dlm_testkit::redis_server::RedisServer) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_config|get:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// The settings warnings (a server without AOF) are shown with `-v` only, so a run without
/// it does not ask for the settings at all (two `CONFIG GET`s that were a round trip each
/// of every run); with `-v` they are asked and the warning is shown.
#[test]
fn the_server_settings_are_read_only_when_their_warning_shows() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let before = config_gets(&server);
    let done = run(dlm().args(["run", "-n", "--redis", &url, "settings", "--", "true"]));
    done.expect(0);
    assert!(!done.stderr.contains("appendonly"), "{}", done.stderr);
    assert_eq!(config_gets(&server), before, "CONFIG GET without -v");
    let done = run(dlm().args(["run", "-v", "-n", "--redis", &url, "settings", "--", "true"]));
    done.expect(0);
    assert!(
        done.stderr.contains("appendonly no"),
        "no settings warning with -v: {}",
        done.stderr
    );
    assert!(config_gets(&server) > before, "no CONFIG GET with -v");
}
