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

// `builder`: the settings and `spawn`; `start`: the ports, the command line, readiness;
// `server`: the addresses and Redis's own controls. The process itself (start-up through
// the spawner thread, the live pids, pause, kill, failure messages, ports) is
// `crate::process`'s, shared with `etcd`.
mod builder;
mod server;
mod start;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::process::{LivePids, Logs, Process, find_binary};

/// How long start-up may take before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of admin connections.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The log (`--logfile`), and the file the child's stderr goes to.
const LOGS: Logs = Logs {
    log: "redis.log",
    stderr: Some("stderr.log"),
};
/// The config file that [`RedisServerBuilder::config_file`] writes in the server's dir.
const CONFIG_FILE: &str = "redis.conf";
const NOT_FOUND: &str =
    "redis-server not found; install it (apt-get install redis-server) or set DLM_REDIS_SERVER";

/// Pids of the `RedisServer` children alive in this process.
static LIVE_PIDS: LivePids = LivePids::new();

/// The pids of all [`RedisServer`] children of this process that have not been killed
/// or dropped yet, sorted.
pub fn live_server_pids() -> Vec<u32> {
    LIVE_PIDS.pids()
}

/// Finds the `redis-server` binary: `$DLM_REDIS_SERVER` if set, else `redis-server` on
/// `PATH`, else `/usr/bin/redis-server` or `/usr/sbin/redis-server`.
pub fn redis_server_binary() -> Option<PathBuf> {
    find_binary(
        "DLM_REDIS_SERVER",
        "redis-server",
        &["/usr/bin", "/usr/sbin"],
    )
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
    /// The child (the current one, across restarts), its temp dir and logs.
    process: Process,
    port: u16,
    /// The TLS port, 0 without TLS.
    tls_port: u16,
    /// The cluster bus port, 0 without [`RedisServerBuilder::cluster_port`].
    cluster_port: u16,
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
