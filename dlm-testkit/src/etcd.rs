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

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{LivePids, Logs, Process, Server, Startup, find_binary, free_ports};
use crate::tls::ServerCert;

// `admin`: requests to a member; `cluster`: the members' joint start-up. The process
// itself (start-up through the spawner thread, the live pids, pause, kill, failure
// messages, ports) is `crate::process`'s, shared with `redis_server`.
mod admin;
mod cluster;

use admin::http;
pub use cluster::EtcdCluster;

/// How long start-up may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of the testkit's own HTTP requests.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// The log: etcd writes it to stderr.
const LOGS: Logs = Logs {
    log: "etcd.log",
    stderr: None,
};
const NOT_FOUND: &str =
    "etcd not found; install it (apt-get install etcd-server) or set DLM_ETCD_SERVER";

/// Pids of the etcd children alive in this process.
static LIVE_PIDS: LivePids = LivePids::new();

/// The pids of all etcd children of this process that have not been killed or dropped
/// yet, sorted.
pub fn live_etcd_pids() -> Vec<u32> {
    LIVE_PIDS.pids()
}

/// Finds the `etcd` binary: `$DLM_ETCD_SERVER` if set, else `etcd` on `PATH`, else
/// `/usr/bin/etcd`.
pub fn etcd_binary() -> Option<PathBuf> {
    find_binary("DLM_ETCD_SERVER", "etcd", &["/usr/bin"])
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
    /// The child (the current one, across restarts), its temp dir and log.
    process: Process,
    client_port: u16,
    peer_port: u16,
    /// `--initial-cluster` (every member's name and peer URL).
    initial_cluster: String,
    /// `--initial-cluster-token`: unique per cluster, so two clusters never merge.
    cluster_token: String,
    /// A TLS client port beside the plain one, and its files.
    tls: Option<EtcdTls>,
    tls_port: u16,
    /// The length of the log when the current child was launched: what it wrote since
    /// tells why it exited (a member waited for after others may have exited already).
    log_at_launch: u64,
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

    /// Member `name` of the cluster `cluster_token`, not started yet (its cluster picks
    /// the ports and starts it).
    fn new(binary: &Path, name: String, cluster_token: &str) -> EtcdServer {
        EtcdServer {
            name,
            process: Process::new("etcd", binary.to_owned(), "dlm-etcd-", LOGS, &LIVE_PIDS),
            client_port: 0,
            peer_port: 0,
            initial_cluster: String::new(),
            cluster_token: cluster_token.to_owned(),
            tls: None,
            tls_port: 0,
            log_at_launch: 0,
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

    crate::process::controls!();

    /// Kills the process (if running) and starts it again on the same ports with the same
    /// data dir. Returns once it serves its client port, which a member of a cluster does
    /// only once it has reached a quorum of its peers: to restart a majority at once, use
    /// [`EtcdCluster::restart_all`].
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        self.start(true);
    }

    /// Whether `GET /health` answers `"health":"true"` (a leader is known and the member
    /// serves requests).
    pub fn is_healthy(&self) -> bool {
        http(self.client_port, "GET", "/health", "", None)
            .is_ok_and(|(code, body)| code == 200 && body.contains("\"health\":\"true\""))
    }

    /// Starts the process with the current ports and cluster settings.
    fn launch(&mut self) {
        self.log_at_launch = self.process.log_len();
        self.process.launch(self.command());
    }

    /// The command line, on the current ports.
    fn command(&self) -> Command {
        let dir = self.dir();
        let mut cmd = self.process.command();
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
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.process.stderr_file());
        cmd
    }

    /// Waits until the member serves HTTP (`/version`), or also is healthy
    /// (`healthy`), or exits, or the start-up timeout runs out.
    fn wait_started(&self, healthy: bool) -> Startup {
        // From the launch, not from now: the cluster launches every member before it
        // waits for the first, and a member's "address already in use" may be written
        // by then.
        self.process
            .wait_started(self.log_at_launch, START_TIMEOUT, || {
                if healthy {
                    self.is_healthy()
                } else {
                    http(self.client_port, "GET", "/version", "", None).is_ok_and(|(c, _)| c == 200)
                }
            })
    }
}

impl Server for EtcdServer {
    fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    fn who(&self) -> String {
        format!("etcd {} on client port {}", self.name, self.client_port)
    }

    /// Only a restart (`again`): the first start of a member is its cluster's, which picks
    /// every member's ports before any starts (`EtcdCluster::spawn`).
    fn start_once(&mut self, again: bool) -> Startup {
        debug_assert!(again, "a member is first started by its cluster");
        self.launch();
        self.wait_started(false)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        free_ports(&[self.client_port, self.peer_port, self.tls_port]);
    }
}
