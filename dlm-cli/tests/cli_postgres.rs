//! The real `dlm` binary on PostgreSQL (`--postgres`, `$DLM_POSTGRES_URL`): the same flags,
//! exit statuses and password rules as on Redis and etcd, against real PostgreSQL servers
//! from the testkit.
//!
//! Every test takes `SERIAL`, so they run one at a time even without `--test-threads=1`.
//! The tests that need a plain server share one (`SERVER`, with lock names of their own);
//! those that stop it, or need a password or TLS, start their own.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{Done, Json, Proc, SERIAL, dlm, q, read, run, wait_until};
use dlm_testkit::Shared;
use dlm_testkit::postgres::{PostgresOptions, PostgresServer};
use dlm_testkit::tls::{ServerCert, TestPki};

/// dlm-postgres's default connect timeout: a server that does not answer fails a call
/// after it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const TEN: Duration = Duration::from_secs(10);

/// The plain server (every connection trusted) of the tests that do not stop it.
static SERVER: Shared<PostgresServer> = Shared::new();

fn shared() -> Arc<PostgresServer> {
    SERVER.get(PostgresServer::spawn)
}

/// `dlm status --postgres URL NAME --json` says whether `name` is held.
#[track_caller]
fn is_held(url: &str, name: &str) -> bool {
    let done = run(dlm().args(["status", "--postgres", url, name, "--json"]));
    done.expect(0);
    Json::parse(&done.stdout).array()[0].get("held") == &Json::Bool(true)
}

/// The command's fencing token, printed by `echo $DLM_FENCING_TOKEN`.
#[track_caller]
fn token_of(done: &Done) -> u64 {
    done.stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a token: {:?}", done.stdout))
}

/// A command that appends `started` to `out`, waits until `go` exists, then appends
/// `finished`: the test decides when it ends.
fn waits_for(out: &Path, go: &Path) -> String {
    format!(
        "echo started >> {o}; while [ ! -e {g} ]; do sleep 0.05; done; echo finished >> {o}",
        o = q(out),
        g = q(go)
    )
}

/// A free loopback port, held by a listener that no one accepts on: a connection to it
/// would wait in its backlog, where the test can see it.
fn silent_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    (listener, port)
}

/// Asserts that nobody connected to `listener`.
#[track_caller]
fn never_connected(listener: &TcpListener, what: &str) {
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("{what}: dlm connected ({other:?})"),
    }
}

#[test]
fn run_status_and_forced_unlock_on_postgres() {
    let _serial = SERIAL.lock();
    let server = shared();
    let url = server.url();

    // The command gets its name and a token; the next run's token is larger.
    let job = |url: &str| {
        let done = run(dlm().args([
            "run",
            "--postgres",
            url,
            "pg-job",
            "--",
            "sh",
            "-c",
            "test \"$DLM_LOCK_NAME\" = pg-job && echo $DLM_FENCING_TOKEN",
        ]));
        done.expect(0);
        token_of(&done)
    };
    let first = job(&url);
    let second = job(&url);
    assert!(second > first, "tokens {first} then {second}");
    // postgres:// is PostgreSQL's other scheme.
    let third = job(&url.replacen("postgresql://", "postgres://", 1));
    assert!(third > second, "tokens {second} then {third}");

    // A holder; the lock is a row of dlm.locks at the server.
    let dir = tempfile::tempdir().unwrap();
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--postgres", &url, "pg-admin", "-c"])
            .arg(waits_for(&out, &go)),
    );
    wait_until(TEN, "the holder started", || read(&out) == "started\n");
    assert_eq!(
        server.psql("select count(*) from dlm.locks where name = 'pg-admin' and expires > now()"),
        "1"
    );
    // A second run is refused (-n), with its conflict exit code.
    run(dlm().args(["run", "-n", "--postgres", &url, "pg-admin", "--", "true"])).expect(1);
    run(dlm().args([
        "run",
        "-n",
        "-E",
        "75",
        "--postgres",
        &url,
        "pg-admin",
        "--",
        "true",
    ]))
    .expect(75);
    // Another --prefix is another schema, so another lock.
    run(dlm().args([
        "run",
        "-n",
        "--postgres",
        &url,
        "--prefix",
        "dlm_other",
        "pg-admin",
        "--",
        "true",
    ]))
    .expect(0);
    assert_eq!(
        server.psql("select count(*) from pg_namespace where nspname = 'dlm_other'"),
        "1"
    );

    // $DLM_POSTGRES_URL stands for --postgres.
    let done = run(dlm()
        .env("DLM_POSTGRES_URL", &url)
        .args(["status", "pg-admin", "pg-other", "--json"]));
    done.expect(0);
    let rows = Json::parse(&done.stdout);
    let rows = rows.array();
    assert_eq!(rows[0].get("held"), &Json::Bool(true), "{}", done.stdout);
    let remaining = rows[0].get("remaining_ms").u64();
    assert!(
        remaining > 0 && remaining <= 30_000,
        "remaining_ms {remaining}"
    );
    assert_eq!(rows[1].get("held"), &Json::Bool(false));
    let plain = run(dlm()
        .env("DLM_POSTGRES_URL", &url)
        .args(["status", "pg-admin", "pg-other"]));
    plain.expect(0);
    let lines: Vec<&str> = plain.stdout.lines().collect();
    assert!(
        lines.len() == 2
            && lines[0].starts_with("pg-admin\theld\t")
            && lines[0].ends_with("s left")
            && lines[1] == "pg-other\tfree",
        "{}",
        plain.stdout
    );
    // $DLM_POSTGRES_URL for run too: refused while held.
    run(dlm()
        .env("DLM_POSTGRES_URL", &url)
        .args(["run", "-n", "pg-admin", "--", "true"]))
    .expect(1);

    // unlock --force: the holder is not told at once; it learns at its next renewal and
    // its command is stopped (70), as on Redis.
    let done = run(dlm().args(["unlock", "--force", "--yes", "--postgres", &url, "pg-admin"]));
    done.expect(0);
    assert_eq!(done.stdout, "pg-admin\treleased\n");
    assert!(!is_held(&url, "pg-admin"));
    let again = run(dlm().args(["unlock", "--force", "--yes", "--postgres", &url, "pg-admin"]));
    again.expect(0);
    assert_eq!(again.stdout, "pg-admin\tfree (was not held)\n");
    std::fs::write(&go, "").unwrap();
    let done = holder.wait(Duration::from_secs(20));
    done.expect(70);
    assert!(done.stderr.contains("lost"), "{}", done.stderr);
}

/// `--permits N` and `--shared` / `--exclusive` on PostgreSQL: N commands at once, readers
/// together and a writer alone, and `status --permits` shows the holders.
#[test]
fn semaphores_and_read_write_locks_on_postgres() {
    let _serial = SERIAL.lock();
    let server = shared();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let hold = |flags: &[&str], name: &str, id: &str| {
        let (out, go) = (dir.path().join(id), dir.path().join(format!("go-{id}")));
        let proc = Proc::spawn(
            dlm()
                .args(["run", "--postgres", &url])
                .args(flags)
                .arg(name)
                .arg("-c")
                .arg(waits_for(&out, &go)),
        );
        wait_until(TEN, &format!("holder {id} started"), || {
            read(&out) == "started\n"
        });
        (proc, go)
    };
    let try_once = |flags: &[&str], name: &str| {
        run(dlm()
            .args(["run", "-n", "--postgres", &url])
            .args(flags)
            .args([name, "--", "true"]))
        .code()
    };

    let (mut a, go_a) = hold(&["--permits", "2", "--label", "a"], "pg-sem", "a");
    let (mut b, go_b) = hold(&["--permits", "2", "--label", "b"], "pg-sem", "b");
    assert_eq!(try_once(&["--permits", "2"], "pg-sem"), 1, "a third permit");
    let done = run(dlm().args([
        "status",
        "--postgres",
        &url,
        "--permits",
        "2",
        "pg-sem",
        "--json",
    ]));
    done.expect(0);
    let rows = Json::parse(&done.stdout);
    let row = &rows.array()[0];
    assert_eq!(row.get("holders").u64(), 2, "{}", done.stdout);
    let mut labels: Vec<&str> = row
        .get("held_by")
        .array()
        .iter()
        .map(|h| h.get("label").str())
        .collect();
    labels.sort_unstable();
    assert_eq!(labels, ["a", "b"], "{}", done.stdout);
    std::fs::write(&go_a, "").unwrap();
    a.wait(TEN).expect(0);
    assert_eq!(try_once(&["--permits", "2"], "pg-sem"), 0, "a freed permit");
    std::fs::write(&go_b, "").unwrap();
    b.wait(TEN).expect(0);

    let (mut reader, go_r) = hold(&["--shared"], "pg-rw", "r");
    assert_eq!(try_once(&["--shared"], "pg-rw"), 0, "a second reader");
    assert_eq!(
        try_once(&["--exclusive"], "pg-rw"),
        1,
        "a writer beside a reader"
    );
    std::fs::write(&go_r, "").unwrap();
    reader.wait(TEN).expect(0);
    assert_eq!(try_once(&["--exclusive"], "pg-rw"), 0, "a writer alone");
}

/// Bad input is a usage error (64) before any I/O; the backend comes from the one flag, or
/// without a flag from the one variable that is set.
#[test]
fn postgres_usage_errors_and_the_choice_of_backend() {
    let _serial = SERIAL.lock();
    let (listener, port) = silent_listener();
    let ours = |extra: &str| format!("postgresql://postgres@127.0.0.1:{port}/postgres{extra}");
    let redis_like = format!("redis://127.0.0.1:{port}");
    let us = ours("");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--postgres", &redis_like],
            "bad --postgres: a PostgreSQL URL starts with postgresql:// or postgres://, not redis://",
        ),
        (
            vec!["--postgres", "127.0.0.1:5432"],
            "bad --postgres: a PostgreSQL URL starts with postgresql://",
        ),
        (
            vec!["--postgres", "postgresql://127.0.0.1:5432/app"],
            "bad --postgres: name the user",
        ),
        (
            vec!["--postgres", &us, "--prefix", "Bad-Schema"],
            "bad --prefix: must be 1 to 40 bytes",
        ),
        (
            vec!["--postgres", &us, "--redis", "redis://x"],
            "cannot be used with",
        ),
        (
            vec!["--postgres", &us, "--etcd", "http://x"],
            "cannot be used with",
        ),
        (vec!["--postgres", &us, "--cluster"], "cannot be used with"),
        (
            vec!["--postgres", &us, "--sentinel", "m"],
            "cannot be used with",
        ),
        (
            vec!["--postgres", &us, "--wait-replicas", "1"],
            "cannot be used with",
        ),
        (
            vec!["--postgres", &us, "--password-file", "/nonexistent/pw"],
            "cannot read the password file",
        ),
    ];
    for (args, why) in &cases {
        let done = run(dlm().arg("run").args(args).args(["x", "--", "true"]));
        done.expect(64);
        assert!(done.stderr.contains(why), "{args:?}: {}", done.stderr);
    }
    // TLS flags with a URL that says sslmode=disable.
    let pki = TestPki::new();
    let done = run(dlm()
        .args([
            "run",
            "--postgres",
            &ours("?sslmode=disable"),
            "--tls-ca-file",
        ])
        .arg(pki.ca_file())
        .args(["x", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("bad TLS options: TLS settings were given, but the URL says sslmode=disable"),
        "{}",
        done.stderr
    );
    // From the environment: named as such.
    let done = run(dlm()
        .env("DLM_POSTGRES_URL", &redis_like)
        .args(["status", "x"]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("bad $DLM_POSTGRES_URL: a PostgreSQL URL"),
        "{}",
        done.stderr
    );
    never_connected(&listener, "usage errors");

    // Two backend variables and no flag: which one is meant is not guessed.
    for (vars, says) in [
        (
            &[("DLM_REDIS_URL", "redis://127.0.0.1:1")][..],
            "both DLM_REDIS_URL and DLM_POSTGRES_URL are set: give --redis or --postgres",
        ),
        (
            &[("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:1")],
            "both DLM_ETCD_ENDPOINTS and DLM_POSTGRES_URL are set: give --etcd or --postgres",
        ),
        (
            &[
                ("DLM_REDIS_URL", "redis://127.0.0.1:1"),
                ("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:1"),
            ],
            "DLM_REDIS_URL, DLM_ETCD_ENDPOINTS and DLM_POSTGRES_URL are all set: give --redis, --etcd or --postgres",
        ),
    ] {
        let done = run(dlm()
            .envs(vars.iter().copied())
            .env("DLM_POSTGRES_URL", &us)
            .args(["run", "x", "--", "true"]));
        done.expect(64);
        assert_eq!(done.stderr, format!("dlm: {says}\n"), "{vars:?}");
    }
    let done = run(dlm().args(["run", "x", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr.contains("or --postgres URL") && done.stderr.contains("DLM_POSTGRES_URL"),
        "{}",
        done.stderr
    );
    never_connected(&listener, "two variables");

    // A flag wins over every variable: --postgres over the others'...
    let server = shared();
    run(dlm()
        .env("DLM_REDIS_URL", "redis://127.0.0.1:1")
        .env("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:1")
        .env("DLM_POSTGRES_URL", &redis_like)
        .args(["run", "--postgres", &server.url(), "x", "--", "true"]))
    .expect(0);
    // ...and --redis over $DLM_POSTGRES_URL (Redis is asked, and is not there).
    let done = run(dlm().env("DLM_POSTGRES_URL", server.url()).args([
        "run",
        "-n",
        "--redis",
        "redis://127.0.0.1:1",
        "x",
        "--",
        "true",
    ]));
    done.expect(69);
    assert!(
        done.stderr.contains("127.0.0.1:1") && !done.stderr.contains("PostgreSQL"),
        "{}",
        done.stderr
    );
}

/// A server that is stopped (SIGSTOP: it answers nothing) or killed (`kill -9`: the port
/// refuses) is the backend's failure (69), for `run` and `status`, within the connect
/// timeout; the message names the server.
#[test]
fn a_stopped_or_killed_server_is_the_backends_failure() {
    let _serial = SERIAL.lock();
    let mut server = PostgresServer::spawn();
    let url = server.url();
    let here = format!("postgres (127.0.0.1:{})", server.port());
    let once = |cmd: &str| {
        let mut c = dlm();
        c.arg(cmd).args(["--postgres", &url]);
        if cmd == "run" {
            c.args(["-n", "pg-down", "--", "true"]);
        } else {
            c.arg("pg-down");
        }
        run(&mut c)
    };
    once("run").expect(0);

    server.pause();
    for cmd in ["run", "status"] {
        let done = once(cmd);
        done.expect(69);
        assert!(
            done.took < CONNECT_TIMEOUT + Duration::from_secs(3),
            "{cmd}: took {:?}",
            done.took
        );
        assert!(done.stderr.contains("took more than"), "{}", done.stderr);
    }
    assert!(once("run").stderr.contains(&here));
    server.resume();
    once("run").expect(0);

    server.kill();
    for cmd in ["run", "status"] {
        let done = once(cmd);
        done.expect(69);
        // Refused at once: well within the connect timeout.
        assert!(done.took < CONNECT_TIMEOUT, "{cmd}: took {:?}", done.took);
        assert!(
            done.stderr.contains("Connection refused"),
            "{}",
            done.stderr
        );
    }
    let done = once("run");
    assert!(done.stderr.contains(&here), "{}", done.stderr);
    // -w: retried for the wait, then the same failure.
    let done = run(dlm().args([
        "run",
        "-w",
        "1",
        "--postgres",
        &url,
        "pg-down",
        "--",
        "true",
    ]));
    done.expect(69);
    assert!(
        done.took < Duration::from_secs(1) + CONNECT_TIMEOUT + Duration::from_secs(2),
        "took {:?}",
        done.took
    );
}

/// Its first line is the password.
fn password_file(dir: &Path, name: &str, password: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

/// The password of a server that asks for one: from the URL, else `--password-file`,
/// `$DLM_POSTGRES_PASSWORD`, `$DLM_PASSWORD` or libpq's `$PGPASSWORD` (not
/// `$DLM_REDIS_PASSWORD`). Right or wrong, with `-vv`, it shows in no output; the command
/// does not get it. A refused password is 77 (EX_NOPERM).
#[test]
fn postgres_passwords_as_on_redis_and_never_shown() {
    let _serial = SERIAL.lock();
    // URL delimiters and a percent escape: sent verbatim from a file or the environment.
    const PW: &str = "s3cr3t@Pa55:w/rd%41?";
    const WRONG: &str = "wr0ng@Pa55:w/rd";
    let mut options = PostgresOptions::default();
    options.password = Some(PW.into());
    let server = PostgresServer::spawn_with(options);
    let urls = [
        server.url_for("postgres", None, "postgres"),
        server.url(),
        server.url_for("postgres", Some(WRONG), "postgres"),
    ];
    let [plain, with_pw, with_wrong] = [&urls[0], &urls[1], &urls[2]].map(String::as_str);
    let dir = tempfile::tempdir().unwrap();
    let right_file = password_file(dir.path(), "right", PW);
    let wrong_file = password_file(dir.path(), "wrong", WRONG);
    let leaks = |text: &str| text.contains("s3cr3t") || text.contains("wr0ng");

    // How the password is given, and the status that follows.
    type Way<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, i32);
    let f = |p: &Path| p.to_str().unwrap().to_owned();
    let (right, wrong) = (f(&right_file), f(&wrong_file));
    let ways: Vec<Way<'_>> = vec![
        (
            "--password-file",
            vec![],
            vec!["--postgres", plain, "--password-file", &right],
            0,
        ),
        (
            "$DLM_POSTGRES_PASSWORD",
            vec![("DLM_POSTGRES_PASSWORD", PW)],
            vec!["--postgres", plain],
            0,
        ),
        (
            "the file and $DLM_POSTGRES_URL",
            vec![("DLM_POSTGRES_URL", plain)],
            vec!["--password-file", &right],
            0,
        ),
        ("the URL", vec![("DLM_POSTGRES_URL", with_pw)], vec![], 0),
        (
            "the URL's before $DLM_POSTGRES_PASSWORD",
            vec![("DLM_POSTGRES_PASSWORD", WRONG)],
            vec!["--postgres", with_pw],
            0,
        ),
        (
            "$PGPASSWORD",
            vec![("PGPASSWORD", PW)],
            vec!["--postgres", plain],
            0,
        ),
        (
            "$DLM_POSTGRES_PASSWORD before $PGPASSWORD",
            vec![("DLM_POSTGRES_PASSWORD", PW), ("PGPASSWORD", WRONG)],
            vec!["--postgres", plain],
            0,
        ),
        (
            "a wrong file",
            vec![],
            vec!["--postgres", plain, "--password-file", &wrong],
            77,
        ),
        (
            "a wrong variable",
            vec![("DLM_POSTGRES_PASSWORD", WRONG)],
            vec!["--postgres", plain],
            77,
        ),
        (
            "a wrong URL",
            vec![("DLM_POSTGRES_PASSWORD", PW)],
            vec!["--postgres", with_wrong],
            77,
        ),
        (
            "Redis's variable",
            vec![("DLM_REDIS_PASSWORD", PW)],
            vec!["--postgres", plain],
            77,
        ),
        (
            "$DLM_PASSWORD",
            vec![("DLM_PASSWORD", PW), ("PGPASSWORD", WRONG)],
            vec!["--postgres", plain],
            0,
        ),
        (
            "$DLM_POSTGRES_PASSWORD before $DLM_PASSWORD",
            vec![("DLM_POSTGRES_PASSWORD", PW), ("DLM_PASSWORD", WRONG)],
            vec!["--postgres", plain],
            0,
        ),
        ("none", vec![], vec!["--postgres", plain], 77),
    ];
    for (what, env, backend, code) in &ways {
        let subs: &[&[&str]] = if *code == 0 {
            &[
                &["run", "-vv", "pg-pw", "--", "true"],
                &["status", "-vv", "pg-pw"],
                &["unlock", "-vv", "--force", "--yes", "pg-pw"],
            ]
        } else {
            &[
                &["run", "-vv", "pg-pw", "--", "true"],
                &["status", "-vv", "pg-pw"],
            ]
        };
        for sub in subs {
            let done = run(dlm()
                .envs(env.iter().copied())
                .arg(sub[0])
                .args(backend)
                .args(&sub[1..]));
            done.expect(*code);
            let all = format!("{}\n{}", done.stdout, done.stderr);
            assert!(!leaks(&all), "{what} {sub:?} showed a password:\n{all}");
            if *code == 0 {
                assert!(
                    done.stderr
                        .contains("dlm: info: backend: postgres (127.0.0.1:")
                );
            } else {
                assert!(
                    done.stderr.contains("authentication failed"),
                    "{what}: {}",
                    done.stderr
                );
            }
        }
    }

    // The command gets none of dlm's secrets: not $DLM_POSTGRES_PASSWORD, and not
    // $DLM_POSTGRES_URL when the URL has a password (as user:pw@, with one host or
    // several, or as ?password=); a URL without one stays, for a nested dlm.
    let env_of = |env: &[(&str, &str)]| {
        let done = run(dlm()
            .env("OTHER_VAR", "kept")
            .envs(env.iter().copied())
            .args(["run", "pg-secrets", "--", "env"]));
        done.expect(0);
        assert!(!leaks(&done.stdout), "a secret reached the command");
        let get = |k: &str| {
            done.stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_owned))
        };
        assert_eq!(get("OTHER_VAR").as_deref(), Some("kept"));
        assert!(get("DLM_FENCING_TOKEN").is_some_and(|t| t.parse::<u64>().is_ok()));
        assert_eq!(get("DLM_POSTGRES_PASSWORD"), None);
        get("DLM_POSTGRES_URL")
    };
    assert_eq!(
        env_of(&[("DLM_POSTGRES_URL", plain), ("DLM_POSTGRES_PASSWORD", PW)]).as_deref(),
        Some(plain)
    );
    assert_eq!(env_of(&[("DLM_POSTGRES_URL", with_pw)]), None);
    let port = server.port();
    let encoded = with_pw
        .strip_prefix("postgresql://postgres:")
        .and_then(|rest| rest.split_once('@'))
        .unwrap()
        .0
        .to_owned();
    let two_hosts =
        format!("postgresql://postgres:{encoded}@127.0.0.1:{port},127.0.0.1:{port}/postgres");
    assert_eq!(env_of(&[("DLM_POSTGRES_URL", &two_hosts)]), None);
    let in_query = format!("{plain}?password={encoded}");
    assert_eq!(env_of(&[("DLM_POSTGRES_URL", &in_query)]), None);

    // An empty password file: a usage error.
    let empty = password_file(dir.path(), "empty", "");
    let done = run(dlm()
        .args(["run", "--postgres", plain, "--password-file"])
        .arg(&empty)
        .args(["x", "--", "true"]));
    done.expect(64);
    assert!(done.stderr.contains("is empty"), "{}", done.stderr);
}

/// The files of a TLS server where PostgreSQL can read them: it runs as the OS user
/// `postgres` when the tests run as root, and wants its key readable by itself only.
fn server_tls_files(pki: &TestPki) -> (tempfile::TempDir, [PathBuf; 3]) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (cert, key) = pki.server_cert(ServerCert::Valid);
    let files = [
        (cert, "server.pem", 0o644),
        (key, "server.key", 0o600),
        (pki.ca_file(), "ca.pem", 0o644),
    ]
    .map(|(from, name, mode)| {
        let to = dir.path().join(name);
        std::fs::copy(&from, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
        to
    });
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if root {
        let status = std::process::Command::new("chown")
            .arg("postgres:")
            .args(&files)
            .status()
            .unwrap();
        assert!(status.success(), "chown postgres: {status}");
    }
    (dir, files)
}

/// `--tls-ca-file`, `--tls-cert` and `--tls-key` as on Redis and etcd: the connections
/// use TLS (verified: another CA fails), with the client certificate.
#[test]
fn tls_on_postgres_takes_the_same_tls_flags() {
    let _serial = SERIAL.lock();
    let pki = TestPki::new();
    let (_files, [cert, key, ca]) = server_tls_files(&pki);
    let mut options = PostgresOptions::default();
    options.settings = vec![
        ("ssl".into(), "on".into()),
        ("ssl_cert_file".into(), cert.display().to_string()),
        ("ssl_key_file".into(), key.display().to_string()),
        ("ssl_ca_file".into(), ca.display().to_string()),
    ];
    let server = PostgresServer::spawn_with(options);
    let url = server.url();
    let (client_cert, client_key) = pki.client_cert();
    let tls = |c: &mut std::process::Command, ca: &Path| {
        c.arg("--tls-ca-file")
            .arg(ca)
            .arg("--tls-cert")
            .arg(&client_cert)
            .arg("--tls-key")
            .arg(&client_key);
    };

    // While the command runs, dlm's idle connection is TLS, with the client certificate.
    let dir = tempfile::tempdir().unwrap();
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let mut cmd = dlm();
    cmd.args(["run", "--postgres", &url]);
    tls(&mut cmd, &pki.ca_file());
    cmd.args(["pg-tls", "-c"]).arg(waits_for(&out, &go));
    let mut holder = Proc::spawn(&mut cmd);
    wait_until(TEN, "the holder started", || read(&out) == "started\n");
    let dlm_connections = |condition: &str| {
        server.psql(&format!(
            "select count(*) from pg_stat_activity a join pg_stat_ssl s using (pid) \
             where a.application_name = 'dlm' and {condition}"
        ))
    };
    assert_ne!(
        dlm_connections("s.ssl and s.client_dn like '%CN=client%'"),
        "0"
    );
    assert_eq!(dlm_connections("not s.ssl"), "0");
    std::fs::write(&go, "").unwrap();
    holder.wait(TEN).expect(0);

    // A CA that did not sign the server's certificate, or another name to verify than
    // the certificate's: refused (69), and said.
    for (ca, name) in [
        (pki.other_ca_file(), None),
        (pki.ca_file(), Some("wrong.example")),
    ] {
        let mut cmd = dlm();
        cmd.args(["run", "-n", "--postgres", &url]);
        tls(&mut cmd, &ca);
        if let Some(name) = name {
            cmd.args(["--tls-server-name", name]);
        }
        let done = run(cmd.args(["pg-tls", "--", "true"]));
        done.expect(69);
        assert!(
            done.stderr.to_ascii_lowercase().contains("certificate"),
            "{name:?}: {}",
            done.stderr
        );
    }
}
