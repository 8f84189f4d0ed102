//! The testkit's PostgreSQL servers: a server comes up on a free port and answers
//! queries, keeps its data across a `kill -9` and restart and across a clean stop and
//! start, answers nothing while paused (not even on an open connection), checks
//! passwords when it has one, and leaves no process behind once its handle is dropped.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_testkit::postgres::{
    PostgresOptions, PostgresServer, live_postgres_pids, require_postgres,
};

/// How long a paused server must stay silent.
const SILENCE: Duration = Duration::from_secs(2);
/// How long an answer may take once the server runs.
const ANSWER: Duration = Duration::from_secs(15);

/// `(state, ppid)` of `/proc/<pid>/stat`, if readable.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// The processes whose parent is `ppid`.
fn children_of(ppid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, parent)| parent == ppid))
        .collect()
}

/// Alive: it exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// Asserts that the postmaster `pid` and its former `children` are gone.
fn assert_all_gone(pid: u32, children: &[u32]) {
    assert!(!live_postgres_pids().contains(&pid), "{pid} still live");
    assert!(!is_alive(pid), "postmaster {pid} still alive");
    assert!(
        children_of(pid).iter().all(|&c| !is_alive(c)),
        "a child of {pid} is left: {:?}",
        children_of(pid)
    );
    for &c in children {
        assert!(!is_alive(c), "child {c} of postmaster {pid} still alive");
    }
}

/// An interactive `psql` session as the superuser: one connection, queries sent one by
/// one, answers read line by line (from a thread, so that waits have deadlines).
struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Session {
    fn open(pg: &PostgresServer) -> Session {
        let mut child = Command::new(require_postgres().join("psql"))
            .args(["-X", "-A", "-t", "-w", "-d"])
            .arg(pg.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !line.trim().is_empty() && tx.send(line.trim().to_owned()).is_err() {
                    break;
                }
            }
        });
        Session {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, sql: &str) {
        writeln!(self.stdin, "{sql}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer_within(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_answers_and_leaves_no_process_once_dropped() {
    let started = Instant::now();
    let pg = PostgresServer::spawn();
    eprintln!("spawned in {:?}", started.elapsed());
    assert!(pg.is_running());
    assert_eq!(pg.psql("select 1"), "1");
    assert_eq!(pg.psql("select current_user"), "postgres");
    assert_eq!(
        pg.url(),
        format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert!(pg.try_psql("select * from no_such_table").is_err());
    let pid = pg.pid();
    assert!(live_postgres_pids().contains(&pid));
    // A backend of an open connection, and the background processes.
    let session = Session::open(&pg);
    let mut s = session;
    s.send("select 42;");
    assert_eq!(s.answer_within(ANSWER).as_deref(), Some("42"));
    let children = children_of(pid);
    assert!(
        children.len() >= 4,
        "children of the postmaster: {children:?}"
    );
    let dir = pg.dir().to_owned();
    assert!(dir.join("data/PG_VERSION").is_file());
    drop(pg);
    assert_all_gone(pid, &children);
    assert!(!dir.exists());
}

#[test]
fn data_survives_kill_9_and_restart() {
    let mut pg = PostgresServer::spawn();
    pg.psql("create table t (x int); insert into t values (7)");
    let (pid, port) = (pg.pid(), pg.port());
    let children = children_of(pid);
    pg.kill();
    assert!(!pg.is_running());
    assert_all_gone(pid, &children);
    assert!(pg.try_psql("select 1").is_err());
    pg.restart();
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_ne!(pg.pid(), pid);
    assert!(live_postgres_pids().contains(&pg.pid()));
    assert_eq!(pg.psql("select x from t"), "7");
    assert!(
        pg.log_contents().contains("not properly shut down"),
        "no crash recovery in the log:\n{}",
        pg.log_contents()
    );
    // A restart of a running server kills it too.
    let pid = pg.pid();
    pg.restart();
    assert_ne!(pg.pid(), pid);
    assert!(!is_alive(pid));
    assert_eq!(pg.psql("select count(*) from t"), "1");
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let pg = PostgresServer::spawn();
    let mut session = Session::open(&pg);
    session.send("select 1;");
    assert_eq!(session.answer_within(ANSWER).as_deref(), Some("1"));

    pg.pause();
    assert!(pg.is_paused());
    assert!(pg.is_running());
    // An open connection: its backend is stopped.
    session.send("select 2;");
    assert_eq!(
        session.answer_within(SILENCE),
        None,
        "a paused backend answered"
    );
    // A new connection: the postmaster is stopped.
    let (tx, rx) = mpsc::channel();
    let url_port = pg.port();
    thread::scope(|scope| {
        scope.spawn(|| tx.send(pg.try_psql("select 3")).unwrap());
        assert!(
            rx.recv_timeout(SILENCE).is_err(),
            "a paused server answered a new connection on port {url_port}"
        );
        pg.resume();
        assert!(!pg.is_paused());
        assert_eq!(rx.recv_timeout(ANSWER).unwrap().as_deref(), Ok("3"));
    });
    assert_eq!(session.answer_within(ANSWER).as_deref(), Some("2"));
    assert_eq!(pg.psql("select 4"), "4");

    // Dropped while paused: every process dies all the same.
    pg.pause();
    let pid = pg.pid();
    let children = children_of(pid);
    drop(session);
    drop(pg);
    assert_all_gone(pid, &children);
}

#[test]
fn a_password_is_required_when_set() {
    let mut options = PostgresOptions::default();
    options.password = Some("s3cret p@ss".to_owned());
    options
        .settings
        .push(("work_mem".to_owned(), "8MB".to_owned()));
    let pg = PostgresServer::spawn_with(options);
    assert_eq!(pg.psql("select current_user"), "postgres");
    assert_eq!(pg.psql("show work_mem"), "8MB");
    assert_eq!(pg.psql("show password_encryption"), "scram-sha-256");
    assert_eq!(
        pg.url(),
        format!(
            "postgresql://postgres:s3cret%20p%40ss@127.0.0.1:{}/postgres",
            pg.port()
        )
    );
    let psql = |url: &str| {
        Command::new(require_postgres().join("psql"))
            .args(["-X", "-A", "-t", "-w", "-c", "select 1", "-d", url])
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let right = psql(&pg.url_for("postgres", Some("s3cret p@ss"), "postgres"));
    assert!(right.status.success());
    assert_eq!(String::from_utf8_lossy(&right.stdout).trim(), "1");
    let wrong = psql(&pg.url_for("postgres", Some("wrong"), "postgres"));
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    let none = psql(&pg.url_for("postgres", None, "postgres"));
    assert!(!none.status.success());
}

#[test]
fn data_survives_stop_and_start() {
    let mut pg = PostgresServer::spawn();
    pg.psql("create table t (x text); insert into t values ('kept')");
    let (pid, port) = (pg.pid(), pg.port());
    let children = children_of(pid);
    pg.stop();
    assert!(!pg.is_running());
    assert_all_gone(pid, &children);
    assert!(pg.log_contents().contains("database system is shut down"));
    assert!(pg.try_psql("select 1").is_err());
    pg.stop(); // nothing to stop
    pg.start();
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql("select x from t"), "kept");
    assert!(
        !pg.log_contents().contains("not properly shut down"),
        "a clean stop needed crash recovery:\n{}",
        pg.log_contents()
    );
    let pid = pg.pid();
    pg.start(); // already running: nothing
    assert_eq!(pg.pid(), pid);
}
