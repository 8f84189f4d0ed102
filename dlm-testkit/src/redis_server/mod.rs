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

mod builder;
mod process;
mod server;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tempfile::TempDir;

pub(crate) use process::{SETPRIV, proc_state, send_signal, spawn_child};

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
}
