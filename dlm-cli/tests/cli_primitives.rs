//! The real `dlm` binary with semaphores (`--permits N`) and read-write locks (`--shared`,
//! `--exclusive`), against real redis-servers (the testkit's, on free loopback ports,
//! killed when dropped): at most N commands at once, readers together and a writer alone,
//! `-n`, fencing tokens, a conflicting permit count, `dlm status`, the usage errors, and
//! Redlock's refusal.
//!
//! The commands record their start and end in a file and wait for a marker file the test
//! creates, so the test decides when each one ends; a waiting `dlm` is seen at the server
//! (its release-hint subscription, made once its first attempt was refused).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Done, Json, LIMIT, Proc, SERIAL, dlm, q, read, run, server, wait_until};
use dlm_redis::redis;
use dlm_testkit::redis_server::{RedisNodes, RedisServer, require_redis_server};

const TEN: Duration = Duration::from_secs(10);

/// A directory with the log the commands append to, and their end markers.
struct Stage {
    dir: tempfile::TempDir,
}

impl Stage {
    fn new() -> Stage {
        Stage {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn lines(&self) -> Vec<String> {
        read(&self.log()).lines().map(str::to_owned).collect()
    }

    /// The shell command of holder `id`: appends `start ID TOKEN`, waits until the test
    /// creates the marker `go.ID`, appends `end ID`.
    fn script(&self, id: &str) -> String {
        let go = self.dir.path().join(format!("go.{id}"));
        format!(
            "echo \"start {id} $DLM_FENCING_TOKEN\" >> {log}; \
             while [ ! -e {go} ]; do sleep 0.01; done; echo \"end {id}\" >> {log}",
            log = q(&self.log()),
            go = q(&go)
        )
    }

    /// Lets holder `id` end.
    fn release(&self, id: &str) {
        std::fs::write(self.dir.path().join(format!("go.{id}")), "").unwrap();
    }

    /// Waits until the log has a line `what id ...`.
    #[track_caller]
    fn wait_for(&self, what: &str, id: &str) {
        let prefix = format!("{what} {id}");
        wait_until(TEN, &format!("{prefix:?} in the log"), || {
            self.lines()
                .iter()
                .any(|l| l == &prefix || l.starts_with(&format!("{prefix} ")))
        });
    }

    /// `dlm run URL FLAGS NAME -c SCRIPT(id)`, started.
    fn start(&self, url: &str, flags: &[&str], name: &str, id: &str) -> Proc {
        Proc::spawn(dlm().args(["run", "--redis", url]).args(flags).args([
            name,
            "-c",
            &self.script(id),
        ]))
    }

    /// The most commands running at once, in log order, and each holder's token.
    fn most_at_once(&self) -> (usize, Vec<(String, u64)>) {
        let (mut running, mut most, mut tokens) = (0usize, 0, Vec::new());
        for line in self.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "start" => {
                    running += 1;
                    most = most.max(running);
                    let token = f
                        .get(2)
                        .and_then(|t| t.parse().ok())
                        .unwrap_or_else(|| panic!("no DLM_FENCING_TOKEN number in {line:?}"));
                    tokens.push((f[1].to_owned(), token));
                }
                "end" => running -= 1,
                _ => panic!("bad line {line:?}"),
            }
        }
        (most, tokens)
    }
}

/// How many connections of `server` have a pattern subscription: the `dlm` processes
/// that wait (a waiter subscribes to release hints once its first attempt was refused;
/// a holder that never waited has none).
fn waiters(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.strip_prefix("psub=").is_some_and(|n| n != "0"))
        })
        .count()
}

#[track_caller]
fn wait_for_waiters(server: &RedisServer, n: usize) {
    wait_until(TEN, &format!("{n} waiting dlm"), || waiters(server) >= n);
}

/// `dlm status --json FLAGS NAME`'s one row: (held, holders).
#[track_caller]
fn status(url: &str, flags: &[&str], name: &str) -> (bool, u64, Json) {
    let done = run(dlm()
        .args(["status", "--json", "--redis", url])
        .args(flags)
        .arg(name));
    done.expect(0);
    let row = Json::parse(&done.stdout).array()[0].clone();
    assert_eq!(row.get("name").str(), name);
    let held = row.get("held") == &Json::Bool(true);
    let holders = row.get("holders").u64();
    (held, holders, row)
}

/// `--permits 2`: of three concurrent runs two start, the third waits (seen at the
/// server) and starts only once one of the two ended; `dlm status` shows 2 of 2; `-n`
/// while both permits are taken exits 1 without running its command; every command
/// gets a fencing token, and the third's is larger than the two before it.
#[test]
fn at_most_n_commands_run_at_once() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let stage = Stage::new();
    let flags = ["--permits", "2"];
    let mut a = stage.start(&url, &flags, "jobs", "a");
    let mut b = stage.start(&url, &flags, "jobs", "b");
    stage.wait_for("start", "a");
    stage.wait_for("start", "b");
    let (held, holders, row) = status(&url, &flags, "jobs");
    assert!(held && holders == 2, "{row:?}");
    assert_eq!(row.get("permits").u64(), 2);

    let mut c = stage.start(&url, &flags, "jobs", "c");
    wait_for_waiters(&server, 1);
    // All permits taken: -n gives up at once, with the "not obtained" status.
    let ran = stage.dir.path().join("ran");
    run(dlm()
        .args(["run", "-n", "--redis", &url])
        .args(flags)
        .args(["jobs", "--", "touch"])
        .arg(&ran))
    .expect(1);
    assert!(!ran.exists(), "-n ran its command with every permit taken");
    assert!(
        !stage.lines().iter().any(|l| l.starts_with("start c")),
        "a third command started beside two: {:?}",
        stage.lines()
    );

    stage.release("a");
    a.wait(LIMIT).expect(0);
    stage.wait_for("start", "c");
    stage.release("b");
    stage.release("c");
    b.wait(LIMIT).expect(0);
    c.wait(LIMIT).expect(0);

    let (most, tokens) = stage.most_at_once();
    assert_eq!(most, 2, "log: {:?}", stage.lines());
    let token = |id: &str| tokens.iter().find(|(i, _)| i == id).unwrap().1;
    assert!(
        token("c") > token("a") && token("c") > token("b"),
        "tokens {tokens:?}"
    );
    let (held, holders, row) = status(&url, &flags, "jobs");
    assert!(!held && holders == 0, "{row:?}");
}

/// `--shared` twice: both run at once (each waits for the other to have started);
/// `--exclusive` waits for both (seen at the server) and starts after both ended;
/// meanwhile the lock NAME (plain `dlm run NAME`) is another resource, free.
#[test]
fn readers_share_and_a_writer_waits_for_them() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let stage = Stage::new();
    let mut r1 = stage.start(&url, &["--shared"], "cfg", "r1");
    let mut r2 = stage.start(&url, &["--shared"], "cfg", "r2");
    stage.wait_for("start", "r1");
    stage.wait_for("start", "r2");
    let (held, holders, row) = status(&url, &["--rw"], "cfg");
    assert!(held && holders == 2, "{row:?}");

    let mut w = stage.start(&url, &["--exclusive"], "cfg", "w");
    wait_for_waiters(&server, 1);
    // --exclusive is not the lock "cfg": that one is free.
    run(dlm().args(["run", "-n", "--redis", &url, "cfg", "--", "true"])).expect(0);
    run(dlm().args([
        "run",
        "-n",
        "--exclusive",
        "--redis",
        &url,
        "cfg",
        "--",
        "true",
    ]))
    .expect(1);

    stage.release("r1");
    r1.wait(LIMIT).expect(0);
    assert!(
        !stage.lines().iter().any(|l| l.starts_with("start w")),
        "the writer started beside a reader: {:?}",
        stage.lines()
    );
    stage.release("r2");
    r2.wait(LIMIT).expect(0);
    stage.wait_for("start", "w");
    // A reader now waits for the writer.
    run(dlm().args([
        "run", "-n", "--shared", "--redis", &url, "cfg", "--", "true",
    ]))
    .expect(1);
    stage.release("w");
    w.wait(LIMIT).expect(0);

    let lines = stage.lines();
    let at = |l: &str| {
        lines
            .iter()
            .position(|x| x == l || x.starts_with(&format!("{l} ")))
    };
    let (end1, end2, start_w) = (at("end r1"), at("end r2"), at("start w"));
    assert!(
        start_w > end1 && start_w > end2,
        "the writer started before the readers ended: {lines:?}"
    );
    assert_eq!(stage.most_at_once().0, 2, "{lines:?}");
}

/// A run that asks for another permit count than the one in use fails at once (exit 78,
/// EX_CONFIG, saying which count is in use, on which backend, for which semaphore),
/// without running its command and without waiting.
#[test]
fn another_permit_count_is_refused_without_running_the_command() {
    let server = server();
    let url = server.url();
    let stage = Stage::new();
    let mut holder = stage.start(&url, &["--permits", "2"], "jobs", "a");
    stage.wait_for("start", "a");
    let ran = stage.dir.path().join("ran");
    let done = run(dlm()
        .args([
            "run",
            "--permits",
            "3",
            "--redis",
            &url,
            "jobs",
            "--",
            "touch",
        ])
        .arg(&ran));
    done.expect(78);
    assert!(!ran.exists(), "the command ran");
    assert!(
        done.stderr
            .contains("the semaphore jobs is held with 2 permits, not 3")
            && done.stderr.contains("(1 server)")
            && done.stderr.contains("--permits"),
        "{}",
        done.stderr
    );
    stage.release("a");
    holder.wait(LIMIT).expect(0);
}

fn refused(args: &[&str], ran: &Path) -> Done {
    let done = run(dlm().args(args).arg(ran));
    done.expect(64);
    assert!(!ran.exists(), "{args:?} ran its command");
    done
}

/// `--permits 0` and `--permits` beside `--shared` or `--exclusive` are usage errors
/// (exit 64), before any I/O (the URL points nowhere) and without running the command.
#[test]
fn bad_primitive_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let url = "redis://127.0.0.1:1";
    let done = refused(
        &["run", "--redis", url, "--permits", "0", "j", "--", "touch"],
        &ran,
    );
    assert!(done.stderr.contains("at least 1 permit"), "{}", done.stderr);
    for other in ["--shared", "--exclusive"] {
        let done = refused(
            &[
                "run",
                "--redis",
                url,
                "--permits",
                "2",
                other,
                "j",
                "--",
                "touch",
            ],
            &ran,
        );
        assert!(
            done.stderr.contains("cannot be used with"),
            "{}",
            done.stderr
        );
    }
    refused(
        &[
            "run",
            "--redis",
            url,
            "--shared",
            "--exclusive",
            "j",
            "--",
            "touch",
        ],
        &ran,
    );
    let done = run(dlm().args(["status", "--redis", url, "--permits", "0", "j"]));
    done.expect(64);
}

/// Redlock (three URLs) keeps no semaphores and no read-write locks: `dlm run` says so,
/// naming the backend, with exit 64 and without running the command; `dlm status` too.
#[test]
fn redlock_refuses_permits_and_read_write_locks() {
    require_redis_server();
    let nodes = RedisNodes::spawn(3);
    let urls = nodes.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    for (flags, what) in [
        (&["--permits", "2"][..], "keeps no semaphores"),
        (&["--shared"][..], "keeps no read-write locks"),
        (&["--exclusive"][..], "keeps no read-write locks"),
    ] {
        let mut args = vec!["run", "--redis", &urls];
        args.extend_from_slice(flags);
        args.extend(["j", "--", "touch"]);
        let done = refused(&args, &ran);
        assert!(
            done.stderr.contains(what) && done.stderr.contains("Redlock over 3 servers"),
            "{}",
            done.stderr
        );
    }
    let done = run(dlm().args(["status", "--redis", &urls, "--permits", "2", "j"]));
    done.expect(64);
    assert!(
        done.stderr.contains("keeps no semaphores"),
        "{}",
        done.stderr
    );
}

/// `dlm hold --permits 1` prints the assignments with a fencing token and keeps the
/// permit (a `dlm run -n --permits 1` then exits 1) until its input ends; then it
/// releases it (exit 0, the semaphore free).
#[test]
fn hold_keeps_a_permit_until_its_input_ends() {
    use std::io::BufRead;
    use std::process::Stdio;

    /// Kills the hold if the test ends early.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let server = server();
    let url = server.url();
    let mut hold = Kill(
        dlm()
            .args(["hold", "--permits", "1", "--redis", &url, "h"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(hold.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let token = line
        .trim_end()
        .strip_prefix("DLM_LOCK_NAME='h' DLM_FENCING_TOKEN=")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("printed {line:?}"));
    assert!(token.parse::<u64>().is_ok(), "printed {line:?}");
    run(dlm().args([
        "run",
        "-n",
        "--permits",
        "1",
        "--redis",
        &url,
        "h",
        "--",
        "true",
    ]))
    .expect(1);
    let (held, holders, row) = status(&url, &["--permits", "1"], "h");
    assert!(held && holders == 1, "{row:?}");

    drop(hold.0.stdin.take());
    let deadline = std::time::Instant::now() + LIMIT;
    let exited = loop {
        if let Some(status) = hold.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "dlm hold did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(exited.code(), Some(0));
    let (held, holders, row) = status(&url, &["--permits", "1"], "h");
    assert!(!held && holders == 0, "{row:?}");
}

/// A permit's and a write hold's fixed lease running out is a lost hold, as the mutex's:
/// the command (waiting for a marker that never comes) is stopped and `dlm` exits 70.
#[test]
fn a_lost_permit_or_write_hold_stops_the_command() {
    let server = server();
    let url = server.url();
    let stage = Stage::new();
    for (flags, id) in [
        (&["--permits", "2", "--lease", "0.5"][..], "p"),
        (&["--exclusive", "--lease", "0.5"][..], "w"),
    ] {
        let mut proc = stage.start(&url, flags, "lost", id);
        let done = proc.wait(LIMIT);
        done.expect(70);
        assert!(done.stderr.contains("was lost"), "{}", done.stderr);
        assert!(
            stage
                .lines()
                .iter()
                .any(|l| l.starts_with(&format!("start {id} "))),
            "the command did not run"
        );
        assert!(
            !stage
                .lines()
                .iter()
                .any(|l| l.starts_with(&format!("end {id}"))),
            "the command ran to its end"
        );
    }
}

/// The labels `dlm status` shows: each row of `held_by`, as (hold, label).
fn held_by(row: &Json) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = row
        .get("held_by")
        .array()
        .iter()
        .map(|h| {
            assert!(h.get("remaining_ms").u64() > 0, "{h:?}");
            let label = match h.get("label") {
                Json::Null => String::new(),
                l => l.str().to_owned(),
            };
            (h.get("hold").str().to_owned(), label)
        })
        .collect();
    list.sort();
    list
}

/// Administering what `dlm run --permits` and `--shared` take: `dlm status` shows the
/// count a semaphore is held with (and says so when `--permits` gives another), who holds
/// each permit or read hold (the `--label`, or `HOST:PID` by default) and how long each
/// has left; `dlm unlock --force --permits` and `--rw` clear them, and the holders learn
/// it at their next renewal (their commands are stopped: exit 70). It used to print the
/// count typed (`1 of 2 permits` for a semaphore held with 3) and could not clear either.
#[test]
fn status_shows_and_unlock_clears_semaphores_and_read_write_locks() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let stage = Stage::new();
    let held = ["--permits", "3", "--watchdog", "1"];
    let mut a = stage.start(
        &url,
        &[&held[..], &["--label", "alpha"]].concat(),
        "jobs",
        "a",
    );
    let mut b = stage.start(&url, &held, "jobs", "b");
    stage.wait_for("start", "a");
    stage.wait_for("start", "b");

    let (_, holders, row) = status(&url, &["--permits", "2"], "jobs");
    assert_eq!(holders, 2, "{row:?}");
    assert_eq!(row.get("permits").u64(), 2);
    assert_eq!(row.get("held_with").u64(), 3, "{row:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let default_label = format!("{}:{}", host.trim(), b.pid());
    assert_eq!(
        held_by(&row),
        vec![
            ("permit".to_owned(), "alpha".to_owned()),
            ("permit".to_owned(), default_label.clone()),
        ]
    );
    let text = run(dlm().args(["status", "--redis", &url, "--permits", "2", "jobs"]));
    text.expect(0);
    assert!(
        text.stdout.contains("2 of 3 permits (held with 3, not 2"),
        "{}",
        text.stdout
    );
    for label in ["alpha", default_label.as_str()] {
        assert!(
            text.stdout.contains(&format!("  permit\t{label}\t")),
            "{label}: {}",
            text.stdout
        );
    }

    run(dlm().args(["unlock", "--redis", &url, "--permits", "jobs"])).expect(64);
    let unlocked = run(dlm().args([
        "unlock",
        "--force",
        "--yes",
        "--redis",
        &url,
        "--permits",
        "jobs",
    ]));
    unlocked.expect(0);
    assert_eq!(unlocked.stdout, "jobs\treleased\n");
    let (held_now, holders, row) = status(&url, &["--permits", "3"], "jobs");
    assert!(!held_now && holders == 0, "{row:?}");
    assert_eq!(row.get("held_with"), &Json::Null);
    // The holders find their permits gone at their next renewal (every 1/3 s).
    a.wait(LIMIT).expect(70);
    b.wait(LIMIT).expect(70);

    let mut r = stage.start(
        &url,
        &["--shared", "--watchdog", "1", "--label", "reader"],
        "cfg",
        "r",
    );
    stage.wait_for("start", "r");
    let (_, holders, row) = status(&url, &["--rw"], "cfg");
    assert_eq!(holders, 1, "{row:?}");
    assert_eq!(
        held_by(&row),
        vec![("read".to_owned(), "reader".to_owned())]
    );
    let unlocked = run(dlm().args(["unlock", "--force", "-y", "--redis", &url, "--rw", "cfg"]));
    unlocked.expect(0);
    assert_eq!(unlocked.stdout, "cfg\treleased\n");
    r.wait(LIMIT).expect(70);
    let (held_now, _, row) = status(&url, &["--rw"], "cfg");
    assert!(!held_now, "{row:?}");
    // A bad label is a usage error before any I/O.
    run(dlm().args([
        "run",
        "--redis",
        &url,
        "--permits",
        "2",
        "--label",
        "",
        "x",
        "--",
        "true",
    ]))
    .expect(64);
}
