//! Real `etcd` processes for integration tests.
//!
//! [`EtcdServer`] is one `etcd` member on free loopback ports (client and peer), with its
//! own temporary directory (the data dir and the log), and the controls a lock test
//! needs: pause/resume (SIGSTOP/SIGCONT), kill (SIGKILL), restart on the same ports and
//! data. [`EtcdServer::spawn`] starts a one-member cluster; [`EtcdCluster::spawn`] starts
//! `n` members that form one cluster. Every child is killed and reaped when its handle
//! drops (and, where `setpriv` can set a parent-death signal, when the test process dies);
//! [`live_etcd_pids`] lets a test prove it.
//!
//! The members run with a 50 ms heartbeat and a 500 ms election timeout (etcd's defaults
//! are 100 ms and 1 s), so that an election after a leader is killed takes well under a
//! second, and the shortest lease etcd grants is 1 s (its floor is 1.5 election timeouts,
//! rounded up to whole seconds: 2 s with the defaults).
//!
//! A test that needs etcd fails when there is none ([`require_etcd`] says how to get one):
//! it never passes without running. The binary is `$DLM_ETCD_SERVER`, else `etcd` on
//! `PATH` (`scripts/test` installs Debian's `etcd-server`, 3.4, when it is missing).
//!
//! ```no_run
//! use dlm_testkit::etcd::{EtcdCluster, EtcdServer};
//!
//! let one = EtcdServer::spawn();
//! println!("{}", one.url()); // http://127.0.0.1:<port>
//! let mut three = EtcdCluster::spawn(3);
//! let leader = three.wait_for_leader();
//! three.get_mut(leader).kill(); // the other two elect a new leader
//! ```

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::tls::ServerCert;

mod admin;
mod cluster;

use admin::http;
pub use cluster::EtcdCluster;

use crate::redis_server::{SETPRIV, USED_PORTS, proc_state, registry, send_signal, spawn_child};

/// How long start-up may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How many fresh port sets start-up tries when a port turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// Timeout of the testkit's own HTTP requests.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
const LOG_FILE: &str = "etcd.log";
const LOG_TAIL_LINES: usize = 40;
const NOT_FOUND: &str =
    "etcd not found; install it (apt-get install etcd-server) or set DLM_ETCD_SERVER";

/// Pids of the etcd children alive in this process.
static LIVE_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// The pids of all etcd children of this process that have not been killed or dropped
/// yet, sorted.
pub fn live_etcd_pids() -> Vec<u32> {
    lock(&LIVE_PIDS).iter().copied().collect()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    registry(m)
}

/// Finds the `etcd` binary: `$DLM_ETCD_SERVER` if set, else `etcd` on `PATH`, else
/// `/usr/bin/etcd`.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLM_ETCD_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

/// [`etcd_binary`] for tests: the path, or a panic that says how to get one.
///
/// # Panics
/// When no `etcd` is found.
pub fn require_etcd() -> PathBuf {
    etcd_binary().unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// One `etcd` member process on loopback ports, with its own temp dir.
///
/// Dropping it kills and reaps the process and removes the directory.
#[derive(Debug)]
pub struct EtcdServer {
    name: String,
    binary: PathBuf,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
    /// `--initial-cluster` (every member's name and peer URL).
    initial_cluster: String,
    /// `--initial-cluster-token`: unique per cluster, so two clusters never merge.
    cluster_token: String,
    pid: u32,
    child: Mutex<Option<Child>>,
    paused: AtomicBool,
    /// A TLS client port beside the plain one, and its files.
    tls: Option<EtcdTls>,
    tls_port: u16,
}

/// The files of a member's TLS client port (`--cert-file`, `--key-file`,
/// `--trusted-ca-file`) and whether it asks clients for a certificate
/// (`--client-cert-auth`).
#[derive(Clone, Debug)]
struct EtcdTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    client_cert_auth: bool,
}

/// What one start-up attempt came to.
enum Startup {
    Ready,
    PortTaken,
    Failed(String),
}

impl EtcdServer {
    /// Starts a one-member cluster and waits until it is healthy (it has elected itself
    /// leader and serves requests).
    ///
    /// # Panics
    /// When etcd is missing or does not come up (with the tail of its log).
    pub fn spawn() -> EtcdServer {
        let mut cluster = EtcdCluster::spawn(1);
        cluster.members.pop().expect("one member")
    }

    /// Starts a one-member cluster that also serves a TLS client port
    /// ([`tls_url`](Self::tls_url)) with `cert` from `pki`, trusting `pki`'s CA; with
    /// `client_cert_auth`, that port requires a client certificate signed by it (mutual
    /// TLS). The plain port stays open for the testkit's own requests. Keep `pki` alive
    /// while the server runs (its files are read at restarts).
    ///
    /// # Panics
    /// As [`spawn`](Self::spawn).
    pub fn spawn_tls(
        pki: &crate::tls::TestPki,
        cert: ServerCert,
        client_cert_auth: bool,
    ) -> EtcdServer {
        let (cert, key) = pki.server_cert(cert);
        let tls = EtcdTls {
            cert,
            key,
            ca: pki.ca_file(),
            client_cert_auth,
        };
        let mut cluster = EtcdCluster::spawn_with(1, Some(tls));
        cluster.members.pop().expect("one member")
    }

    /// `https://127.0.0.1:<TLS client port>`.
    ///
    /// # Panics
    /// When the server was not started with [`spawn_tls`](Self::spawn_tls).
    pub fn tls_url(&self) -> String {
        assert!(self.tls_port != 0, "this etcd has no TLS port");
        format!("https://127.0.0.1:{}", self.tls_port)
    }

    /// The TLS client port (0 without one).
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    fn new(binary: &Path, name: String, cluster_token: &str) -> EtcdServer {
        let dir = tempfile::Builder::new()
            .prefix("dlm-etcd-")
            .tempdir()
            .expect("creating a temp dir for etcd");
        EtcdServer {
            name,
            binary: binary.to_owned(),
            dir,
            client_port: 0,
            peer_port: 0,
            initial_cluster: String::new(),
            cluster_token: cluster_token.to_owned(),
            pid: 0,
            child: Mutex::new(None),
            paused: AtomicBool::new(false),
            tls: None,
            tls_port: 0,
        }
    }

    /// `http://127.0.0.1:<client port>`: the URL clients use (the v3 JSON gateway is
    /// under `/v3/`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client port. It stays the same across restarts.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer (Raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The member's name (`--name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pid of the current (or, after [`kill`](Self::kill), the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its temp dir (`data/`, `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The member's log (empty if unreadable).
    pub fn log_contents(&self) -> String {
        fs::read(self.dir().join(LOG_FILE))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
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

    /// Kills the process with SIGKILL (`kill -9`: no clean shutdown) and reaps it. Does
    /// nothing if it is not running.
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
            lock(&LIVE_PIDS).remove(&child.id());
            log::debug!("etcd {} pid {} killed", self.name, child.id());
        }
    }

    /// Kills the process (if running) and starts it again on the same ports with the same
    /// data dir. Returns once it serves its client port, which a member of a cluster does
    /// only once it has reached a quorum of its peers: to restart a majority at once, use
    /// [`EtcdCluster::restart_all`].
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        for attempt in 1..=START_ATTEMPTS {
            self.launch();
            match self.wait_started(false) {
                Startup::Ready => return,
                Startup::PortTaken => {
                    log::debug!("etcd {}: port taken (attempt {attempt})", self.name);
                    self.kill();
                    thread::sleep(Duration::from_millis(200));
                }
                Startup::Failed(why) => {
                    self.kill();
                    self.fail(&format!("failed to restart: {why}"));
                }
            }
        }
        self.fail("ports still taken after restarts");
    }

    /// Whether the process is alive (not killed, not exited). A paused one is running.
    pub fn is_running(&self) -> bool {
        let mut guard = lock(&self.child);
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        lock(&LIVE_PIDS).remove(&child.id());
        *guard = None;
        false
    }

    /// Whether `GET /health` answers `"health":"true"` (a leader is known and the member
    /// serves requests).
    pub fn is_healthy(&self) -> bool {
        http(self.client_port, "GET", "/health", "", None)
            .is_ok_and(|(code, body)| code == 200 && body.contains("\"health\":\"true\""))
    }

    fn signal(&self, sig: &str) {
        if let Err(e) = send_signal(self.pid, sig) {
            self.fail(&format!("kill -{sig} {}: {e}", self.pid));
        }
    }

    fn wait_proc_state(&self, ok: impl Fn(char) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(state) = proc_state(self.pid) {
            if ok(state) || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn fail(&self, msg: &str) -> ! {
        panic!(
            "etcd {} (client port {}, pid {}): {msg}\n{}",
            self.name,
            self.client_port,
            self.pid,
            self.log_tail()
        )
    }

    fn log_tail(&self) -> String {
        let log = self.log_contents();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("--- etcd.log (last {LOG_TAIL_LINES} lines) ---\n{tail}")
    }

    /// Starts the process with the current ports and cluster settings.
    fn launch(&mut self) {
        let child = spawn_child(self.command())
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.binary.display()));
        self.pid = child.id();
        *lock(&self.child) = Some(child);
        lock(&LIVE_PIDS).insert(self.pid);
    }

    fn command(&self) -> Command {
        let dir = self.dir();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(LOG_FILE))
            .expect("opening etcd's log file");
        let mut cmd = match &*SETPRIV {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
                cmd
            }
            None => Command::new(&self.binary),
        };
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        cmd.arg("--name").arg(&self.name);
        cmd.arg("--data-dir").arg(dir.join("data"));
        match &self.tls {
            None => {
                cmd.arg("--listen-client-urls").arg(&client);
                cmd.arg("--advertise-client-urls").arg(&client);
            }
            Some(tls) => {
                let both = format!("{client},https://127.0.0.1:{}", self.tls_port);
                cmd.arg("--listen-client-urls").arg(&both);
                cmd.arg("--advertise-client-urls").arg(&both);
                cmd.arg("--cert-file").arg(&tls.cert);
                cmd.arg("--key-file").arg(&tls.key);
                // etcd asks every client for a certificate once it has a CA to check
                // them with, so the CA is given only with client-cert-auth.
                if tls.client_cert_auth {
                    cmd.arg("--trusted-ca-file").arg(&tls.ca);
                    cmd.arg("--client-cert-auth");
                }
            }
        }
        cmd.arg("--listen-peer-urls").arg(&peer);
        cmd.arg("--initial-advertise-peer-urls").arg(&peer);
        cmd.arg("--initial-cluster").arg(&self.initial_cluster);
        cmd.arg("--initial-cluster-token").arg(&self.cluster_token);
        cmd.args(["--initial-cluster-state", "new"]);
        cmd.args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        cmd.args(["--logger", "zap", "--log-outputs", "stderr"]);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cmd
    }

    /// Waits until the member serves HTTP (`/version`), or also is healthy
    /// (`healthy`), or exits, or the start-up timeout runs out.
    fn wait_started(&self, healthy: bool) -> Startup {
        let deadline = Instant::now() + START_TIMEOUT;
        let log_before = self.log_contents().len();
        loop {
            let exited = lock(&self.child)
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = self.log_contents();
                let new_log = log.get(log_before.min(log.len())..).unwrap_or(&log);
                if new_log.contains("address already in use") {
                    return Startup::PortTaken;
                }
                return Startup::Failed(format!("etcd exited with {status}"));
            }
            let ready = if healthy {
                self.is_healthy()
            } else {
                http(self.client_port, "GET", "/version", "", None).is_ok_and(|(c, _)| c == 200)
            };
            if ready {
                return Startup::Ready;
            }
            if Instant::now() > deadline {
                return Startup::Failed(format!("not ready within {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        lock(&USED_PORTS).remove(&self.client_port);
        lock(&USED_PORTS).remove(&self.peer_port);
        lock(&USED_PORTS).remove(&self.tls_port);
    }
}
