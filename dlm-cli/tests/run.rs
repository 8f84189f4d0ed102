//! The real `dlm` binary against real redis-servers (the testkit's, on free ports).
//! Timing-sensitive: the tests run one at a time (SERIAL) with wide margins.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlm_redis::redis;
use dlm_testkit::history::{History, Hold};
use dlm_testkit::redis_server::{RedisNodes, RedisServer, require_redis_server};

static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn dlm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlm"));
    c.env_remove("DLM_REDIS_URL")
        .env_remove("DLM_REDIS_PASSWORD")
        .stdin(Stdio::null());
    c
}

fn server() -> RedisServer {
    require_redis_server();
    RedisServer::spawn()
}

/// A `dlm` process killed (with its process group's command) if the test ends first.
struct Running(Child);

impl Running {
    fn start(cmd: &mut Command) -> Running {
        Running(
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap()
    }

    /// Waits at most `limit`; fails the test (after killing) past it.
    fn wait(&mut self, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.0.stderr.take() {
                    e.read_to_string(&mut err).unwrap();
                }
                return (status, err);
            }
            if Instant::now() >= deadline {
                let _ = self.0.kill();
                panic!("dlm did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn output(cmd: &mut Command) -> Output {
    let mut r = Running::start(cmd);
    let (status, stderr) = r.wait(Duration::from_secs(30));
    let mut stdout = Vec::new();
    if let Some(mut o) = r.0.stdout.take() {
        o.read_to_end(&mut stdout).unwrap();
    }
    let out = Output {
        status,
        stdout,
        stderr: stderr.into_bytes(),
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "dlm panicked: {err}"
    );
    out
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Polls `cond` until true, at most `limit`.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn held(url: &str, name: &str) -> bool {
    let out = output(dlm().args(["status", "--redis", url, name]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).contains("\theld")
}

fn temp_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Four concurrent `dlm run` processes, three runs each, record their critical sections;
/// none overlap and the tokens increase.
fn mutual_exclusion(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_file(dir.path(), "log");
    let script = format!(
        "echo \"start $ID $(date +%s%N) $DLM_FENCING_TOKEN\" >> {0}; sleep 0.05; echo \"end $ID $(date +%s%N)\" >> {0}",
        log.display()
    );
    let (base_instant, base_real) = (Instant::now(), SystemTime::now());
    let mut procs: Vec<Running> = (0..4)
        .map(|p| {
            let script = script.clone();
            let url = url.to_owned();
            Running::start(Command::new("sh").arg("-c").arg(format!(
                "for i in 1 2 3; do ID={p}.$i {} run --redis {url} mutex -c '{}' || exit 9; done",
                env!("CARGO_BIN_EXE_dlm"),
                script.replace('\'', "'\\''")
            )))
        })
        .collect();
    for p in &mut procs {
        let (status, err) = p.wait(Duration::from_secs(60));
        assert!(status.success(), "{status}: {err}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let at = |ns: &str| {
        let real = UNIX_EPOCH + Duration::from_nanos(ns.parse().unwrap());
        base_instant + real.duration_since(base_real).unwrap_or_default()
    };
    let history = History::new();
    let mut open = std::collections::HashMap::new();
    let mut tokens = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "start" => {
                let token: u64 = f[3].parse().expect("DLM_FENCING_TOKEN is a number");
                tokens.push(token);
                open.insert(f[1].to_owned(), (at(f[2]), token));
            }
            "end" => {
                let (from, token) = open.remove(f[1]).expect("an end after its start");
                history.push(Hold::new("mutex", f[1], from, at(f[2]), Some(token)));
            }
            other => panic!("unexpected line {other:?}"),
        }
    }
    assert_eq!(history.len(), 12, "{text}");
    history.check().assert_clean();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}

#[test]
fn runs_never_overlap_and_tokens_increase_single() {
    let _s = SERIAL.lock();
    let server = server();
    mutual_exclusion(&server.url());
}

#[test]
fn runs_never_overlap_and_tokens_increase_redlock3() {
    let _s = SERIAL.lock();
    require_redis_server();
    let nodes = RedisNodes::spawn(3);
    mutual_exclusion(&nodes.urls().join(","));
}

#[test]
fn waiting_flags_and_the_conflict_status() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let mut holder =
        Running::start(dlm().args(["run", "--redis", &url, "flags", "--", "sleep", "30"]));
    wait_until(Duration::from_secs(10), "the holder", || {
        held(&url, "flags")
    });

    let t = Instant::now();
    let out = output(dlm().args(["run", "-n", "--redis", &url, "flags", "--", "true"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "-n took {:?}",
        t.elapsed()
    );

    let t = Instant::now();
    let out = output(dlm().args(["run", "-w", "1", "--redis", &url, "flags", "--", "true"]));
    let waited = t.elapsed();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "-w 1 took {waited:?}"
    );

    let out = output(dlm().args([
        "run", "-n", "-E", "75", "--redis", &url, "flags", "--", "true",
    ]));
    assert_eq!(code(&out), 75);

    // SIGTERM to the holder: forwarded to `sleep`, then released.
    let killed = Command::new("kill")
        .args(["-TERM", &holder.pid().to_string()])
        .status();
    assert!(killed.unwrap().success());
    let (status, err) = holder.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15), "{err}");
    assert!(!held(&url, "flags"));
    let out = output(dlm().args(["run", "-n", "--redis", &url, "flags", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn the_command_gets_its_environment_and_its_status_passes_through() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let run = |args: &[&str]| {
        let mut c = dlm();
        c.args(["run", "--redis", &url, "status"]).args(args);
        output(&mut c)
    };
    assert_eq!(code(&run(&["--", "sh", "-c", "exit 7"])), 7);
    assert_eq!(code(&run(&["-c", "exit 3"])), 3);
    assert_eq!(code(&run(&["-c", "kill -9 $$"])), 128 + 9);
    let out = run(&["--", "/nonexistent/command"]);
    assert_eq!(code(&out), 127);
    assert!(
        stderr(&out).contains("/nonexistent/command"),
        "{}",
        stderr(&out)
    );

    let env = run(&["-c", "echo $DLM_LOCK_NAME $DLM_LEASE_MS $DLM_FENCING_TOKEN"]);
    let line = String::from_utf8_lossy(&env.stdout).trim().to_owned();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[..2], ["status", "30000"], "{line}");
    assert!(f[2].parse::<u64>().is_ok(), "{line}");
    let env = run(&["--lease", "1.5", "-c", "echo $DLM_LEASE_MS"]);
    assert_eq!(String::from_utf8_lossy(&env.stdout).trim(), "1500");
}

#[test]
fn killing_dlm_kills_the_command_and_the_lock_expires_with_its_lease() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = temp_file(dir.path(), "pid");
    let mut holder = Running::start(
        dlm()
            .args(["run", "--lease", "2", "--redis", &url, "killed", "-c"])
            .arg(format!("echo $$ > {}; exec sleep 60", pid_file.display())),
    );
    wait_until(Duration::from_secs(10), "the command", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let child: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(child));
    let killed_at = Instant::now();
    holder.0.kill().unwrap(); // SIGKILL
    let _ = holder.0.wait();
    wait_until(
        Duration::from_secs(5),
        "the command to die with dlm",
        || !pid_alive(child),
    );
    wait_until(Duration::from_secs(10), "the lock to expire", || {
        code(&output(dlm().args([
            "run", "-n", "--redis", &url, "killed", "--", "true",
        ]))) == 0
    });
    let free_after = killed_at.elapsed();
    eprintln!("SIGKILL of dlm to the lock taken again: {free_after:?} (lease 2 s)");
    assert!(
        free_after > Duration::from_millis(1000) && free_after < Duration::from_secs(6),
        "{free_after:?}"
    );
}

#[test]
fn a_signal_ends_a_wait() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let _holder =
        Running::start(dlm().args(["run", "--redis", &url, "sigwait", "--", "sleep", "30"]));
    wait_until(Duration::from_secs(10), "the holder", || {
        held(&url, "sigwait")
    });
    let mut waiter = Running::start(dlm().args(["run", "--redis", &url, "sigwait", "--", "true"]));
    // Waiting: a waiter marks the key it waits for (a `~` appended to the holder's token).
    let mut con = server.connection();
    wait_until(Duration::from_secs(10), "the waiter to wait", || {
        let v: Option<String> = redis::cmd("GET")
            .arg("dlm:{sigwait}")
            .query(&mut con)
            .unwrap();
        v.is_some_and(|v| v.ends_with('~'))
    });
    let t = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-INT", &waiter.pid().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let (status, err) = waiter.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + 2), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn a_lost_lock_stops_the_command() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let file = temp_file(dir.path(), "events");
    // The command ignores SIGTERM (it records it): SIGKILL must follow.
    let script = format!(
        "trap 'echo TERM >> {0}' TERM; echo $$ > {0}.pid; while true; do sleep 0.05; done",
        file.display()
    );
    let t = Instant::now();
    let out = output(
        dlm()
            .args([
                "run",
                "--lease",
                "1",
                "--kill-after",
                "1",
                "--redis",
                &url,
                "lost",
                "-c",
            ])
            .arg(&script),
    );
    let took = t.elapsed();
    assert_eq!(code(&out), 70, "{}", stderr(&out));
    assert!(stderr(&out).contains("lost"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "TERM");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(6),
        "lease 1 s + 1 s grace took {took:?}"
    );
    let pid: i32 = std::fs::read_to_string(format!("{}.pid", file.display()))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!pid_alive(pid), "the command survived");

    // The key deleted by hand: the next renewal or the release finds it gone (70).
    let mut con = server.connection();
    let out_file = temp_file(dir.path(), "deleted");
    let mut run = Running::start(dlm().args(["run", "--redis", &url, "deleted", "-c"]).arg(
        format!(
            "echo started > {0}; sleep 1; echo done >> {0}",
            out_file.display()
        ),
    ));
    wait_until(Duration::from_secs(10), "the command", || out_file.exists());
    let deleted: i64 = redis::cmd("DEL")
        .arg("dlm:{deleted}")
        .query(&mut con)
        .unwrap();
    assert_eq!(deleted, 1, "the lock key is dlm:{{deleted}}");
    let (status, err) = run.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(70), "{err}");

    // --on-lost=ignore: only a warning, the command's own status.
    let out = output(
        dlm()
            .args([
                "run",
                "--lease",
                "0.5",
                "--on-lost",
                "ignore",
                "--redis",
                &url,
                "ignored",
                "--",
            ])
            .args(["sh", "-c", "sleep 1; exit 4"]),
    );
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("lost"), "{}", stderr(&out));
}

#[test]
fn bad_input_gets_a_clear_message_and_its_status() {
    let _s = SERIAL.lock();
    let server = RedisServer::builder().password("right-Pa55").spawn();
    let good = format!("redis://:right-Pa55@127.0.0.1:{}", server.port());
    let wrong = format!("redis://:wrong-Pa55@127.0.0.1:{}", server.port());
    let long = "x".repeat(513);
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec![
                "run".into(),
                "--redis".into(),
                "foo://x".into(),
                "n".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            "scheme",
        ),
        (
            vec![
                "run".into(),
                "--redis".into(),
                "redis://127.0.0.1:1".into(),
                "n".into(),
                "--".into(),
                "true".into(),
            ],
            69,
            "127.0.0.1:1",
        ),
        (
            vec![
                "run".into(),
                "--redis".into(),
                wrong.clone(),
                "n".into(),
                "--".into(),
                "true".into(),
            ],
            69,
            "auth",
        ),
        (
            vec![
                "run".into(),
                "--redis".into(),
                good.clone(),
                "".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            "name",
        ),
        (
            vec![
                "run".into(),
                "--redis".into(),
                good.clone(),
                long,
                "--".into(),
                "true".into(),
            ],
            2,
            "name",
        ),
        (
            vec!["run".into(), "--redis".into(), good.clone(), "n".into()],
            2,
            "no command",
        ),
        (
            vec!["run".into(), "n".into(), "--".into(), "true".into()],
            2,
            "no backend",
        ),
        (
            vec!["unlock".into(), "--redis".into(), good.clone(), "n".into()],
            2,
            "--force",
        ),
    ];
    for (args, expected, says) in cases {
        let out = output(dlm().args(&args));
        let err = stderr(&out);
        assert_eq!(code(&out), expected, "{args:?}: {err}");
        assert!(
            err.to_lowercase().contains(&says.to_lowercase()),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("right-Pa55") && !err.contains("wrong-Pa55"),
            "{err}"
        );
    }
}

#[test]
fn passwords_appear_in_no_output() {
    let _s = SERIAL.lock();
    let pw = "sEcReT-Pa55-42";
    let server = RedisServer::builder().password(pw).spawn();
    let plain = format!("redis://127.0.0.1:{}", server.port());
    let in_url = format!("redis://:{pw}@127.0.0.1:{}", server.port());
    let dir = tempfile::tempdir().unwrap();
    let file = temp_file(dir.path(), "pw");
    std::fs::write(&file, format!("{pw}\n")).unwrap();
    let wrong_file = temp_file(dir.path(), "wrong");
    std::fs::write(&wrong_file, format!("{pw}-wrong\n")).unwrap();
    let ways: Vec<(Command, i32)> = vec![
        (
            {
                let mut c = dlm();
                c.args(["run", "-vv", "--redis", &in_url, "pw", "--", "true"]);
                c
            },
            0,
        ),
        (
            {
                let mut c = dlm();
                c.env("DLM_REDIS_PASSWORD", pw)
                    .args(["run", "-vv", "--redis", &plain, "pw", "--", "true"]);
                c
            },
            0,
        ),
        (
            {
                let mut c = dlm();
                c.env("DLM_REDIS_URL", &plain)
                    .arg("run")
                    .arg("-vv")
                    .arg("--password-file")
                    .arg(&file)
                    .args(["pw", "--", "true"]);
                c
            },
            0,
        ),
        (
            {
                let mut c = dlm();
                c.args([
                    "run",
                    "-vv",
                    "--redis",
                    &format!("redis://:{pw}-wrong@127.0.0.1:{}", server.port()),
                    "pw",
                    "--",
                    "true",
                ]);
                c
            },
            69,
        ),
        (
            {
                let mut c = dlm();
                c.env("DLM_REDIS_PASSWORD", format!("{pw}-wrong"))
                    .args(["status", "-vv", "--redis", &plain, "pw"]);
                c
            },
            69,
        ),
        (
            {
                let mut c = dlm();
                c.arg("run")
                    .arg("-vv")
                    .arg("--password-file")
                    .arg(&wrong_file)
                    .args(["--redis", &plain, "pw", "--", "true"]);
                c
            },
            69,
        ),
    ];
    for (mut cmd, expected) in ways {
        let out = output(&mut cmd);
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert_eq!(code(&out), expected, "{cmd:?}: {all}");
        assert!(!all.contains(pw), "the password was shown: {all}");
    }
}

#[test]
fn status_and_forced_unlock() {
    let _s = SERIAL.lock();
    let server = server();
    let url = server.url();
    let mut holder =
        Running::start(dlm().args(["run", "--redis", &url, "admin", "--", "sleep", "30"]));
    wait_until(Duration::from_secs(10), "the holder", || {
        held(&url, "admin")
    });
    let out = output(dlm().args(["status", "--json", "--redis", &url, "admin", "free \"one\""]));
    let json = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        json.starts_with("[{\"name\": \"admin\", \"held\": true, \"remaining_ms\": "),
        "{json}"
    );
    assert!(
        json.ends_with(
            "{\"name\": \"free \\\"one\\\"\", \"held\": false, \"remaining_ms\": null}]"
        ),
        "{json}"
    );
    let out = output(dlm().args(["unlock", "--force", "--yes", "--redis", &url, "admin"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("released"));
    assert!(!held(&url, "admin"));
    // The holder learns it at its release at the latest: the lost-lock status.
    assert!(
        Command::new("kill")
            .args(["-TERM", &holder.pid().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let (status, err) = holder.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(70), "{err}");
}
