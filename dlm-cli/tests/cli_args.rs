//! The real `dlm` binary's arguments and secrets: bad input gets a clear message and
//! status 2 before any I/O, errors name dlm's own flags, URL lists that are no sound
//! deployment are refused, `--help`'s examples, and passwords never show nor reach the
//! command.
//!
//! Every test takes `SERIAL` (they start servers and processes; CI machines have 2 cores).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Proc, SERIAL, dlm, q, read, read_pid, run, server};
use dlm_testkit::redis_server::RedisServer;

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
