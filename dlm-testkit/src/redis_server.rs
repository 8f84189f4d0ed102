//! Real `redis-server` processes for integration tests.
//!
//! [`RedisServer`] runs one `redis-server` child on a free loopback port, with its own
//! temporary directory (data, AOF and log file), and offers the controls a lock test
//! needs: pause/resume (SIGSTOP/SIGCONT), kill, restart on the same port and data dir,
//! early expiry of a key, script cache flush. [`RedisNodes`] runs several independent
//! servers (for Redlock). Every child is killed and reaped when its handle drops;
//! [`live_server_pids`] lets a test prove it.
//!
//! A test that needs a server fails when there is none ([`require_redis_server`] says
//! how to get one): it never passes without running.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long start-up may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports start-up tries when the chosen one turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// Read/write timeout of admin connections.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many log lines panic messages quote.
const LOG_TAIL_LINES: usize = 40;
const LOG_FILE: &str = "redis.log";
const STDERR_FILE: &str = "stderr.log";
/// The config file that [`RedisServerBuilder::config_file`] writes in the server's dir.
const CONFIG_FILE: &str = "redis.conf";
const NOT_FOUND: &str =
    "redis-server not found; install it (apt-get install redis-server) or set DLM_REDIS_SERVER";

/// Pids of the `RedisServer` children alive in this process.
static LIVE_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Ports handed out in this process, so that two servers never race for one port.
pub(crate) static USED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Locks a registry, shrugging off poisoning (a panicking test must not break others).
pub(crate) fn registry<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pids of all [`RedisServer`] children of this process that have not been killed
/// or dropped yet, sorted.
pub fn live_server_pids() -> Vec<u32> {
    registry(&LIVE_PIDS).iter().copied().collect()
}

/// Finds the `redis-server` binary: `$DLM_REDIS_SERVER` if set, else `redis-server` on
/// `PATH`, else `/usr/bin/redis-server` or `/usr/sbin/redis-server`.
pub fn redis_server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLM_REDIS_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
}

/// [`redis_server_binary`] for tests: the path, or a panic that says how to get one. A
/// test that needs a server and has none fails: it never passes without running
/// (`scripts/test` installs `redis-server` when it is missing).
///
/// # Panics
/// When no `redis-server` is found.
pub fn require_redis_server() -> PathBuf {
    redis_server_binary().unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// A `redis-server` older than 7.0 for compatibility tests (such servers take no
/// `SET ... NX GET`): `$DLM_REDIS_LEGACY_SERVER`, which `scripts/test` sets to a Redis 6.2
/// binary. `None` when unset.
pub fn legacy_redis_server_binary() -> Option<PathBuf> {
    std::env::var_os("DLM_REDIS_LEGACY_SERVER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// A free loopback port that no other server of this process has been given.
pub(crate) fn pick_port() -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if registry(&USED_PORTS).insert(port) {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// Percent-encodes a URL userinfo part.
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

/// Builds a [`RedisServer`] with non-default configuration.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    appendonly: bool,
    password: Option<String>,
    credentials: Option<(String, String)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    binary: Option<PathBuf>,
    tls: Option<TlsConfig>,
    cluster_port: bool,
    config_file: Option<String>,
}

/// The TLS port's certificate, key, CA and client-certificate rule.
#[derive(Debug, Clone)]
struct TlsConfig {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    auth_clients: bool,
}

impl RedisServerBuilder {
    /// Turns the append-only file on (`--appendonly yes --appendfsync always`), so
    /// that data survives [`RedisServer::restart`].
    pub fn appendonly(mut self, on: bool) -> Self {
        self.appendonly = on;
        self
    }

    /// Sets `requirepass` (the `default` user's password). [`RedisServer::connection`]
    /// and, unless [`credentials`](Self::credentials) are set, [`RedisServer::url`]
    /// authenticate with it.
    pub fn password(mut self, pw: &str) -> Self {
        self.password = Some(pw.to_owned());
        self
    }

    /// Adds an ACL user: `--user <user> <rules...>`, e.g.
    /// `acl_user("app", "on >secret ~dlm:* &dlm:* +@all")`.
    pub fn acl_user(mut self, user: &str, rules: &str) -> Self {
        self.args.extend(["--user".to_owned(), user.to_owned()]);
        self.args
            .extend(rules.split_whitespace().map(str::to_owned));
        self
    }

    /// The user and password that [`RedisServer::url`] carries (for the client under
    /// test). Admin controls keep using the `default` user.
    pub fn credentials(mut self, user: &str, pw: &str) -> Self {
        self.credentials = Some((user.to_owned(), pw.to_owned()));
        self
    }

    /// Appends a raw command-line argument, e.g. `.arg("--maxmemory").arg("1mb")`.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_owned());
        self
    }

    /// Adds an environment variable for the child (e.g. `LD_PRELOAD` for a clock shim).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Runs the server with its wall clock shifted by `skew` (see [`crate::skew`]):
    /// change the offset at any time, and the server's next clock read sees it. Survives
    /// [`RedisServer::restart`]. Keep `skew` alive as long as the server.
    ///
    /// # Panics
    /// When the shim cannot be compiled (no `cc`).
    pub fn clock_skew(self, skew: &crate::skew::ClockSkew) -> Self {
        let shim = crate::skew::shim().display().to_string();
        let file = skew.path().display().to_string();
        self.env("LD_PRELOAD", &shim).env("CLOCKSKEW_FILE", &file)
    }

    /// Opens a TLS port too (`--tls-port`), presenting `cert` from `pki` (see
    /// [`crate::tls`]); clients need no certificate of their own unless
    /// [`tls_auth_clients`](Self::tls_auth_clients). The plain port stays open for the
    /// testkit's admin connections; [`RedisServer::tls_url`] is the TLS one. Keep `pki`
    /// alive as long as the server (a restart reads the files again).
    pub fn tls(mut self, pki: &crate::tls::TestPki, cert: crate::tls::ServerCert) -> Self {
        let (cert, key) = pki.server_cert(cert);
        self.tls = Some(TlsConfig {
            cert,
            key,
            ca: pki.ca_file(),
            auth_clients: false,
        });
        self
    }

    /// Requires clients on the TLS port to present a certificate signed by the test CA
    /// (`--tls-auth-clients yes`: mutual TLS). Needs [`tls`](Self::tls) first.
    pub fn tls_auth_clients(mut self, on: bool) -> Self {
        let tls = self
            .tls
            .as_mut()
            .expect("tls_auth_clients needs tls(..) first");
        tls.auth_clients = on;
        self
    }

    /// Gives the server a cluster bus port of its own, `--cluster-port <free port>` (picked
    /// like the main port, kept across restarts; see [`RedisServer::cluster_port`]), for
    /// `--cluster-enabled yes` (see [`crate::cluster`]). Without it, the bus would listen on
    /// the main port + 10000, which may be taken or out of range.
    pub fn cluster_port(mut self, on: bool) -> Self {
        self.cluster_port = on;
        self
    }

    /// Runs this `redis-server` binary instead of the one [`redis_server_binary`] finds
    /// (e.g. [`legacy_redis_server_binary`]).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the server from a config file with `contents`, written once into its dir
    /// (the command-line options still apply on top). The file stays writable and is
    /// reused by [`RedisServer::restart`], as Sentinel needs (it rewrites its file).
    pub(crate) fn config_file(mut self, contents: &str) -> Self {
        self.config_file = Some(contents.to_owned());
        self
    }

    /// Starts the server and waits until it answers. Panics (with the server's log) if
    /// it cannot be started.
    pub fn spawn(self) -> RedisServer {
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => redis_server_binary().unwrap_or_else(|| panic!("{NOT_FOUND}")),
        };
        let dir = tempfile::Builder::new()
            .prefix("dlm-redis-")
            .tempdir()
            .expect("creating a temp dir for redis-server");
        if let Some(contents) = &self.config_file {
            fs::write(dir.path().join(CONFIG_FILE), contents)
                .expect("writing redis-server's config file");
        }
        let mut server = RedisServer {
            config: self,
            binary,
            dir,
            port: 0,
            tls_port: 0,
            cluster_port: 0,
            pid: 0,
            child: Mutex::new(None),
            paused: AtomicBool::new(false),
        };
        server.start(None);
        server
    }
}

/// What one start-up attempt came to.
enum Startup {
    Ready,
    PortTaken,
    Failed(String),
}

/// One `redis-server` child process on a loopback port, with its own temp dir.
///
/// Dropping it kills and reaps the process and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    config: RedisServerBuilder,
    binary: PathBuf,
    dir: TempDir,
    port: u16,
    /// The TLS port, 0 without TLS.
    tls_port: u16,
    /// The cluster bus port, 0 without [`RedisServerBuilder::cluster_port`].
    cluster_port: u16,
    pid: u32,
    child: Mutex<Option<Child>>,
    paused: AtomicBool,
}

impl RedisServer {
    /// Starts a server with the default configuration (no persistence, no password).
    pub fn spawn() -> RedisServer {
        Self::builder().spawn()
    }

    /// A builder for a server with non-default configuration.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port it listens on (127.0.0.1). It stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://[user:pw@]127.0.0.1:<port>/`, with the builder's
    /// [`credentials`](RedisServerBuilder::credentials), else its
    /// [`password`](RedisServerBuilder::password), if any.
    pub fn url(&self) -> String {
        match (&self.config.credentials, &self.config.password) {
            (Some((user, pw)), _) => self.url_with(&format!("{}:{}@", encode(user), encode(pw))),
            (None, Some(pw)) => self.url_with(&format!(":{}@", encode(pw))),
            (None, None) => self.url_with(""),
        }
    }

    /// The URL of the `default` user (the admin), with the password if any.
    fn admin_url(&self) -> String {
        match &self.config.password {
            Some(pw) => self.url_with(&format!(":{}@", encode(pw))),
            None => self.url_with(""),
        }
    }

    fn url_with(&self, userinfo: &str) -> String {
        format!("redis://{userinfo}127.0.0.1:{}/", self.port)
    }

    /// `rediss://[user:pw@]127.0.0.1:<tls port>/`, with the same credentials as
    /// [`url`](Self::url).
    ///
    /// # Panics
    /// When the server was built without [`RedisServerBuilder::tls`].
    pub fn tls_url(&self) -> String {
        assert!(self.tls_port != 0, "this server has no TLS port");
        self.url()
            .replacen("redis://", "rediss://", 1)
            .replace(&format!(":{}/", self.port), &format!(":{}/", self.tls_port))
    }

    /// The TLS port (0 without TLS).
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The cluster bus port (0 without [`RedisServerBuilder::cluster_port`]).
    pub fn cluster_port(&self) -> u16 {
        self.cluster_port
    }

    /// The pid of the current (or, after [`kill`](Self::kill), the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its temp dir (data, AOF, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A direct admin connection (the `default` user, with the password if any) with 5 s
    /// connect/read/write timeouts. Panics with the log tail if it cannot connect.
    pub fn connection(&self) -> redis::Connection {
        connect(&self.admin_url(), ADMIN_TIMEOUT)
            .unwrap_or_else(|e| self.fail(&format!("admin connection: {e}")))
    }

    /// Stops the process with SIGSTOP: it keeps its sockets but answers nothing. Returns
    /// once the kernel reports it stopped.
    pub fn pause(&self) {
        self.signal("STOP");
        self.paused.store(true, Ordering::SeqCst);
        self.wait_proc_state(|s| s == 'T');
    }

    /// Continues a paused process with SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
        self.paused.store(false, Ordering::SeqCst);
        self.wait_proc_state(|s| s != 'T');
    }

    /// Whether [`pause`](Self::pause) was called without a later resume.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Kills the process with SIGKILL and reaps it; the server is down afterwards.
    /// Does nothing if it is not running.
    pub fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut child) = child {
            if self.paused.swap(false, Ordering::SeqCst) {
                let _ = send_signal(child.id(), "CONT");
            }
            let _ = child.kill();
            let _ = child.wait();
            registry(&LIVE_PIDS).remove(&child.id());
            log::debug!(
                "redis-server pid {} on port {} killed",
                child.id(),
                self.port
            );
        }
    }

    /// Kills the process (if running) and starts it again on the same port, with the
    /// same configuration and data dir (so with AOF on, the data survives). Returns once
    /// it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        self.start(Some(port));
    }

    /// Whether the process is alive (not killed, not exited). A paused one is running.
    pub fn is_running(&self) -> bool {
        let mut guard = registry(&self.child);
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        registry(&LIVE_PIDS).remove(&child.id());
        *guard = None;
        false
    }

    /// `SCRIPT FLUSH`: empties the Lua script cache (the next EVALSHA gets NOSCRIPT).
    pub fn flush_scripts(&self) {
        let _: () = self.query(redis::cmd("SCRIPT").arg("FLUSH"));
    }

    /// Expires `key` now on this server (`PEXPIRE key 1`), and returns once it is gone.
    pub fn expire_now(&self, key: &str) {
        let mut con = self.connection();
        let deadline = Instant::now() + Duration::from_secs(2);
        let run = |con: &mut redis::Connection, cmd: &redis::Cmd| -> bool {
            cmd.query(con)
                .unwrap_or_else(|e| self.fail(&format!("expiring {key:?}: {e}")))
        };
        run(&mut con, redis::cmd("PEXPIRE").arg(key).arg(1));
        // EXISTS on an expired key deletes it (lazy expiry), firing the `expired` event.
        while run(&mut con, redis::cmd("EXISTS").arg(key)) {
            if Instant::now() > deadline {
                self.fail(&format!("key {key:?} did not expire"));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// The server's log file (empty if unreadable).
    pub fn log_contents(&self) -> String {
        fs::read(self.dir().join(LOG_FILE))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The output of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
    }

    /// Runs one command on a fresh admin connection; panics with the log tail on error.
    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| self.fail(&format!("command {:?} failed: {e}", cmd_text(cmd))))
    }

    fn signal(&self, sig: &str) {
        if let Err(e) = send_signal(self.pid, sig) {
            self.fail(&format!("kill -{sig} {}: {e}", self.pid));
        }
    }

    /// Waits (up to 2 s) until `/proc/<pid>/stat` shows a state that `ok` accepts.
    fn wait_proc_state(&self, ok: impl Fn(char) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(state) = proc_state(self.pid) {
            if ok(state) || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Panics with `msg`, the server's port and pid, and the tail of its logs.
    fn fail(&self, msg: &str) -> ! {
        panic!(
            "redis-server on port {} (pid {}): {msg}\n{}",
            self.port,
            self.pid,
            self.log_tail()
        )
    }

    fn log_tail(&self) -> String {
        let log = self.log_contents();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        let stderr = fs::read_to_string(self.dir().join(STDERR_FILE)).unwrap_or_default();
        format!("--- redis.log (last {LOG_TAIL_LINES} lines) ---\n{tail}\n--- stderr ---\n{stderr}")
    }

    /// Starts the child on `port` (restart), or on a fresh port, retrying a few times if
    /// another process grabs it first. Panics with the log if it does not come up.
    fn start(&mut self, port: Option<u16>) {
        for attempt in 1..=START_ATTEMPTS {
            self.port = port.unwrap_or_else(pick_port);
            if self.config.tls.is_some() && (port.is_none() || self.tls_port == 0) {
                if self.tls_port != 0 {
                    registry(&USED_PORTS).remove(&self.tls_port);
                }
                self.tls_port = pick_port();
            }
            if self.config.cluster_port && (port.is_none() || self.cluster_port == 0) {
                if self.cluster_port != 0 {
                    registry(&USED_PORTS).remove(&self.cluster_port);
                }
                self.cluster_port = pick_port();
            }
            let log_offset = fs::metadata(self.dir().join(LOG_FILE)).map_or(0, |m| m.len());
            let child = spawn_child(self.command()).unwrap_or_else(|e| {
                panic!("spawning {}: {e}", self.binary.display());
            });
            self.pid = child.id();
            *registry(&self.child) = Some(child);
            registry(&LIVE_PIDS).insert(self.pid);
            match self.wait_ready(log_offset) {
                Startup::Ready => {
                    log::debug!("redis-server pid {} ready on port {}", self.pid, self.port);
                    return;
                }
                Startup::PortTaken => {
                    log::debug!("port {} taken (attempt {attempt}); retrying", self.port);
                    self.kill();
                    if port.is_some() {
                        thread::sleep(Duration::from_millis(200));
                    }
                }
                Startup::Failed(why) => {
                    let msg = format!("failed to start: {why}");
                    self.kill();
                    self.fail(&msg);
                }
            }
        }
        self.fail(&format!("port still taken after {START_ATTEMPTS} attempts"));
    }

    fn command(&self) -> Command {
        let dir = self.dir();
        let log = dir.join(LOG_FILE);
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(STDERR_FILE))
            .expect("opening redis-server's stderr file");
        let mut cmd = match &*SETPRIV {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
                cmd
            }
            None => Command::new(&self.binary),
        };
        if self.config.config_file.is_some() {
            // The config file must be the first argument.
            cmd.arg(dir.join(CONFIG_FILE));
        }
        cmd.arg("--port").arg(self.port.to_string());
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"]);
        cmd.args(["--protected-mode", "no"]);
        cmd.arg("--dir").arg(dir).arg("--logfile").arg(&log);
        if self.config.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            cmd.args(["--appenddirname", "appendonlydir"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(pw) = &self.config.password {
            cmd.args(["--requirepass", pw]);
        }
        if let Some(tls) = &self.config.tls {
            cmd.arg("--tls-port").arg(self.tls_port.to_string());
            cmd.arg("--tls-cert-file").arg(&tls.cert);
            cmd.arg("--tls-key-file").arg(&tls.key);
            cmd.arg("--tls-ca-cert-file").arg(&tls.ca);
            cmd.args([
                "--tls-auth-clients",
                if tls.auth_clients { "yes" } else { "no" },
            ]);
        }
        if self.cluster_port != 0 {
            cmd.arg("--cluster-port").arg(self.cluster_port.to_string());
        }
        cmd.args(&self.config.args);
        cmd.envs(self.config.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        cmd
    }

    /// Polls until our child answers PING (and INFO shows our pid), it exits, or the
    /// start-up timeout runs out.
    fn wait_ready(&self, log_offset: u64) -> Startup {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = self.admin_url();
        loop {
            let exited = registry(&self.child)
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = self.log_contents();
                let new_log = log.get(log_offset as usize..).unwrap_or(&log);
                if new_log.contains("Address already in use") {
                    return Startup::PortTaken;
                }
                return Startup::Failed(format!("redis-server exited with {status}"));
            }
            if self.answers(&url) {
                return Startup::Ready;
            }
            if Instant::now() > deadline {
                return Startup::Failed(format!("no answer within {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server on our port answers PING and is our child (not some other
    /// process that grabbed the port).
    fn answers(&self, url: &str) -> bool {
        let Ok(mut con) = connect(url, Duration::from_millis(250)) else {
            return false;
        };
        if redis::cmd("PING").query::<String>(&mut con).is_err() {
            return false;
        }
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .unwrap_or_default();
        info.lines()
            .any(|l| l.trim() == format!("process_id:{}", self.pid))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        registry(&USED_PORTS).remove(&self.port);
        registry(&USED_PORTS).remove(&self.tls_port);
        registry(&USED_PORTS).remove(&self.cluster_port);
    }
}

/// Connects to `url` with `timeout` for connect, reads and writes.
fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

/// `setpriv` (util-linux), if it is there and can set a parent-death signal: servers are
/// started through it (it `exec`s redis-server, so the pid stays the server's) so that
/// the kernel kills them when this process dies without running destructors (SIGKILL, a
/// harness's timeout, a crash). Without it, only `Drop` stops them.
pub(crate) static SETPRIV: LazyLock<Option<PathBuf>> = LazyLock::new(|| {
    let works = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        log::warn!(
            "setpriv --pdeathsig is not available: a killed test process leaves its redis-servers running"
        );
    }
    works.then(|| PathBuf::from("setpriv"))
});

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks every server from one thread that lives as long as the process: a parent-death
/// signal fires when the *thread* that forked the child ends, and a server restarted from
/// a short-lived helper thread must not die with that thread.
pub(crate) fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: LazyLock<Mutex<mpsc::Sender<SpawnRequest>>> = LazyLock::new(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("redis-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the redis-server spawner thread");
        Mutex::new(tx)
    });
    let (reply, result) = mpsc::channel();
    registry(&SPAWNER)
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// Sends `SIG<sig>` to `pid` with the `kill` command (no `unsafe` needed).
pub(crate) fn send_signal(pid: u32, sig: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill exited with {status}")))
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`...), if readable.
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The command as text, for messages.
fn cmd_text(cmd: &redis::Cmd) -> String {
    let args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
        _ => "<cursor>".to_owned(),
    });
    args.collect::<Vec<_>>().join(" ")
}

/// Several independent servers (for Redlock tests).
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` servers with the default configuration.
    pub fn spawn(n: usize) -> RedisNodes {
        Self::spawn_with(n, |b| b)
    }

    /// Starts `n` servers, each configured by `f` applied to a fresh builder.
    pub fn spawn_with(
        n: usize,
        f: impl Fn(RedisServerBuilder) -> RedisServerBuilder,
    ) -> RedisNodes {
        RedisNodes {
            nodes: (0..n).map(|_| f(RedisServer::builder()).spawn()).collect(),
        }
    }

    /// The URL of every server, in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every server, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, RedisServer> {
        self.nodes.iter()
    }

    /// Server `i`. Panics if out of range.
    pub fn get(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Server `i`, mutably (to kill or restart it). Panics if out of range.
    pub fn get_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// How many servers there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_percent_encoded() {
        assert_eq!(encode("a-b_c.d~9"), "a-b_c.d~9");
        assert_eq!(encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }

    #[test]
    fn proc_state_reads_own_process() {
        assert!(matches!(proc_state(std::process::id()), Some('R' | 'S')));
    }
}
