//! The real `dlm` binary with elections against a real redis-server: `dlm run --elect`
//! runs its command as the leader while another candidate waits, `dlm leader` prints the
//! value and term (exit 1 when nobody leads), `dlm leader --watch` prints every change,
//! and Redlock refuses elections as a usage error.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Json, Proc, SERIAL, dlm, q, read, run, server, wait_until};
use dlm_redis::redis;
use dlm_testkit::redis_server::RedisNodes;

const TEN: Duration = Duration::from_secs(10);

/// The shell command of candidate `id`: writes `DLM_FENCING_TOKEN` to `token.ID`, waits
/// until the test creates `go.ID`.
fn script(dir: &std::path::Path, id: &str) -> String {
    format!(
        "echo \"$DLM_FENCING_TOKEN\" > {token}; while [ ! -e {go} ]; do sleep 0.01; done",
        token = q(&dir.join(format!("token.{id}"))),
        go = q(&dir.join(format!("go.{id}")))
    )
}

fn token_file(dir: &std::path::Path, id: &str) -> PathBuf {
    dir.join(format!("token.{id}"))
}

/// `dlm leader [--json] NAME`.
fn leader(url: &str, flags: &[&str], name: &str) -> common::Done {
    run(dlm().args(["leader", "--redis", url]).args(flags).arg(name))
}

/// A leader runs its command; `dlm leader` shows its value and term; a second candidate
/// with `-n` exits 1 and one without waits, then leads (a larger term) once the first
/// command ends; after both, `dlm leader` exits 1 and prints nothing. `--watch` saw every
/// change in order.
#[test]
fn the_command_runs_as_leader_and_everyone_sees_it() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let name = "scheduler";
    let watch = Proc::spawn(dlm().args(["leader", "--watch", "--redis", &url, name]));
    // The watch's first line is the state when it starts: nobody leads yet.
    wait_until(TEN, "the watch's first line", || {
        read_lines(&watch).first().map(String::as_str) == Some("-")
    });

    let mut first = Proc::spawn(dlm().args([
        "run",
        "--elect",
        "--value",
        "node-a:80",
        "--redis",
        &url,
        name,
        "-c",
        &script(dir.path(), "a"),
    ]));
    wait_until(TEN, "the first leader's command", || {
        token_file(dir.path(), "a").exists() && !read(&token_file(dir.path(), "a")).is_empty()
    });
    let term_a: u64 = read(&token_file(dir.path(), "a"))
        .trim()
        .parse()
        .expect("a term");

    let shown = leader(&url, &[], name);
    shown.expect(0);
    assert_eq!(shown.stdout, format!("node-a:80\t{term_a}\n"));
    let json = leader(&url, &["--json"], name);
    json.expect(0);
    let row = Json::parse(&json.stdout);
    assert_eq!(row.get("leader").str(), "node-a:80");
    assert_eq!(row.get("term").u64(), term_a);
    // The value is the permit's label: `dlm status --permits 1` shows it too.
    let status = run(dlm().args(["status", "--json", "--permits", "1", "--redis", &url, name]));
    status.expect(0);
    let row = Json::parse(&status.stdout).array()[0].clone();
    assert_eq!(
        row.get("held_by").array()[0].get("label").str(),
        "node-a:80"
    );

    run(dlm().args([
        "run",
        "--elect",
        "-n",
        "--value",
        "node-b:80",
        "--redis",
        &url,
        name,
        "--",
        "true",
    ]))
    .expect(1);
    let mut second = Proc::spawn(dlm().args([
        "run",
        "--elect",
        "--value",
        "node-b:80",
        "--redis",
        &url,
        name,
        "-c",
        &script(dir.path(), "b"),
    ]));
    // The second candidate waits: its refused attempt marked the election as waited for.
    let mut con = server.connection();
    wait_until(TEN, "the second candidate to wait", || {
        redis::cmd("HEXISTS")
            .arg(format!("dlm:{{{name}}}:sem"))
            .arg("x")
            .query::<bool>(&mut con)
            .unwrap()
    });
    assert!(
        !token_file(dir.path(), "b").exists(),
        "two leaders' commands at once"
    );

    std::fs::write(dir.path().join("go.a"), "").unwrap();
    first.wait(TEN).expect(0);
    wait_until(TEN, "the second leader's command", || {
        token_file(dir.path(), "b").exists() && !read(&token_file(dir.path(), "b")).is_empty()
    });
    let term_b: u64 = read(&token_file(dir.path(), "b"))
        .trim()
        .parse()
        .expect("a term");
    assert!(term_b > term_a, "terms went back: {term_b} after {term_a}");
    std::fs::write(dir.path().join("go.b"), "").unwrap();
    second.wait(TEN).expect(0);

    let none = leader(&url, &[], name);
    none.expect(1);
    assert_eq!(none.stdout, "");

    // In order: nobody, a, b, nobody (the vacancy between a and b may be too short to
    // be seen: b is woken by the same release).
    let last = format!("node-b:80\t{term_b}");
    wait_until(TEN, "every change watched", || {
        read_lines(&watch).ends_with(&[last.clone(), "-".to_owned()])
    });
    watch.signal("TERM");
    let lines = read_lines(&watch);
    assert_eq!(lines.first().map(String::as_str), Some("-"), "{lines:?}");
    let leaders: Vec<&String> = lines.iter().filter(|l| *l != "-").collect();
    assert_eq!(
        leaders,
        [&format!("node-a:80\t{term_a}"), &last],
        "{lines:?}"
    );
}

fn read_lines(p: &Proc) -> Vec<String> {
    p.stdout_now().lines().map(str::to_owned).collect()
}

/// Redlock keeps no elections: `--elect` and `dlm leader` are usage errors that say so.
#[test]
fn redlock_refuses_elections() {
    let _serial = SERIAL.lock();
    let nodes = RedisNodes::spawn(3);
    let urls = nodes.urls().join(",");
    let done = run(dlm().args(["run", "--elect", "--redis", &urls, "x", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr.contains("keeps no elections"),
        "{}",
        done.stderr
    );
    let done = run(dlm().args(["leader", "--redis", &urls, "x"]));
    done.expect(64);
    assert!(
        done.stderr.contains("keeps no elections"),
        "{}",
        done.stderr
    );
}
