//! The real `dlm` binary's arguments and secrets: bad input gets a clear message and
//! status 64 (EX_USAGE) before any I/O, a refused password 77 (EX_NOPERM), errors name
//! dlm's own flags, URL lists that are no sound deployment are refused, `--help`'s
//! examples, and passwords never show nor reach the command.
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
            64,
            "scheme",
        ),
        (
            s(&["run", "--redis", "redis://127.0.0.1:1", "n", "--", "true"]),
            69,
            "127.0.0.1:1",
        ),
        (
            s(&["run", "--redis", &wrong, "n", "--", "true"]),
            77,
            "auth",
        ),
        (s(&["status", "--redis", &wrong, "n"]), 77, "auth"),
        (s(&["run", "--redis", &url, "", "--", "true"]), 64, "empty"),
        (
            s(&["run", "--redis", &url, &long, "--", "true"]),
            64,
            "513 bytes",
        ),
        (
            s(&["run", "--redis", &url, "a\tb", "--", "true"]),
            64,
            "control",
        ),
        (s(&["status", "--redis", &url, ""]), 64, "empty"),
        (s(&["run", "--redis", &url, "n"]), 64, "no command"),
        (s(&["run", "n", "--", "true"]), 64, "no backend"),
        (s(&["status", "n"]), 64, "no backend"),
        (s(&["unlock", "--redis", &url, "n"]), 64, "--force"),
        (
            s(&["run", "--redis", &url, "--lease", "0", "n", "--", "true"]),
            64,
            "lease",
        ),
        (
            s(&["run", "--redis", &url, "-w", "x", "n", "--", "true"]),
            64,
            "seconds",
        ),
        (
            s(&["run", "--redis", &url, "-n", "-w", "1", "n", "--", "true"]),
            64,
            "--wait",
        ),
        (
            s(&[
                "run",
                "--redis",
                &format!("{url},{url},{url}"),
                "n",
                "--",
                "true",
            ]),
            64,
            "bad --redis: nodes 0 and 1 are the same server",
        ),
        // TLS flags with plain redis:// URLs (etcd's https:// case: cli_etcd.rs).
        (
            s(&[
                "run",
                "--redis",
                &url,
                "--tls-ca-file",
                "/nonexistent/ca.pem",
                "n",
                "--",
                "true",
            ]),
            64,
            "need a url with the rediss:// scheme",
        ),
        (s(&["frobnicate"]), 64, "unrecognized subcommand"),
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

/// Settings the library rejects are named by the flag that set them, not by the
/// library's setting (`--watchdog`, not `watchdog_timeout`), before any I/O (the server's
/// port is closed).
#[test]
fn errors_name_dlms_own_flags() {
    let _serial = SERIAL.lock();
    let closed = "redis://127.0.0.1:1/";
    let says = |args: &[&str], text: &str| {
        let done = run(dlm()
            .arg("run")
            .args(args)
            .args(["--redis", closed, "n", "--", "true"]));
        done.expect(64);
        assert_eq!(done.stderr, format!("dlm: {text}\n"), "{args:?}");
    };
    says(
        &["--watchdog", "0.002"],
        "bad --watchdog: must be at least 3 ms",
    );
    says(
        &["--watchdog", "0"],
        "bad --watchdog: 0ns is below the minimum of 1 ms",
    );
    says(
        &["--lease", "0"],
        "bad --lease: 0ns is below the minimum of 1 ms",
    );
    says(
        &["--prefix", "a{b"],
        "bad --prefix: must not contain braces or control characters",
    );
    says(
        &["--wait-replicas", "0"],
        "bad --wait-replicas: at least 1 replica (0 waits for nothing)",
    );
    let done = run(dlm()
        .args(["run", "--wait-replicas", "1", "--wait-timeout", "5"])
        .args(["--redis", closed, "n", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr.starts_with("dlm: bad --wait-timeout: the timeout must be positive and shorter than the reply deadline (1s)"),
        "{}",
        done.stderr
    );
    let done = run(dlm()
        .env("DLM_REDIS_URL", "foo://x")
        .args(["run", "n", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr.starts_with("dlm: bad $DLM_REDIS_URL: "),
        "{}",
        done.stderr
    );
}

/// A plain URL list is one server or Redlock over 3 or more: two URLs (Redlock of 2,
/// where either one down stops every lock) and one URL written as a list are refused,
/// before any I/O, saying why. `--cluster` and `--sentinel` take any number of seeds.
#[test]
fn url_lists_that_are_no_sound_redlock_are_refused() {
    let _serial = SERIAL.lock();
    let (a, b) = ("redis://127.0.0.1:1/", "redis://127.0.0.1:2/");
    let why = "Redlock needs 3 or more independent masters; for one server, give one URL";
    for (urls, text) in [
        (
            format!("{a},{b}"),
            format!(
                "dlm: --redis gives 2 URLs: {why} (with 2, a majority is both: either one down stops every lock)\n"
            ),
        ),
        (
            format!("{a},"),
            format!("dlm: --redis is a list of one URL: {why} (without a comma)\n"),
        ),
    ] {
        let done = run(dlm().args(["run", "--redis", &urls, "n", "--", "true"]));
        done.expect(64);
        assert_eq!(done.stderr, text);
        let done = run(dlm().args(["status", "--redis", &urls, "n"]));
        done.expect(64);
        assert_eq!(done.stderr, text);
    }
    let done = run(dlm()
        .env("DLM_REDIS_URL", format!("{a},{b}"))
        .args(["run", "n", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr
            .starts_with("dlm: $DLM_REDIS_URL gives 2 URLs: Redlock needs 3"),
        "{}",
        done.stderr
    );
    // Two sentinels or two cluster seeds are fine: they get past the check to the I/O,
    // which finds nothing listening (69).
    for mode in [&["--sentinel", "m"][..], &["--cluster"]] {
        let done = run(dlm().arg("run").args(mode).args([
            "--redis",
            &format!("{a},{b}"),
            "n",
            "--",
            "true",
        ]));
        done.expect(69);
    }
}

/// A command given without `--` is refused with the fix, before any I/O.
#[test]
fn a_command_without_the_double_dash_gets_a_hint() {
    let _serial = SERIAL.lock();
    let done = run(dlm().args([
        "run",
        "--redis",
        "redis://127.0.0.1:1/",
        "job",
        "echo",
        "hi",
    ]));
    done.expect(64);
    assert_eq!(
        done.stderr,
        "dlm: put the command after --: dlm run [OPTIONS] job -- echo hi (or give a shell command with -c)\n"
    );
    // Its own options are not read as dlm's.
    let done = run(dlm().args(["run", "--redis", "redis://127.0.0.1:1/", "job", "ls", "-l"]));
    done.expect(64);
    assert!(done.stderr.contains("-- ls -l "), "{}", done.stderr);
    let done = run(dlm().args([
        "run",
        "--redis",
        "redis://127.0.0.1:1/",
        "job",
        "-c",
        "echo",
        "hi",
    ]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("-c takes the whole shell command as one argument"),
        "{}",
        done.stderr
    );
}

/// The examples of `--help` are shell that works when pasted: a line ending in `\`
/// continues on the next, indented line (the Sentinel example had lost its `\` and ran
/// on into one line).
#[test]
fn the_help_examples_continue_their_lines() {
    for args in [&["--help"][..], &["run", "--help"]] {
        let done = run(dlm().args(args));
        done.expect(0);
        let help = &done.stdout;
        assert!(
            help.contains("redis://10.0.2.2:26379 \\\n    --wait-replicas 1 --password-file"),
            "{args:?}: the Sentinel example:\n{help}"
        );
        let lines: Vec<&str> = help.lines().collect();
        let mut continued = 0;
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("dlm ")
                || line.trim_start().starts_with("DLM_REDIS_URL=")
            {
                assert!(line.len() <= 100, "{args:?}: a long example line: {line}");
            }
            if line.ends_with(" \\") {
                continued += 1;
                assert!(
                    lines
                        .get(i + 1)
                        .is_some_and(|next| next.starts_with("    ")),
                    "{args:?}: line {i} continues on no indented line:\n{help}"
                );
            }
        }
        assert_eq!(
            continued, 2,
            "{args:?}: the two multi-line examples:\n{help}"
        );
    }
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
        (Way::Url(WRONG), 77),
        (Way::Env(WRONG), 77),
        (Way::File(&wrong_file), 77),
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

/// The command does not get dlm's secrets: `DLM_REDIS_PASSWORD` is removed from its
/// environment, and so is `DLM_REDIS_URL` when a URL in it carries a password; a URL list
/// without one stays (a nested `dlm` can use it), and so does the rest of the environment
/// and what dlm sets for the command.
#[test]
fn the_command_does_not_get_dlms_secrets() {
    let _serial = SERIAL.lock();
    const PW: &str = "Env-Secret-Pa55";
    let secured = RedisServer::builder().password(PW).spawn();
    let plain = format!("redis://127.0.0.1:{}/", secured.port());
    let with_pw = format!("redis://:{PW}@127.0.0.1:{}/", secured.port());
    let open = server();
    let env_of = |c: &mut std::process::Command, redis: &[&str]| {
        let done = run(c
            .env("OTHER_VAR", "kept")
            .arg("run")
            .args(redis)
            .args(["secrets", "--", "env"]));
        done.expect(0);
        let vars: Vec<(String, String)> = done
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert!(
            !done.stdout.contains(PW),
            "the password reached the command:\n{}",
            done.stdout
        );
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("OTHER_VAR").as_deref(), Some("kept"));
        assert_eq!(get("DLM_LOCK_NAME").as_deref(), Some("secrets"));
        assert!(get("DLM_FENCING_TOKEN").is_some_and(|t| t.parse::<u64>().is_ok()));
        assert_eq!(get("DLM_REDIS_PASSWORD"), None);
        get("DLM_REDIS_URL")
    };
    // The password in DLM_REDIS_PASSWORD, the URL (without one) in DLM_REDIS_URL: the URL
    // stays, the password goes.
    let url = env_of(
        dlm()
            .env("DLM_REDIS_PASSWORD", PW)
            .env("DLM_REDIS_URL", &plain),
        &[],
    );
    assert_eq!(url.as_deref(), Some(plain.as_str()));
    // The password inside DLM_REDIS_URL: the variable goes.
    assert_eq!(env_of(dlm().env("DLM_REDIS_URL", &with_pw), &[]), None);
    // The password given with --redis; DLM_REDIS_PASSWORD set but unused: it goes too.
    assert_eq!(
        env_of(dlm().env("DLM_REDIS_PASSWORD", PW), &["--redis", &with_pw]),
        None
    );
    // No secret at all: DLM_REDIS_URL stays.
    assert_eq!(
        env_of(dlm().env("DLM_REDIS_URL", open.url()), &[]).as_deref(),
        Some(open.url().as_str())
    );
}

/// A backend flag goes before every backend variable (they are not a conflict), the Redis
/// options are refused beside another backend's variable, and `$DLM_PASSWORD` is the
/// password on Redis too: after `$DLM_REDIS_PASSWORD`, refused with 77 when wrong, never
/// given to the command. Clap's own usage errors exit 64 as dlm's do.
#[test]
fn flags_go_before_variables_and_dlm_password_is_every_backends() {
    let _serial = SERIAL.lock();
    const PW: &str = "Any-Backend-Pa55";
    let secured = RedisServer::builder().password(PW).spawn();
    let plain = format!("redis://127.0.0.1:{}/", secured.port());
    let nowhere = [
        ("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:1"),
        ("DLM_POSTGRES_URL", "postgresql://u@127.0.0.1:1/db"),
        ("DLM_REDIS_URL", "redis://127.0.0.1:1"),
    ];
    // --redis with the three variables set (one of them Redis's own): the flag's server.
    run(dlm()
        .envs(nowhere)
        .env("DLM_PASSWORD", PW)
        .args(["run", "--redis", &plain, "vars", "--", "sh", "-c"])
        .arg("test -z \"$DLM_PASSWORD\""))
    .expect(0);
    // $DLM_REDIS_PASSWORD goes before $DLM_PASSWORD.
    run(dlm()
        .env("DLM_REDIS_PASSWORD", PW)
        .env("DLM_PASSWORD", "wrong")
        .args(["run", "--redis", &plain, "vars", "--", "true"]))
    .expect(0);
    let done = run(dlm()
        .env("DLM_PASSWORD", "Wrong-Pa55")
        .args(["status", "--redis", &plain, "vars"]));
    done.expect(77);
    // The message names the backend it is about.
    assert!(
        done.stderr
            .starts_with("dlm: cannot read \"vars\" (1 server): ")
            && done.stderr.contains("auth"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("Pa55"), "{}", done.stderr);
    // --etcd with $DLM_REDIS_URL set: etcd (nothing listens: 69, not a usage error).
    let done = run(dlm().env("DLM_REDIS_URL", &plain).args([
        "run",
        "-n",
        "--etcd",
        "http://127.0.0.1:1",
        "x",
        "--",
        "true",
    ]));
    done.expect(69);
    // A Redis option beside another backend's variable: named as the user set it.
    let done = run(dlm().env("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:1").args([
        "run",
        "--cluster",
        "x",
        "--",
        "true",
    ]));
    done.expect(64);
    assert_eq!(
        done.stderr,
        "dlm: --cluster cannot be used with $DLM_ETCD_ENDPOINTS: it is a Redis option\n"
    );
    // Two backend flags.
    let done = run(dlm().args([
        "run",
        "--redis",
        &plain,
        "--postgres",
        "postgresql://u@127.0.0.1:1/db",
        "x",
        "--",
        "true",
    ]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("--postgres cannot be used with --redis"),
        "{}",
        done.stderr
    );
    // Clap's errors: no subcommand, an unknown option, a bad value.
    for args in [
        &[][..],
        &["run", "--frobnicate"],
        &["run", "--on-lost", "x"],
    ] {
        let done = run(dlm().args(args));
        done.expect(64);
        assert!(
            done.stderr.starts_with("error: ") || done.stderr.contains("Usage: dlm <COMMAND>"),
            "{args:?}: {}",
            done.stderr
        );
    }
    // --help and --version are no errors.
    run(dlm().arg("--help")).expect(0);
    run(dlm().arg("--version")).expect(0);
}
