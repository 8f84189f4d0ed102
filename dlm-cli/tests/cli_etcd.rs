//! The real `dlm` binary on etcd (`--etcd`, `$DLM_ETCD_ENDPOINTS`): the same flags and the
//! same behaviour as on Redis, against real etcd members from the testkit.
//!
//! Every test takes `SERIAL`, so they run one at a time even without `--test-threads=1`.

mod common;

use std::time::Duration;

use common::{Json, Proc, SERIAL, dlm, q, read, run, wait_until};
use dlm_testkit::etcd::EtcdServer;

/// `dlm status` on etcd says whether `name` is held.
fn is_held(url: &str, name: &str) -> bool {
    let done = run(dlm().args(["status", "--etcd", url, name, "--json"]));
    done.expect(0);
    Json::parse(&done.stdout).array()[0].get("held") == &Json::Bool(true)
}

#[test]
fn run_status_and_forced_unlock_on_etcd() {
    let _serial = SERIAL.lock();
    let server = EtcdServer::spawn();
    let url = server.url();

    // The command gets its name and token.
    let done = run(dlm().args([
        "run",
        "--etcd",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "test \"$DLM_LOCK_NAME\" = job && echo $DLM_FENCING_TOKEN",
    ]));
    done.expect(0);
    assert!(done.stdout.trim().parse::<u64>().is_ok(), "{}", done.stdout);

    // A holder, then a second run refused (-n), with its conflict exit code.
    let dir = tempfile::tempdir().unwrap();
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let mut holder = Proc::spawn(
        dlm()
            .args(["run", "--etcd", &url, "admin", "-c"])
            .arg(format!(
                "echo started >> {o}; while [ ! -e {g} ]; do sleep 0.05; done; echo finished >> {o}",
                o = q(&out),
                g = q(&go)
            )),
    );
    wait_until(Duration::from_secs(10), "the holder started", || {
        read(&out) == "started\n"
    });
    run(dlm().args(["run", "-n", "--etcd", &url, "admin", "--", "true"])).expect(1);
    run(dlm().args([
        "run", "-n", "-E", "75", "--etcd", &url, "admin", "--", "true",
    ]))
    .expect(75);

    // $DLM_ETCD_ENDPOINTS stands for --etcd.
    let done = run(dlm()
        .env("DLM_ETCD_ENDPOINTS", &url)
        .args(["status", "admin", "other", "--json"]));
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

    // unlock --force: the holder is not told at once; it learns at its next renewal and
    // its command is stopped (70), as on Redis.
    let done = run(dlm().args(["unlock", "--force", "--yes", "--etcd", &url, "admin"]));
    done.expect(0);
    assert_eq!(done.stdout, "admin\treleased\n");
    assert!(!is_held(&url, "admin"));
    std::fs::write(&go, "").unwrap();
    let done = holder.wait(Duration::from_secs(20));
    done.expect(70);
    assert!(done.stderr.contains("lost"), "{}", done.stderr);
}

#[test]
fn etcd_usage_errors_and_an_unreachable_member() {
    let _serial = SERIAL.lock();
    for (args, why) in [
        (
            vec!["--etcd", "redis://127.0.0.1:6379"],
            "must start with http://",
        ),
        (
            vec!["--etcd", "http://127.0.0.1:2379", "--cluster"],
            "cannot be used with",
        ),
        (
            vec![
                "--etcd",
                "http://127.0.0.1:2379",
                "--redis",
                "redis://127.0.0.1",
            ],
            "cannot be used with",
        ),
    ] {
        let done = run(dlm().arg("run").args(&args).args(["x", "--", "true"]));
        done.expect(64);
        assert!(done.stderr.contains(why), "{args:?}: {}", done.stderr);
    }
    let done = run(dlm()
        .env("DLM_ETCD_ENDPOINTS", "http://127.0.0.1:2379")
        .env("DLM_REDIS_URL", "redis://127.0.0.1:6379")
        .args(["run", "x", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr.contains("give --redis or --etcd"),
        "{}",
        done.stderr
    );
    // Nothing listening: the backend's failure (69), within the wait.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let done = run(dlm().args([
        "run",
        "-w",
        "1",
        "--etcd",
        &format!("http://127.0.0.1:{port}"),
        "x",
        "--",
        "true",
    ]));
    done.expect(69);
}

#[test]
fn mutual_tls_on_etcd_takes_the_same_tls_flags_as_redis() {
    let _serial = SERIAL.lock();
    let pki = dlm_testkit::tls::TestPki::new();
    let server = EtcdServer::spawn_tls(&pki, dlm_testkit::tls::ServerCert::Valid, true);
    let url = server.tls_url();
    let (cert, key) = pki.client_cert();
    let done = run(dlm()
        .args(["run", "--etcd", &url, "--tls-ca-file"])
        .arg(pki.ca_file())
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .args(["job", "--", "sh", "-c", "echo $DLM_FENCING_TOKEN"]));
    done.expect(0);
    assert!(done.stdout.trim().parse::<u64>().is_ok(), "{}", done.stdout);
    // The same under etcdctl's and redis-cli's names.
    run(dlm()
        .args(["run", "--etcd", &url, "--cacert"])
        .arg(pki.ca_file())
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .args(["job", "--", "true"]))
    .expect(0);
    // And from the environment, the endpoints too; an empty DLM_TLS_SERVER_NAME is not
    // set.
    run(dlm()
        .env("DLM_ETCD_ENDPOINTS", &url)
        .env("DLM_TLS_CA_FILE", pki.ca_file())
        .env("DLM_TLS_CERT", &cert)
        .env("DLM_TLS_KEY", &key)
        .env("DLM_TLS_SERVER_NAME", "")
        .args(["run", "job", "--", "true"]))
    .expect(0);
    // A flag goes before its variable: a wrong CA from the environment is not used.
    run(dlm()
        .env("DLM_TLS_CA_FILE", pki.other_ca_file())
        .env("DLM_TLS_CERT", &cert)
        .env("DLM_TLS_KEY", &key)
        .args(["run", "--etcd", &url, "--tls-ca-file"])
        .arg(pki.ca_file())
        .args(["job", "--", "true"]))
    .expect(0);

    // TLS flags with plain http:// members: a usage error before any I/O.
    let done = run(dlm()
        .args(["run", "--etcd", &server.url(), "--tls-ca-file"])
        .arg(pki.ca_file())
        .args(["job", "--", "true"]));
    done.expect(64);
    assert!(done.stderr.contains("https://"), "{}", done.stderr);
    // The same from the environment: named as such.
    let done = run(dlm().env("DLM_TLS_CA_FILE", pki.ca_file()).args([
        "run",
        "--etcd",
        &server.url(),
        "job",
        "--",
        "true",
    ]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("the TLS options of $DLM_TLS_CA_FILE need a URL with the https:// scheme"),
        "{}",
        done.stderr
    );
}

#[test]
fn etcd_auth_takes_the_password_as_on_redis_and_never_shows_it() {
    let _serial = SERIAL.lock();
    let server = EtcdServer::spawn();
    server.add_user("alice", "alice-pw", Some("dlm/"));
    server.enable_auth("root-pw");
    let port = server.client_port();
    let user_url = format!("http://alice@127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, "alice-pw\n").unwrap();

    // --password-file, for a URL that names the user.
    run(dlm()
        .args(["run", "--etcd", &user_url, "--password-file"])
        .arg(&file)
        .args(["job", "--", "true"]))
    .expect(0);
    // $DLM_ETCD_PASSWORD, etcd's own variable (before $DLM_REDIS_PASSWORD); the command
    // gets neither.
    run(dlm()
        .env("DLM_ETCD_PASSWORD", "alice-pw")
        .env("DLM_REDIS_PASSWORD", "wrong-pw")
        .args(["run", "--etcd", &user_url, "job", "--", "sh", "-c"])
        .arg("test -z \"$DLM_ETCD_PASSWORD$DLM_REDIS_PASSWORD\""))
    .expect(0);
    // $DLM_REDIS_PASSWORD when $DLM_ETCD_PASSWORD is not set.
    run(dlm()
        .env("DLM_REDIS_PASSWORD", "alice-pw")
        .args(["run", "--etcd", &user_url, "job", "--", "true"]))
    .expect(0);
    // $DLM_PASSWORD, every backend's: after $DLM_ETCD_PASSWORD, before
    // $DLM_REDIS_PASSWORD; the command does not get it.
    run(dlm()
        .env("DLM_PASSWORD", "alice-pw")
        .env("DLM_REDIS_PASSWORD", "wrong-pw")
        .args(["run", "--etcd", &user_url, "job", "--", "sh", "-c"])
        .arg("test -z \"$DLM_PASSWORD\""))
    .expect(0);
    run(dlm()
        .env("DLM_ETCD_PASSWORD", "alice-pw")
        .env("DLM_PASSWORD", "wrong-pw")
        .args(["run", "--etcd", &user_url, "job", "--", "true"]))
    .expect(0);
    // The URL's userinfo, from $DLM_ETCD_ENDPOINTS: the command does not get that
    // variable (it holds a password).
    run(dlm()
        .env(
            "DLM_ETCD_ENDPOINTS",
            format!("http://alice:alice-pw@127.0.0.1:{port}"),
        )
        .args([
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "test -z \"$DLM_ETCD_ENDPOINTS\"",
        ]))
    .expect(0);

    // A wrong password: refused, said, never shown.
    let done = run(dlm()
        .env("DLM_REDIS_PASSWORD", "wrong-pw")
        .args(["run", "--etcd", &user_url, "job", "--", "true"]));
    done.expect(77);
    assert!(
        done.stderr.contains("authenticating as user"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("wrong-pw"), "{}", done.stderr);
    // --password-file without a user to go with it: a usage error before any request.
    let done = run(dlm()
        .args(["run", "--etcd", &server.url(), "--password-file"])
        .arg(&file)
        .args(["job", "--", "true"]));
    assert!(done.stderr.contains("needs a user"), "{}", done.stderr);
    assert!(!done.stderr.contains("alice-pw"), "{}", done.stderr);
}

/// Another permit count than the one a semaphore is held with: refused with 78
/// (EX_CONFIG) without running the command, and the message names the semaphore and the
/// backend (as on Redis, `cli_primitives.rs`).
#[test]
fn another_permit_count_on_etcd_names_the_semaphore_and_the_backend() {
    let _serial = SERIAL.lock();
    let server = EtcdServer::spawn();
    let url = server.url();
    let mut holder = Proc::spawn(dlm().args(["hold", "--permits", "2", "--etcd", &url, "jobs"]));
    wait_until(Duration::from_secs(10), "the permit to be held", || {
        holder.stdout_now().starts_with("DLM_LOCK_NAME='jobs'")
    });
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let done = run(dlm()
        .args([
            "run",
            "--permits",
            "3",
            "--etcd",
            &url,
            "jobs",
            "--",
            "touch",
        ])
        .arg(&ran));
    done.expect(78);
    assert!(!ran.exists(), "the command ran");
    assert!(
        done.stderr.contains(
            "cannot take a permit of \"jobs\" (etcd (1 member)): the semaphore jobs is held with 2 permits, not 3"
        ),
        "{}",
        done.stderr
    );
    holder.signal("TERM");
    holder.wait(Duration::from_secs(30)).expect(143);
}
