//! Real PostgreSQL server processes for integration tests.
//!
//! [`PostgresServer`] is one `postgres` server (a postmaster and its children: backends,
//! checkpointer, WAL writer...) on a free loopback port, with its own temporary directory
//! (the data dir, made by `initdb` once per server, its Unix socket and its log), and the
//! controls a lock test needs: pause/resume (SIGSTOP/SIGCONT to every process of the
//! server), kill (`-9`, every process), restart on the same port and data (crash
//! recovery replays the WAL), a clean stop and a start. Every process is killed and
//! reaped when its handle drops (and, where `setpriv` can set a parent-death signal, the
//! postmaster when the test process dies, its children with it);
//! [`live_postgres_pids`] lets a test prove it.
//!
//! PostgreSQL refuses to run as root: when the test process is root, `initdb` and
//! `postgres` run as the OS user `postgres` (which the Debian packages create), and the
//! server's temp dir is handed to that user.
//!
//! A test that needs PostgreSQL fails when there is none ([`require_postgres`] says how
//! to get one): it never passes without running. The binaries are those in
//! `$DLM_POSTGRES_BIN` (a directory), else in the newest `/usr/lib/postgresql/*/bin`
//! (`scripts/test` installs Debian's `postgresql` when it is missing).
//!
//! ```no_run
//! use dlm_testkit::postgres::{PostgresOptions, PostgresServer};
//!
//! let mut pg = PostgresServer::spawn();
//! println!("{}", pg.url()); // postgresql://postgres@127.0.0.1:<port>/postgres
//! assert_eq!(pg.psql("select 1"), "1");
//! pg.restart(); // kill -9 and start again: crash recovery
//!
//! let mut options = PostgresOptions::default();
//! options.password = Some("secret".into());
//! let with_password = PostgresServer::spawn_with(options);
//! ```

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::pg_os::{
    POSTGRES, RUN_AS, children_of, chown_all, is_alive, output_within, proc_stat, signal, wait_for,
};

use crate::process::{LivePids, Logs, Process, Server, Startup, free_ports, pick_port};

/// How long start-up (crash recovery included) may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a clean shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`PostgresServer::try_psql`] waits for `psql`.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one readiness probe's `psql` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the processes of a server may take to stop or die once signalled.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The log: the server writes it to stderr (`logging_collector=off`).
const LOGS: Logs = Logs {
    log: "postgres.log",
    stderr: None,
};
/// The OS user the server runs as when this process is root, and the superuser's name.
const NOT_FOUND: &str = "PostgreSQL not found; install it (apt-get install postgresql) \
     or set DLM_POSTGRES_BIN to the directory of its binaries (initdb, postgres)";

/// Pids of the postmasters alive in this process.
static LIVE_PIDS: LivePids = LivePids::new();

/// The pids of all postmasters started by this process that have not been killed,
/// stopped or dropped yet, sorted.
pub fn live_postgres_pids() -> Vec<u32> {
    LIVE_PIDS.pids()
}

/// The directory of the PostgreSQL binaries (`initdb`, `postgres`): `$DLM_POSTGRES_BIN`
/// if set, else the newest `/usr/lib/postgresql/<version>/bin` that holds a `postgres`.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DLM_POSTGRES_BIN").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let mut newest: Option<(Vec<u32>, PathBuf)> = None;
    for entry in fs::read_dir("/usr/lib/postgresql").ok()?.flatten() {
        let bin = entry.path().join("bin");
        if !bin.join("postgres").is_file() {
            continue;
        }
        let version: Vec<u32> = entry
            .file_name()
            .to_string_lossy()
            .split('.')
            .map(|part| part.parse().unwrap_or(0))
            .collect();
        if newest.as_ref().is_none_or(|(v, _)| version > *v) {
            newest = Some((version, bin));
        }
    }
    newest.map(|(_, bin)| bin)
}

/// [`postgres_bin_dir`] for tests: the directory, or a panic that says how to get one.
///
/// # Panics
/// When no PostgreSQL is found.
pub fn require_postgres() -> PathBuf {
    postgres_bin_dir().unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// The configuration of a [`PostgresServer`] beyond the defaults.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The password of the superuser `postgres`; with one, connections over TCP must give
    /// it (`scram-sha-256`). `None`: every connection is trusted.
    pub password: Option<String>,
    /// Extra settings, given to `postgres` as `-c name=value` after the testkit's own
    /// (so they override them).
    pub settings: Vec<(String, String)>,
}

/// One PostgreSQL server on a loopback port, with its own temp dir.
///
/// Dropping it kills every process of the server, reaps the postmaster and removes the
/// directory.
#[derive(Debug)]
pub struct PostgresServer {
    /// The postmaster (the current one, across restarts), its temp dir and log.
    process: Process,
    /// Where `initdb`, `postgres` and `psql` are.
    bin_dir: PathBuf,
    options: PostgresOptions,
    port: u16,
}

impl PostgresServer {
    /// Starts a server where every connection is trusted (no password), and waits until
    /// it answers queries.
    ///
    /// # Panics
    /// When PostgreSQL is missing or does not come up (with the tail of its log).
    pub fn spawn() -> PostgresServer {
        Self::spawn_with(PostgresOptions::default())
    }

    /// Starts a server configured by `options`, and waits until it answers queries.
    ///
    /// # Panics
    /// As [`spawn`](Self::spawn).
    pub fn spawn_with(options: PostgresOptions) -> PostgresServer {
        let bin_dir = require_postgres();
        let process = Process::new(
            "postgres",
            bin_dir.join("postgres"),
            "dlm-postgres-",
            LOGS,
            &LIVE_PIDS,
        );
        let mut server = PostgresServer {
            process,
            bin_dir,
            options,
            port: 0,
        };
        server.initdb();
        Server::start(&mut server, false);
        server
    }

    /// A server on a data dir made by `make_data` instead of `initdb` (a base backup of
    /// another server, for a standby), then started as [`spawn_with`](Self::spawn_with)
    /// starts one. `make_data` gets the server, not started yet (its [`dir`](Self::dir)
    /// already handed to the OS user `postgres` when this process is root: see
    /// [`tool`](Self::tool)), and the data dir to create (`dir/data`).
    ///
    /// # Panics
    /// As [`spawn`](Self::spawn), and when `make_data` panics.
    pub(crate) fn spawn_from(
        options: PostgresOptions,
        make_data: impl FnOnce(&PostgresServer, &Path),
    ) -> PostgresServer {
        let bin_dir = require_postgres();
        let process = Process::new(
            "postgres",
            bin_dir.join("postgres"),
            "dlm-postgres-",
            LOGS,
            &LIVE_PIDS,
        );
        let mut server = PostgresServer {
            process,
            bin_dir,
            options,
            port: 0,
        };
        let dir = server.dir();
        if let Some((uid, gid)) = *RUN_AS {
            chown_all(dir, uid, gid)
                .unwrap_or_else(|e| panic!("chown -R {POSTGRES} {}: {e}", dir.display()));
        }
        make_data(&server, &dir.join("data"));
        Server::start(&mut server, false);
        server
    }

    /// A command of the program `name` of the server's PostgreSQL installation
    /// (`pg_basebackup`...), run as the OS user `postgres` when this process is root.
    pub(crate) fn tool(&self, name: &str) -> Command {
        let program = self.bin_dir.join(name);
        match *RUN_AS {
            Some(_) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={POSTGRES}"))
                    .arg(format!("--regid={POSTGRES}"))
                    .args(["--clear-groups", "--"])
                    .arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    /// The TCP port it listens on (127.0.0.1). It stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgresql://postgres[:password]@127.0.0.1:<port>/postgres`: the superuser, with
    /// the password if any.
    pub fn url(&self) -> String {
        self.url_for(POSTGRES, self.options.password.as_deref(), "postgres")
    }

    /// `postgresql://user[:password]@127.0.0.1:<port>/database` (each part
    /// percent-encoded).
    pub fn url_for(&self, user: &str, password: Option<&str>, database: &str) -> String {
        let userinfo = match password {
            Some(pw) => format!("{}:{}", encode(user), encode(pw)),
            None => encode(user),
        };
        format!(
            "postgresql://{userinfo}@127.0.0.1:{}/{}",
            self.port,
            encode(database)
        )
    }

    /// Runs `sql` with `psql` as the superuser over TCP, and returns what it printed,
    /// trimmed (unaligned, tuples only: `select 1` gives `"1"`).
    ///
    /// # Panics
    /// When `psql` fails (with its stderr and the tail of the server's log).
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| self.fail(&format!("psql -c {sql:?}: {e}")))
    }

    /// Runs `sql` as [`psql`](Self::psql) does: its output, trimmed, or why it failed
    /// (its stderr; or a timeout, after 60 s).
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.run_psql(sql, PSQL_TIMEOUT)
    }

    /// The pid of the current (or, after [`kill`](Self::kill), the last) postmaster.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its temp dir (the data dir `data`, its Unix socket and its log).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The server's log (empty if unreadable).
    pub fn log_contents(&self) -> String {
        self.process.log_contents()
    }

    /// Stops the postmaster and all its children with SIGSTOP: the server keeps its
    /// sockets but answers nothing, on open connections as on new ones. Returns once the
    /// kernel reports them stopped.
    pub fn pause(&self) {
        // The postmaster first: stopped, it forks no new child.
        if let Err(e) = self.process.pause() {
            self.fail(&e);
        }
        let children = children_of(self.pid());
        let _ = signal(&children, "STOP");
        wait_for(SIGNAL_TIMEOUT, || {
            children
                .iter()
                .all(|&c| proc_stat(c).is_none_or(|(state, _)| matches!(state, 'T' | 'Z')))
        });
    }

    /// Continues a paused server (the postmaster and its children) with SIGCONT.
    pub fn resume(&self) {
        let children = children_of(self.pid());
        let _ = signal(&children, "CONT");
        if let Err(e) = self.process.resume() {
            self.fail(&e);
        }
        wait_for(SIGNAL_TIMEOUT, || {
            children
                .iter()
                .all(|&c| proc_stat(c).is_none_or(|(state, _)| state != 'T'))
        });
    }

    /// Whether [`pause`](Self::pause) was called without a later resume.
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// Kills the postmaster and all its children with SIGKILL (`kill -9`: no clean
    /// shutdown), reaps the postmaster and returns once none of them is alive (they hold
    /// the shared memory a new postmaster needs). Does nothing if it is not running.
    pub fn kill(&mut self) {
        let who = self.who();
        if self.process.is_running() {
            let pid = self.pid();
            // Stopped, the postmaster forks no child between the scan and the kill.
            let _ = signal(&[pid], "STOP");
            wait_for(SIGNAL_TIMEOUT, || {
                proc_stat(pid).is_none_or(|(state, _)| matches!(state, 'T' | 'Z'))
            });
            let children = children_of(pid);
            let _ = signal(&[&[pid], &children[..]].concat(), "KILL");
            self.process.kill(&who);
            let gone = wait_for(SIGNAL_TIMEOUT, || children.iter().all(|&c| !is_alive(c)));
            if !gone {
                log::warn!("{who}: children of pid {pid} still alive after SIGKILL");
            }
        }
        // Reaps a postmaster found exited, or does nothing.
        self.process.kill(&who);
    }

    /// Whether the postmaster is alive (not killed, stopped or exited). A paused one is
    /// running.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Kills the server (see [`kill`](Self::kill)) and starts it again on the same port
    /// with the same data dir: it recovers from the crash (replays its WAL). Returns once
    /// it answers queries.
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        Server::start(self, true);
    }

    /// Shuts the server down cleanly (SIGINT: a fast shutdown, which aborts open
    /// transactions and writes a checkpoint), and waits until the postmaster exits;
    /// kills it after 30 s. Does nothing if it is not running.
    pub fn stop(&mut self) {
        if !self.process.is_running() {
            return;
        }
        if self.is_paused() {
            self.resume();
        }
        if let Err(e) = signal(&[self.pid()], "INT") {
            self.fail(&format!("kill -INT: {e}"));
        }
        if !wait_for(STOP_TIMEOUT, || !self.process.is_running()) {
            log::warn!(
                "{}: no clean shutdown within {STOP_TIMEOUT:?}; killing it",
                self.who()
            );
        }
        self.kill();
    }

    /// Starts the server again after [`stop`](Self::stop) or [`kill`](Self::kill), on the
    /// same port with the same data dir, and returns once it answers queries. Does
    /// nothing if it is running.
    ///
    /// # Panics
    /// When it does not come up.
    pub fn start(&mut self) {
        if !self.process.is_running() {
            Server::start(self, true);
        }
    }

    /// Panics with `msg`, the server's port and pid, and the tail of its log.
    pub(crate) fn fail(&self, msg: &str) -> ! {
        self.process.fail(&self.who(), msg)
    }

    /// Makes the data dir (`initdb`), with the superuser's password if any.
    fn initdb(&self) {
        let dir = self.dir();
        let data = dir.join("data");
        let pwfile = dir.join("pwfile");
        if let Some(password) = &self.options.password {
            fs::write(&pwfile, password)
                .unwrap_or_else(|e| panic!("writing {}: {e}", pwfile.display()));
        }
        let initdb = self.bin_dir.join("initdb");
        let mut cmd = match *RUN_AS {
            Some((uid, gid)) => {
                chown_all(dir, uid, gid)
                    .unwrap_or_else(|e| panic!("chown -R {POSTGRES} {}: {e}", dir.display()));
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={POSTGRES}"))
                    .arg(format!("--regid={POSTGRES}"))
                    .args(["--clear-groups", "--"])
                    .arg(&initdb);
                cmd
            }
            None => Command::new(&initdb),
        };
        cmd.arg("-D").arg(&data);
        cmd.args(["-U", POSTGRES, "-E", "UTF8", "--locale=C", "-N"]);
        if self.options.password.is_some() {
            cmd.args(["--auth-local=trust", "--auth-host=scram-sha-256"])
                .arg(format!("--pwfile={}", pwfile.display()));
        } else {
            cmd.arg("--auth=trust");
        }
        cmd.current_dir(dir).stdin(Stdio::null());
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", initdb.display()));
        let _ = fs::remove_file(&pwfile);
        if !out.status.success() {
            panic!(
                "{} failed ({}):\n{}{}",
                initdb.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The `postgres` command line, on the current port.
    fn command(&self) -> Command {
        let dir = self.dir();
        let mut cmd = match *RUN_AS {
            Some(_) => self.process.command_as(POSTGRES),
            None => self.process.command(),
        };
        cmd.arg("-D").arg(dir.join("data"));
        cmd.arg("-p").arg(self.port.to_string());
        let fixed = [
            ("listen_addresses", "127.0.0.1".to_owned()),
            ("unix_socket_directories", dir.display().to_string()),
            ("shared_buffers", "16MB".to_owned()),
            ("max_connections", "200".to_owned()),
            ("fsync", "on".to_owned()),
            ("wal_level", "replica".to_owned()),
            ("max_wal_senders", "5".to_owned()),
            ("logging_collector", "off".to_owned()),
        ];
        let settings = fixed
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .chain(
                self.options
                    .settings
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            );
        for (name, value) in settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.process.stderr_file());
        cmd
    }

    /// Whether the server is ours and serves: its `postmaster.pid` names the current
    /// postmaster and says `ready` (another server that holds the port, whose connections
    /// `psql` would reach, is not taken for it), and it answers `select 1` over TCP.
    fn is_ready(&self) -> bool {
        let pidfile =
            fs::read_to_string(self.dir().join("data/postmaster.pid")).unwrap_or_default();
        let lines: Vec<&str> = pidfile.lines().map(str::trim).collect();
        // Line 1: the postmaster's pid; line 8: its status (`starting`, `ready`, or
        // `standby` for a standby that answers read-only queries...).
        if lines.first() != Some(&self.pid().to_string().as_str())
            || !matches!(lines.get(7), Some(&("ready" | "standby")))
        {
            return false;
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            && self
                .run_psql("select 1", PROBE_TIMEOUT)
                .is_ok_and(|out| out == "1")
    }

    /// `psql -c sql` as the superuser over TCP, killed after `timeout`.
    fn run_psql(&self, sql: &str, timeout: Duration) -> Result<String, String> {
        let in_dir = self.bin_dir.join("psql");
        let mut cmd = Command::new(if in_dir.is_file() {
            in_dir
        } else {
            PathBuf::from("psql")
        });
        cmd.args(["-X", "-A", "-t", "-w", "-v", "ON_ERROR_STOP=1"]);
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        cmd.args(["-U", POSTGRES, "-d", "postgres", "-c", sql]);
        match &self.options.password {
            Some(pw) => cmd.env("PGPASSWORD", pw),
            None => cmd.env_remove("PGPASSWORD"),
        };
        let out = output_within(cmd, timeout)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!(
                "psql exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Server for PostgresServer {
    fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    fn who(&self) -> String {
        format!("postgres on port {}", self.port)
    }

    fn start_once(&mut self, again: bool) -> Startup {
        if !again {
            free_ports(&[self.port]);
            self.port = pick_port();
        }
        let log_from = self.process.log_len();
        self.process.launch(self.command());
        let startup = self
            .process
            .wait_started(log_from, START_TIMEOUT, || self.is_ready());
        if matches!(startup, Startup::Failed(_)) {
            // Its children too, not only the postmaster (`Server::start` kills that).
            self.kill();
        }
        startup
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        free_ports(&[self.port]);
    }
}

/// Percent-encodes everything but unreserved characters (for URLs' user, password and
/// database).
fn encode(s: &str) -> String {
    s.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_percent_encoded() {
        assert_eq!(encode("a b@c:d/é"), "a%20b%40c%3Ad%2F%C3%A9");
    }
}
