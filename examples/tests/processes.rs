//! Locks across real processes, on one Redis server and on Redlock over three:
//! - several `fenced_writer` processes take one lock in turn and write through the
//!   fencing check while they hold it; none may be refused, and no token may be issued
//!   twice;
//! - a `holder` killed with SIGKILL: its lock is free within the watchdog timeout;
//! - a `holder` stopped with SIGSTOP past its lease: another client takes the lock, and
//!   the holder, once continued, learns it lost the lock and its late write is refused;
//! - the same on etcd (the negative control of `dlm-etcd`): etcd's consensus does not stop
//!   a paused holder from writing late, the history checker sees two holders, and fencing
//!   refuses the late write;
//! - elections: a leader process killed with SIGKILL is replaced within its lease (and an
//!   observer sees the new leader); a leader stopped past its lease is told it lost the
//!   lead, and its late write with its term is refused.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlm_core::{FencedResource, FencingToken, Lock, LockClient};
use dlm_redis::redis;

use dlm_testkit::redis_server::{RedisNodes, require_redis_server};

fn run_writers(urls: &[String]) {
    const PROCESSES: usize = 3;
    const COUNT: usize = 15;
    let name = dlm_testkit::unique_name("processes");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_fenced_writer"))
                .args(["--redis", &urls.join(","), "--count", &COUNT.to_string()])
                .args(["--name", &name, "--key", &format!("{name}:value")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start fenced_writer")
        })
        .collect();
    let mut tokens = HashSet::new();
    for child in children {
        let out = child.wait_with_output().expect("wait for fenced_writer");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a writer failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            let t: u64 = line.strip_prefix("token ").unwrap().parse().unwrap();
            assert!(tokens.insert(t), "token {t} issued twice");
        }
    }
    assert_eq!(tokens.len(), PROCESSES * COUNT);
}

#[test]
fn tokens_increase_across_processes_on_one_server() {
    require_redis_server();
    let nodes = RedisNodes::spawn(1);
    run_writers(&nodes.urls());
}

#[test]
fn tokens_increase_across_processes_on_redlock() {
    require_redis_server();
    let nodes = RedisNodes::spawn(3);
    run_writers(&nodes.urls());
}

/// A `holder` process (see `examples/src/bin/holder.rs`), driven through its stdin.
struct Holder {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Holder {
    /// Starts a holder of `name` with a watchdog timeout of `watchdog` and waits until it
    /// holds the lock; returns it and its fencing token.
    fn start(urls: &[String], name: &str, watchdog: Duration) -> (Holder, u64) {
        Holder::start_on("--redis", urls, name, watchdog)
    }

    /// [`Holder::start`] with the backend flag (`--redis` or `--etcd`).
    fn start_on(flag: &str, urls: &[String], name: &str, watchdog: Duration) -> (Holder, u64) {
        Holder::spawn(flag, urls, name, watchdog, &[])
    }

    /// A leader of the election `name` on one Redis server, publishing `value`.
    fn lead(urls: &[String], name: &str, watchdog: Duration, value: &str) -> (Holder, u64) {
        Holder::spawn("--redis", urls, name, watchdog, &["--elect", value])
    }

    fn spawn(
        flag: &str,
        urls: &[String],
        name: &str,
        watchdog: Duration,
        extra: &[&str],
    ) -> (Holder, u64) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_holder"))
            .args([flag, &urls.join(","), "--name", name])
            .args(["--watchdog", &watchdog.as_secs_f64().to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start holder");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut holder = Holder {
            child,
            stdin,
            lines,
        };
        let held = holder.line();
        let token = held
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("holder said {held:?}"))
            .parse()
            .unwrap();
        (holder, token)
    }

    fn line(&mut self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the holder answered nothing")
    }

    fn ask(&mut self, command: &str) -> String {
        use std::io::Write;
        writeln!(self.stdin, "{command}").unwrap();
        self.line()
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig}");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILL a holder of a watchdog-renewed lock: nothing releases it, and it is free again
/// within the watchdog timeout (its last renewal set that lease).
fn crashed_holder(urls: &[String]) {
    const WATCHDOG: Duration = Duration::from_secs(2);
    let name = dlm_testkit::unique_name("crash");
    let (mut holder, _) = Holder::start(urls, &name, WATCHDOG);
    let other = LockClient::new(backend(urls));
    let lock = other.get_lock(&name).unwrap();
    // Well past the first renewal.
    std::thread::sleep(WATCHDOG);
    holder.signal("KILL");
    let killed = Instant::now();
    let _ = holder.child.wait();
    assert!(
        lock.try_lock().unwrap().is_none(),
        "free right after the crash"
    );
    let guard = lock
        .try_lock_timeout(WATCHDOG * 5)
        .unwrap()
        .expect("the crashed holder's lock never expired");
    let freed = killed.elapsed();
    eprintln!(
        "{} node(s): free {freed:?} after the holder was killed (watchdog timeout {WATCHDOG:?})",
        urls.len()
    );
    assert!(
        freed < WATCHDOG + Duration::from_millis(500),
        "free after {freed:?}, more than the watchdog timeout"
    );
    guard.unlock().unwrap();
}

fn backend(urls: &[String]) -> std::sync::Arc<dyn dlm_core::backend::LockBackend> {
    if urls.len() == 1 {
        std::sync::Arc::new(dlm_redis::RedisBackend::new(&urls[0]).unwrap())
    } else {
        std::sync::Arc::new(dlm_redis::Redlock::new(urls).unwrap())
    }
}

#[test]
fn a_crashed_holders_lock_is_free_within_the_watchdog_timeout() {
    require_redis_server();
    crashed_holder(&RedisNodes::spawn(1).urls());
    crashed_holder(&RedisNodes::spawn(3).urls());
}

/// Kleppmann's paused client, as a real process: the holder is stopped (SIGSTOP) past its
/// lease, another client takes the lock and writes; the holder continues, learns that it
/// lost the lock (`ensure_held`), and a write it makes anyway with its old token is refused
/// by `fenced_set` and by a `FencedResource`.
fn paused_holder(urls: &[String]) {
    const WATCHDOG: Duration = Duration::from_secs(1);
    let name = dlm_testkit::unique_name("paused");
    let key = format!("{name}:value");
    let (mut holder, old) = Holder::start(urls, &name, WATCHDOG);
    let resource = FencedResource::new(Vec::new());
    assert_eq!(holder.ask("write before the pause"), "written");
    resource
        .write(FencingToken::new(old), |w| w.push("holder"))
        .unwrap();
    holder.signal("STOP");
    let other = LockClient::new(backend(urls));
    let guard = other
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(WATCHDOG * 10)
        .unwrap()
        .expect("the stopped holder's lock never expired");
    let new = guard.fencing_token().unwrap();
    assert!(new.get() > old, "token {new} after {old}");
    let mut con = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    dlm_redis::fenced_set(&mut con, &key, new, b"the new holder").unwrap();
    resource.write(new, |w| w.push("new holder")).unwrap();
    holder.signal("CONT");
    assert_eq!(holder.ask("check"), "lost");
    assert_eq!(holder.ask("write after the pause"), "refused");
    assert!(
        resource
            .write(FencingToken::new(old), |w| w.push("holder, late"))
            .is_err()
    );
    assert_eq!(resource.read(|w| w.clone()), ["holder", "new holder"]);
    assert_eq!(
        dlm_redis::fenced_get(&mut con, &key).unwrap(),
        Some((b"the new holder".to_vec(), new))
    );
    assert!(holder.ask("unlock").starts_with("unlock failed"));
    guard.unlock().unwrap();
}

#[test]
fn a_stopped_holder_process_learns_it_lost_the_lock_and_its_late_write_is_refused() {
    require_redis_server();
    paused_holder(&RedisNodes::spawn(1).urls());
    paused_holder(&RedisNodes::spawn(3).urls());
}

/// The negative control of a paused leader: the leader stopped past its lease and then
/// continued (it believes it leads until it checks) and the new leader lead at once, and
/// the history checker sees it. `old` and `new`: when each began to lead, and its term.
fn assert_two_leaders(name: &str, old: (Instant, u64), new: (Instant, u64)) {
    use dlm_testkit::history::{History, Hold};
    let history = History::new();
    let now = Instant::now();
    history.push(Hold::new(name, "stopped leader", old.0, now, Some(old.1)));
    history.push(Hold::new(name, "new leader", new.0, now, Some(new.1)));
    assert!(
        history.check().has_overlap(),
        "the history checker must see the continued leader beside the new one"
    );
}

/// A leader process killed with SIGKILL announces nothing: its lead ends with its lease
/// (2 s watchdog), a waiting candidate takes over within it with a larger term, and an
/// observer sees the change. `slack`: how late after the lease the takeover may come (an
/// etcd lease is whole seconds, ended by etcd's expiry check).
fn killed_leader(
    flag: &str,
    urls: &[String],
    backend: &dyn Fn() -> std::sync::Arc<dyn dlm_core::backend::LockBackend>,
    slack: Duration,
) {
    const WATCHDOG: Duration = Duration::from_secs(2);
    let name = dlm_testkit::unique_name("killed-leader");
    let (mut leader, old) = Holder::spawn(flag, urls, &name, WATCHDOG, &["--elect", "node-1"]);
    let election = LockClient::builder(backend())
        .watchdog_timeout(WATCHDOG)
        .build()
        .unwrap()
        .get_election(&name)
        .unwrap();
    let mut changes = LockClient::new(backend())
        .get_election(&name)
        .unwrap()
        .observe();
    let first = changes.next().unwrap().unwrap().expect("a leader");
    assert_eq!(first.value(), Some("node-1"));
    // Well past the first renewal.
    std::thread::sleep(WATCHDOG);
    leader.signal("KILL");
    let killed = Instant::now();
    let _ = leader.child.wait();
    let lead = election
        .try_campaign_timeout("node-2", WATCHDOG * 5)
        .unwrap()
        .expect("the killed leader's lead never ended");
    let took_over = killed.elapsed();
    eprintln!(
        "{flag}: a candidate led {took_over:?} after the leader was killed (watchdog {WATCHDOG:?})"
    );
    assert!(
        took_over < WATCHDOG + slack,
        "led after {took_over:?}, more than the lease and {slack:?}"
    );
    assert!(lead.term().get() > old);
    // The observer sees the new leader (through a vacancy, if it looked in between).
    let seen = loop {
        match changes.next_timeout(Duration::from_secs(5)).unwrap() {
            Some(Some(l)) => break l,
            Some(None) => continue,
            None => panic!("the observer did not see the new leader"),
        }
    };
    assert_eq!(seen.value(), Some("node-2"));
    assert_eq!(seen.term(), Some(lead.term()));
    lead.resign().unwrap();
}

#[test]
fn a_killed_leader_is_replaced_within_its_lease() {
    require_redis_server();
    let nodes = RedisNodes::spawn(1);
    let urls = nodes.urls();
    killed_leader(
        "--redis",
        &urls,
        &|| backend(&urls),
        Duration::from_millis(500),
    );
}

#[test]
fn a_killed_etcd_leader_is_replaced_within_its_lease() {
    let server = dlm_testkit::etcd::EtcdServer::spawn();
    let urls = vec![server.url()];
    killed_leader(
        "--etcd",
        &urls,
        &|| std::sync::Arc::new(dlm_etcd::EtcdBackend::new(&urls).unwrap()),
        Duration::from_millis(1500),
    );
}

#[test]
fn a_killed_postgres_leader_is_replaced_within_its_lease() {
    let server = dlm_testkit::postgres::PostgresServer::spawn();
    let urls = vec![server.url()];
    killed_leader(
        "--postgres",
        &urls,
        &|| std::sync::Arc::new(dlm_postgres::PostgresBackend::new(&urls[0]).unwrap()),
        Duration::from_millis(500),
    );
}

/// A leader process stopped (SIGSTOP) past its lease on etcd or PostgreSQL: a candidate
/// leads with a larger term and writes to a fenced resource; the old leader, continued,
/// learns it lost the lead, and its late write with its old term is refused.
fn stopped_leader(
    flag: &str,
    urls: &[String],
    backend: &dyn Fn() -> std::sync::Arc<dyn dlm_core::backend::LockBackend>,
) {
    const WATCHDOG: Duration = Duration::from_secs(1);
    let name = dlm_testkit::unique_name("paused-leader");
    let (mut leader, old) = Holder::spawn(flag, urls, &name, WATCHDOG, &["--elect", "node-1"]);
    let led_from = Instant::now();
    let resource = FencedResource::new(Vec::new());
    resource
        .write(FencingToken::new(old), |w| w.push("old leader"))
        .unwrap();
    leader.signal("STOP");
    let election = LockClient::new(backend()).get_election(&name).unwrap();
    let lead = election
        .try_campaign_timeout("node-2", WATCHDOG * 10)
        .unwrap()
        .expect("the stopped leader's lead never ended");
    assert!(lead.term().get() > old, "term {} after {old}", lead.term());
    let new_from = Instant::now();
    resource
        .write(lead.term(), |w| w.push("new leader"))
        .unwrap();
    leader.signal("CONT");
    assert_two_leaders(&name, (led_from, old), (new_from, lead.term().get()));
    assert_eq!(leader.ask("check"), "lost");
    assert!(
        resource
            .write(FencingToken::new(old), |w| w.push("old leader, late"))
            .is_err(),
        "the late write with the old term was accepted"
    );
    assert_eq!(resource.read(|w| w.clone()), ["old leader", "new leader"]);
    assert_eq!(election.leader().unwrap().unwrap().value(), Some("node-2"));
    lead.resign().unwrap();
}

#[test]
fn a_stopped_etcd_or_postgres_leader_learns_it_lost_the_lead_and_its_late_write_is_refused() {
    let etcd = dlm_testkit::etcd::EtcdServer::spawn();
    let urls = vec![etcd.url()];
    stopped_leader("--etcd", &urls, &|| {
        std::sync::Arc::new(dlm_etcd::EtcdBackend::new(&urls).unwrap())
    });
    let pg = dlm_testkit::postgres::PostgresServer::spawn();
    let urls = vec![pg.url()];
    stopped_leader("--postgres", &urls, &|| {
        std::sync::Arc::new(dlm_postgres::PostgresBackend::new(&urls[0]).unwrap())
    });
}

/// A leader process stopped (SIGSTOP) past its lease: a candidate leads with a larger
/// term and writes; the old leader, continued, learns it lost the lead and its late write
/// with its old term is refused by `fenced_set`.
#[test]
fn a_stopped_leader_learns_it_lost_the_lead_and_its_late_write_is_refused() {
    require_redis_server();
    const WATCHDOG: Duration = Duration::from_secs(1);
    let nodes = RedisNodes::spawn(1);
    let urls = nodes.urls();
    let name = dlm_testkit::unique_name("paused-leader");
    let key = format!("{name}:value");
    let (mut leader, old) = Holder::lead(&urls, &name, WATCHDOG, "node-1");
    let led_from = Instant::now();
    assert_eq!(leader.ask("write before the pause"), "written");
    leader.signal("STOP");
    let election = LockClient::new(backend(&urls)).get_election(&name).unwrap();
    let lead = election
        .try_campaign_timeout("node-2", WATCHDOG * 10)
        .unwrap()
        .expect("the stopped leader's lead never ended");
    assert!(lead.term().get() > old, "term {} after {old}", lead.term());
    let mut con = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let new_from = Instant::now();
    dlm_redis::fenced_set(&mut con, &key, lead.term(), b"the new leader").unwrap();
    leader.signal("CONT");
    assert_two_leaders(&name, (led_from, old), (new_from, lead.term().get()));
    assert_eq!(leader.ask("check"), "lost");
    assert_eq!(leader.ask("write after the pause"), "refused");
    assert_eq!(
        dlm_redis::fenced_get(&mut con, &key).unwrap(),
        Some((b"the new leader".to_vec(), lead.term()))
    );
    assert_eq!(election.leader().unwrap().unwrap().value(), Some("node-2"));
    lead.resign().unwrap();
}

/// The negative control on etcd (the Jepsen finding on etcd locks): a holder process
/// stopped (SIGSTOP) past its lease while another client takes the lock. etcd's
/// consensus cannot stop the paused holder's late write: the history checker sees two
/// holders at once, and only fencing (a `FencedResource`) refuses the late write.
#[test]
fn a_stopped_etcd_holder_is_a_second_holder_and_only_fencing_refuses_its_late_write() {
    use dlm_testkit::history::{History, Hold};
    const WATCHDOG: Duration = Duration::from_secs(1);
    let server = dlm_testkit::etcd::EtcdServer::spawn();
    let urls = vec![server.url()];
    let name = dlm_testkit::unique_name("paused-etcd");
    let (mut holder, old) = Holder::start_on("--etcd", &urls, &name, WATCHDOG);
    let held_from = Instant::now();
    let resource = FencedResource::new(Vec::new());
    resource
        .write(FencingToken::new(old), |w| w.push("holder"))
        .unwrap();
    holder.signal("STOP");
    let other = LockClient::new(dlm_etcd::EtcdBackend::new(&urls).unwrap());
    let guard = other
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(WATCHDOG * 10)
        .unwrap()
        .expect("the stopped holder's lock never expired");
    let history = History::new();
    let new_hold = history.begin("new holder", &guard);
    let new = guard.fencing_token().unwrap();
    assert!(new.get() > old, "token {new} after {old}");
    resource.write(new, |w| w.push("new holder")).unwrap();
    holder.signal("CONT");
    // The paused holder writes as if it still held the lock, without checking.
    let late = resource.write(FencingToken::new(old), |w| w.push("holder, late"));
    history.push(Hold::new(
        name.as_str(),
        "paused holder",
        held_from,
        Instant::now(),
        Some(old),
    ));
    history.end(new_hold, &guard);
    assert!(late.is_err(), "fencing accepted the late write");
    let report = history.check();
    assert!(
        report.has_overlap(),
        "the history checker must see the paused holder and the new one at once"
    );
    assert_eq!(resource.read(|w| w.clone()), ["holder", "new holder"]);
    assert_eq!(holder.ask("check"), "lost");
    assert!(holder.ask("unlock").starts_with("unlock failed"));
    guard.unlock().unwrap();
}

/// The same on PostgreSQL, with the write in the database itself: a holder process
/// stopped (SIGSTOP) past its lease while another client takes the lock and writes the
/// row with its token. The history checker sees two holders at once (a lease cannot stop
/// a paused process), and the fenced `UPDATE ... WHERE fence < $token` refuses the paused
/// holder's late write: it changes no row.
#[test]
fn a_stopped_postgres_holder_is_a_second_holder_and_the_fenced_update_refuses_its_late_write() {
    use dlm_testkit::history::{History, Hold};
    const WATCHDOG: Duration = Duration::from_secs(1);
    let server = dlm_testkit::postgres::PostgresServer::spawn();
    let url = server.url();
    server.psql("CREATE TABLE report (id int PRIMARY KEY, fence bigint NOT NULL, body text)");
    server.psql("INSERT INTO report VALUES (1, 0, NULL)");
    let fenced_write = |token: u64, body: &str| -> String {
        server.psql(&format!(
            "WITH w AS (UPDATE report SET body = '{body}', fence = {token} \
             WHERE id = 1 AND fence < {token} RETURNING 1) SELECT count(*) FROM w"
        ))
    };
    let name = dlm_testkit::unique_name("paused-postgres");
    let (mut holder, old) =
        Holder::start_on("--postgres", std::slice::from_ref(&url), &name, WATCHDOG);
    let held_from = Instant::now();
    assert_eq!(fenced_write(old, "holder"), "1");
    holder.signal("STOP");
    let other = LockClient::new(dlm_postgres::PostgresBackend::new(&url).unwrap());
    let guard = other
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(WATCHDOG * 10)
        .unwrap()
        .expect("the stopped holder's lock never expired");
    let history = History::new();
    let new_hold = history.begin("new holder", &guard);
    let new = guard.fencing_token().unwrap();
    assert!(new.get() > old, "token {new} after {old}");
    assert_eq!(fenced_write(new.get(), "new holder"), "1");
    holder.signal("CONT");
    // The paused holder writes as if it still held the lock, without checking.
    let late = fenced_write(old, "holder, late");
    history.push(Hold::new(
        name.as_str(),
        "paused holder",
        held_from,
        Instant::now(),
        Some(old),
    ));
    history.end(new_hold, &guard);
    assert_eq!(late, "0", "the fenced update accepted the late write");
    assert!(
        history.check().has_overlap(),
        "the history checker must see the paused holder and the new one at once"
    );
    assert_eq!(
        server.psql("SELECT body FROM report WHERE id = 1"),
        "new holder"
    );
    assert_eq!(holder.ask("check"), "lost");
    assert!(holder.ask("unlock").starts_with("unlock failed"));
    guard.unlock().unwrap();
}

/// An election's observer keeps seeing changes across a restart of the server: after the
/// restart, the resignation of the leader (kept by the store) and the next leader are seen
/// within seconds, woken by the store's notifications (without them an observer looks
/// again only once per 30 s lease).
fn observer_across_restart(
    backend: &dyn Fn() -> std::sync::Arc<dyn dlm_core::backend::LockBackend>,
    restart: &mut dyn FnMut(),
) {
    let name = dlm_testkit::unique_name("observed");
    let changes = LockClient::new(backend())
        .get_election(&name)
        .unwrap()
        .observe()
        .into_channel();
    let next = || {
        changes
            .receiver()
            .recv_timeout(Duration::from_secs(10))
            .expect("no change seen")
    };
    assert_eq!(next().unwrap(), None);
    let lead = LockClient::new(backend())
        .get_election(&name)
        .unwrap()
        .campaign("a")
        .unwrap();
    assert_eq!(next().unwrap().unwrap().value(), Some("a"));
    restart();
    lead.resign().unwrap();
    let second = LockClient::new(backend())
        .get_election(&name)
        .unwrap()
        .campaign("b")
        .unwrap();
    let mut seen = Vec::new();
    loop {
        match next() {
            Ok(Some(l)) if l.value() == Some("b") => break,
            Ok(other) => seen.push(other.map(|l| l.value().map(str::to_owned))),
            Err(e) => eprintln!("reported while the server restarted: {e}"),
        }
    }
    assert!(
        seen.iter()
            .all(|s| s.is_none() || s == &Some(Some("a".to_owned()))),
        "unexpected changes: {seen:?}"
    );
    second.resign().unwrap();
}

#[test]
fn a_redis_observer_sees_changes_across_a_restart() {
    require_redis_server();
    // With the AOF, the leader's hold outlives the restart.
    let mut server = dlm_testkit::redis_server::RedisServer::builder()
        .appendonly(true)
        .spawn();
    let url = server.url();
    observer_across_restart(
        &|| std::sync::Arc::new(dlm_redis::RedisBackend::new(&url).unwrap()),
        &mut || server.restart(),
    );
}

#[test]
fn an_etcd_observer_sees_changes_across_a_restart() {
    let mut server = dlm_testkit::etcd::EtcdServer::spawn();
    let urls = vec![server.url()];
    observer_across_restart(
        &|| std::sync::Arc::new(dlm_etcd::EtcdBackend::new(&urls).unwrap()),
        &mut || server.restart(),
    );
}

#[test]
fn a_postgres_observer_sees_changes_across_a_restart() {
    let mut server = dlm_testkit::postgres::PostgresServer::spawn();
    let url = server.url();
    observer_across_restart(
        &|| std::sync::Arc::new(dlm_postgres::PostgresBackend::new(&url).unwrap()),
        &mut || {
            // A clean restart (a crash empties the lease tables: the lead would be lost).
            server.stop();
            server.start();
        },
    );
}
