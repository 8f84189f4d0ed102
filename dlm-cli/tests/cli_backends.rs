//! The real `dlm` binary on each deployment: Redlock's quorum, `status --json` and
//! `unlock --force`, `--cluster`, `--sentinel` (and a plain Redis given as a sentinel) and
//! `--wait-replicas`, against the testkit's real redis-servers and topologies.
//!
//! Every test takes `SERIAL`, so they run one at a time even without `--test-threads=1`.

mod common;

use std::time::Duration;

use common::{Json, Proc, SERIAL, dlm, held, q, read, run, server, try_once, wait_until};
use dlm_testkit::redis_server::{RedisNodes, require_redis_server};

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
    .expect(64);

    let t = dlm_testkit::sentinel::SentinelTopology::builder()
        .password("data-pw")
        .spawn();
    let sentinels = t.sentinel_urls().join(",");
    let script = format!(
        "redis-cli -p {} -a data-pw --no-auth-warning EXISTS 'dlm:{{sn-job}}' | grep -qx 1",
        t.master().port()
    );
    // `-w`, not `-n`: on a loaded machine a replica can miss the 0.5 s WAIT; the grant is
    // then undone and, within a wait, retried.
    run(dlm()
        .env("DLM_REDIS_PASSWORD", "data-pw")
        .args([
            "run",
            "-w",
            "30",
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
    .expect(64);
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
    .expect(64);
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
    .expect(64);
}

/// `--sentinel` with the URL of a plain Redis (not a Sentinel): a usage error (64) that
/// says so, not the server's `ERR unknown command 'SENTINEL'` as a backend failure (69).
#[test]
fn a_plain_redis_given_as_a_sentinel_is_a_usage_error() {
    let _serial = SERIAL.lock();
    let plain = server();
    for cmd in [
        &["run", "--sentinel", "m"][..],
        &["status", "--sentinel", "m"],
    ] {
        let done =
            run(dlm()
                .args(cmd)
                .args(["--redis", &plain.url(), "n"])
                .args(if cmd[0] == "run" {
                    &["--", "true"][..]
                } else {
                    &[]
                }));
        done.expect(64);
        assert_eq!(
            done.stderr,
            "dlm: --sentinel: --redis does not name a Redis Sentinel (the server does not know \
             the SENTINEL command: a plain Redis?); give the sentinels' URLs (port 26379 by \
             default), or drop --sentinel to lock on one server\n"
        );
    }
}
