//! Real PgBouncer processes in front of a [`PostgresServer`], for integration tests.
//!
//! [`PgBouncer`] is one `pgbouncer` process on a free loopback port, with its own
//! temporary directory (its `pgbouncer.ini`, its `userlist.txt` and its log; no Unix
//! socket), in one of PgBouncer's pool modes ([`PoolMode`]). It sends every database
//! to the server it was spawned for (`* = host=127.0.0.1 port=<server port>`), trusts
//! every client listed in its user list (`postgres`), keeps at most 20 server
//! connections per database and user and takes up to 200 clients. It is killed and
//! reaped when its handle drops (and, where `setpriv` can set a parent-death signal,
//! when the test process dies); [`live_pgbouncer_pids`] lets a test prove it.
//!
//! PgBouncer refuses to run as root, as PostgreSQL does: when the test process is root,
//! it runs as the OS user `postgres`, and its temp dir is handed to that user.
//!
//! The transaction mode is the one that matters: a client's consecutive transactions
//! may run on different server connections, and server connections are shared between
//! clients, so whatever lives in a session (a session advisory lock, a `LISTEN`, a named
//! prepared statement, a `SET`) is lost or leaks to another client.
//!
//! No startup parameter of `tokio-postgres` (0.7: `client_encoding`, `user`, `database`,
//! `application_name`) needs `ignore_startup_parameters`: PgBouncer tracks them all, and
//! dlm-postgres connects through it as it is. A URL with `options=...` (sent as the
//! startup parameter `options`) is refused by PgBouncer 1.18 ("unsupported startup
//! parameter: options") unless the pooler has `ignore_startup_parameters = options`,
//! which drops those options; JDBC's `extra_float_digits` needs the same. Give
//! such settings to [`PgBouncer::spawn_with`].
//!
//! A test that needs PgBouncer fails when there is none ([`require_pgbouncer`] says how
//! to get one): it never passes without running. The binary is `$DLM_PGBOUNCER`, else
//! `pgbouncer` on `PATH`, else `/usr/sbin/pgbouncer` (`scripts/ensure-postgres` installs
//! Debian's `pgbouncer` when it is missing).
//!
//! ```no_run
//! use dlm_testkit::pgbouncer::{PgBouncer, PoolMode};
//! use dlm_testkit::postgres::PostgresServer;
//!
//! let server = PostgresServer::spawn();
//! let bouncer = PgBouncer::spawn(&server, PoolMode::Transaction);
//! println!("{}", bouncer.url()); // postgresql://postgres@127.0.0.1:<port>/postgres
//! // Two server connections shared by every client:
//! let two = [("default_pool_size", "2")];
//! let small = PgBouncer::spawn_with(&server, PoolMode::Transaction, &two);
//! let pools = small.show("POOLS"); // the admin console's SHOW POOLS, one map per row
//! # let _ = pools;
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::chown;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::pg_os::{POSTGRES, RUN_AS, output_within};
use crate::postgres::{PostgresServer, postgres_bin_dir};
use crate::process::{
    LivePids, Logs, Process, Server, Startup, find_binary, free_ports, pick_port,
};

/// How long start-up may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `psql` (a readiness probe, an admin command) may take.
const PSQL_TIMEOUT: Duration = Duration::from_secs(10);
/// The log: PgBouncer writes it to stderr (no `logfile`).
const LOGS: Logs = Logs {
    log: "pgbouncer.log",
    stderr: None,
};
/// Its configuration file and user list, in its temp dir.
const INI: &str = "pgbouncer.ini";
const USERLIST: &str = "userlist.txt";
/// The OS user it runs as when this process is root, and the user it lets in.
const NOT_FOUND: &str =
    "pgbouncer not found; install it (apt-get install pgbouncer) or set DLM_PGBOUNCER";

/// Pids of the pgbouncer children alive in this process.
static LIVE_PIDS: LivePids = LivePids::new();

/// The pids of all pgbouncer children of this process that have not been killed or
/// dropped yet, sorted.
pub fn live_pgbouncer_pids() -> Vec<u32> {
    LIVE_PIDS.pids()
}

/// Finds the `pgbouncer` binary: `$DLM_PGBOUNCER` if set, else `pgbouncer` on `PATH`,
/// else `/usr/sbin/pgbouncer`.
pub fn pgbouncer_binary() -> Option<PathBuf> {
    find_binary("DLM_PGBOUNCER", "pgbouncer", &["/usr/sbin", "/usr/bin"])
}

/// [`pgbouncer_binary`] for tests: the path, or a panic that says how to get one.
///
/// # Panics
/// When no `pgbouncer` is found.
pub fn require_pgbouncer() -> PathBuf {
    pgbouncer_binary().unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// When PgBouncer gives a client's server connection back to the pool (`pool_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolMode {
    /// When the client disconnects: one server connection per client (`session`).
    Session,
    /// After each transaction: a client's transactions may run on different server
    /// connections, shared with other clients (`transaction`).
    Transaction,
    /// After each statement; transactions of several statements are refused
    /// (`statement`).
    Statement,
}

impl PoolMode {
    /// Its name in `pgbouncer.ini`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// One PgBouncer on a loopback port in front of a PostgreSQL server, with its own temp
/// dir.
///
/// Dropping it kills and reaps the process and removes the directory. The server is not
/// owned: it must outlive the pooler's use (a pooler whose server is gone refuses
/// clients, or makes them wait).
#[derive(Debug)]
pub struct PgBouncer {
    /// The child (the current one, across restarts), its temp dir and log.
    process: Process,
    mode: PoolMode,
    port: u16,
    server_port: u16,
    /// Extra `[pgbouncer]` settings, over the testkit's own.
    settings: Vec<(String, String)>,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of `server`, and waits until a query through
    /// it is answered by the server.
    ///
    /// # Panics
    /// When PgBouncer is missing, when `server` asks for a password (the pooler trusts
    /// its clients and logs in without one), or when it does not come up (with the tail
    /// of its log).
    pub fn spawn(server: &PostgresServer, mode: PoolMode) -> PgBouncer {
        Self::spawn_with(server, mode, &[])
    }

    /// As [`spawn`](Self::spawn), with extra `[pgbouncer]` settings of `pgbouncer.ini`
    /// (`("default_pool_size", "2")`, `("ignore_startup_parameters", "extra_float_digits")`),
    /// which replace the testkit's own of the same name.
    ///
    /// # Panics
    /// As [`spawn`](Self::spawn).
    pub fn spawn_with(
        server: &PostgresServer,
        mode: PoolMode,
        settings: &[(&str, &str)],
    ) -> PgBouncer {
        let url = server.url();
        let userinfo = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once('@'))
            .map_or("", |(userinfo, _)| userinfo);
        assert!(
            !userinfo.contains(':'),
            "PgBouncer::spawn needs a server that trusts its connections (PostgresServer::spawn), \
             not one with a password"
        );
        let binary = require_pgbouncer();
        let mut bouncer = PgBouncer {
            process: Process::new("pgbouncer", binary, "dlm-pgbouncer-", LOGS, &LIVE_PIDS),
            mode,
            port: 0,
            server_port: server.port(),
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let userlist = bouncer.dir().join(USERLIST);
        fs::write(&userlist, format!("\"{POSTGRES}\" \"\"\n"))
            .unwrap_or_else(|e| panic!("writing {}: {e}", userlist.display()));
        Server::start(&mut bouncer, false);
        bouncer
    }

    /// The TCP port it listens on (127.0.0.1). It stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pool mode it runs in.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// `postgresql://postgres@127.0.0.1:<port>/postgres`: the server's superuser and
    /// database, through the pooler.
    pub fn url(&self) -> String {
        format!("postgresql://{POSTGRES}@127.0.0.1:{}/postgres", self.port)
    }

    crate::process::controls!();

    /// Kills the process (if running) and starts it again on the same port. Returns once
    /// a query through it is answered.
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        self.start(true);
    }

    /// `SHOW <what>` on PgBouncer's admin console (`POOLS`, `SERVERS`, `CLIENTS`,
    /// `STATS`, `CONFIG`...): one map per row, from column to value.
    ///
    /// # Panics
    /// When the command fails.
    pub fn show(&self, what: &str) -> Vec<BTreeMap<String, String>> {
        let out = self
            .psql("pgbouncer", &format!("SHOW {what}"), false)
            .unwrap_or_else(|e| self.fail(&format!("SHOW {what}: {e}")));
        let mut lines = out.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
        lines
            .map(|line| {
                header
                    .iter()
                    .zip(line.split('\t'))
                    .map(|(k, v)| ((*k).to_owned(), v.to_owned()))
                    .collect()
            })
            .collect()
    }

    /// The `pgbouncer.ini`, on the current port.
    fn ini(&self) -> String {
        let dir = self.dir();
        let mut settings: Vec<(String, String)> = [
            ("listen_addr", "127.0.0.1".to_owned()),
            ("listen_port", self.port.to_string()),
            // No Unix socket (nothing to create in a directory of the right owner).
            ("unix_socket_dir", String::new()),
            ("pidfile", String::new()),
            // The log goes to stderr, which is the log file (opened by this process).
            ("logfile", String::new()),
            ("auth_type", "trust".to_owned()),
            ("auth_file", dir.join(USERLIST).display().to_string()),
            ("admin_users", POSTGRES.to_owned()),
            ("pool_mode", self.mode.as_str().to_owned()),
            ("default_pool_size", "20".to_owned()),
            ("max_client_conn", "200".to_owned()),
            // A server that was down is tried again within a second, not PgBouncer's 15.
            ("server_login_retry", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (name, value) in &self.settings {
            match settings.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1.clone_from(value),
                None => settings.push((name.clone(), value.clone())),
            }
        }
        let mut ini = format!(
            "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n",
            self.server_port
        );
        for (name, value) in settings {
            ini.push_str(&format!("{name} = {value}\n"));
        }
        ini
    }

    /// Writes the configuration and returns the command line, on the current port.
    fn command(&self) -> Command {
        let dir = self.dir();
        let ini = dir.join(INI);
        fs::write(&ini, self.ini()).unwrap_or_else(|e| panic!("writing {}: {e}", ini.display()));
        let mut cmd = match *RUN_AS {
            Some((uid, gid)) => {
                for path in [dir.to_owned(), ini.clone(), dir.join(USERLIST)] {
                    chown(&path, Some(uid), Some(gid))
                        .unwrap_or_else(|e| panic!("chown {POSTGRES} {}: {e}", path.display()));
                }
                self.process.command_as(POSTGRES)
            }
            None => self.process.command(),
        };
        cmd.arg(&ini);
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.process.stderr_file());
        cmd
    }

    /// Whether it serves: the port takes connections and `select 1` through it is
    /// answered by the server.
    fn is_ready(&self) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            && self
                .psql("postgres", "select 1", true)
                .is_ok_and(|out| out == "1")
    }

    /// `psql -c sql` to `database` through the pooler, killed after a timeout:
    /// unaligned, fields separated by tabs, with the header unless `tuples_only`.
    fn psql(&self, database: &str, sql: &str, tuples_only: bool) -> Result<String, String> {
        let psql = postgres_bin_dir()
            .map(|dir| dir.join("psql"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("psql"));
        let mut cmd = Command::new(psql);
        cmd.args(["-X", "-A", "-w", "-F", "\t", "-P", "footer=off"]);
        if tuples_only {
            cmd.arg("-t");
        }
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        cmd.args(["-U", POSTGRES, "-d", database, "-c", sql]);
        cmd.env_remove("PGPASSWORD");
        let out = output_within(cmd, PSQL_TIMEOUT)?;
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

impl Server for PgBouncer {
    fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    fn who(&self) -> String {
        format!(
            "pgbouncer ({} mode) on port {}, in front of port {}",
            self.mode.as_str(),
            self.port,
            self.server_port
        )
    }

    fn start_once(&mut self, again: bool) -> Startup {
        if !again {
            free_ports(&[self.port]);
            self.port = pick_port();
        }
        let log_from = self.process.log_len();
        self.process.launch(self.command());
        self.process
            .wait_started(log_from, START_TIMEOUT, || self.is_ready())
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill();
        free_ports(&[self.port]);
    }
}
