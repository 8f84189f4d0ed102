//! A real Redis Sentinel topology: one master, its replicas and the sentinels that
//! monitor them, each a `redis-server` process on a free loopback port.
//!
//! [`SentinelTopology::spawn`] starts the data nodes as [`RedisServer`]s (the replicas
//! with `replicaof`), then the sentinels (`redis-server <config> --sentinel`, each from a
//! writable config file in its own temp dir, which Sentinel rewrites), and returns once
//! the topology is ready: every replica's link to the master is up, and every sentinel
//! names the master, sees every replica and every other sentinel. Every process is a
//! [`RedisServer`]: it shows up in [`live_server_pids`] while it lives, can be paused,
//! killed or restarted through [`SentinelTopology::data_node_mut`] and
//! [`SentinelTopology::sentinel_mut`], and is killed and reaped when the topology drops.
//!
//! To keep failovers in tests quick, the sentinels run with short timings:
//! `down-after-milliseconds` 1000 and `failover-timeout` 5000 by default (see the
//! builder), and, set at start-up through `SENTINEL DEBUG` (Redis 7.0+; older servers
//! keep their defaults), INFO every 250 ms (the default is 10 s), hello messages every
//! 250 ms (2 s) and down-state questions to the other sentinels every 250 ms (1 s).
//! Sentinel turns a former master that comes back as a master into a replica 4 hello
//! periods after it sees it, so about 1 s here instead of 8 s or more.
//!
//! [`SentinelTopologyBuilder::default_timings`] keeps Sentinel's own timings instead, as
//! a deployment that did not tune them has: no `SENTINEL DEBUG`, and Redis's defaults for
//! `down-after-milliseconds` (30 s) and `failover-timeout` (3 min) unless set. A former
//! master is then demoted only at the first `INFO` (every 10 s) that comes more than
//! 8 s after it was seen as a master: writes reach it for about 10 s after a failover.
//! Such a topology's waits are [`SLOW_TIMINGS_FACTOR`] times longer.
//!
//! Every wait polls its condition until a bound, then panics with what it was waiting
//! for, the last state seen and the tail of each sentinel's log.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlm_testkit::sentinel::SentinelTopology;
//!
//! let topology = SentinelTopology::builder().password("data-pw").spawn();
//! let sentinels = topology.sentinel_urls(); // for the client under test
//! let old = topology.master_index();
//! let new = topology.failover(); // SENTINEL FAILOVER, then wait until settled
//! assert_ne!(old, new);
//! topology.master().pause(); // a failover that the sentinels start themselves
//! let newer = topology.wait_for_new_master(new, Duration::from_secs(30));
//! # let _ = (sentinels, newer);
//! ```
//!
//! [`live_server_pids`]: crate::redis_server::live_server_pids

mod builder;
mod wait;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

pub use builder::SentinelTopologyBuilder;

use wait::connect;

/// How long [`SentinelTopologyBuilder::spawn`] waits for the topology to be ready (each
/// limit here is [`SLOW_TIMINGS_FACTOR`] times longer for a topology with
/// [default timings](SentinelTopologyBuilder::default_timings)).
pub const READY_LIMIT: Duration = Duration::from_secs(20);
/// How long [`SentinelTopology::master_index`] waits for the sentinels to agree.
pub const AGREE_LIMIT: Duration = Duration::from_secs(10);
/// How long [`SentinelTopology::failover`] waits, in all: for a stable topology, for a
/// sentinel to accept `SENTINEL FAILOVER`, and for the new master to settle.
pub const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

/// How many times longer every wait of a topology with
/// [default timings](SentinelTopologyBuilder::default_timings) is (its sentinels refresh
/// what they know of each node every 10 s instead of every 250 ms).
pub const SLOW_TIMINGS_FACTOR: u32 = 4;

/// Poll interval of the waits.
const POLL: Duration = Duration::from_millis(25);
/// Connect/read/write timeout of the polling connections.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The `SENTINEL DEBUG` timings set on every sentinel (milliseconds).
const DEBUG_TIMINGS: [(&str, u32); 3] = [
    ("info-period", 250),
    ("publish-period", 250),
    ("ask-period", 250),
];
/// How many log lines of each sentinel a panic message quotes.
const LOG_TAIL_LINES: usize = 15;

/// A master, its replicas and the sentinels that monitor it: real processes, killed and
/// reaped on drop (see the [module docs](self)).
///
/// Data nodes and sentinels are numbered from 0 in start order; data node 0 is the
/// first master. Indexes stay valid across failovers (a node's role changes, not its
/// index). Restarting a data node restarts it with its original role (master or replica
/// of the first master); the sentinels reconfigure it as they would a real one.
#[derive(Debug)]
pub struct SentinelTopology {
    master_name: String,
    quorum: usize,
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// The test CA of a TLS topology (kept for restarts, which read the files again).
    pki: Option<crate::tls::TestPki>,
    /// Whether the sentinels get the short `SENTINEL DEBUG` timings (also on restart).
    short_periods: bool,
}

/// The port a node is known by in the topology: its TLS port when it has one.
fn announced(server: &RedisServer) -> u16 {
    match server.tls_port() {
        0 => server.port(),
        tls => tls,
    }
}

impl SentinelTopology {
    /// Starts the default topology: a master, 2 replicas and 3 sentinels (quorum 2), no
    /// passwords. See [`SentinelTopologyBuilder::spawn`].
    pub fn spawn() -> SentinelTopology {
        Self::builder().spawn()
    }

    /// A builder for a topology with non-default configuration.
    pub fn builder() -> SentinelTopologyBuilder {
        SentinelTopologyBuilder::default()
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinels' quorum.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// `redis://[:pw@]127.0.0.1:<port>/` of every sentinel, in order, with the
    /// [sentinel password](SentinelTopologyBuilder::sentinel_password) (percent-encoded)
    /// if any.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// `rediss://[:pw@]127.0.0.1:<tls port>/` of every sentinel of a
    /// [TLS topology](SentinelTopologyBuilder::tls), in order.
    ///
    /// # Panics
    /// When the topology was built without TLS.
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        assert!(self.pki.is_some(), "a topology without TLS");
        self.sentinels.iter().map(RedisServer::tls_url).collect()
    }

    /// The CA file that signed the certificates of a [TLS
    /// topology](SentinelTopologyBuilder::tls), for the client's trust.
    ///
    /// # Panics
    /// When the topology was built without TLS.
    pub fn tls_ca_file(&self) -> std::path::PathBuf {
        self.pki.as_ref().expect("a topology without TLS").ca_file()
    }

    /// `127.0.0.1:<port>` of every sentinel, in order.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels
            .iter()
            .map(|s| SocketAddr::from(([127, 0, 0, 1], s.port())))
            .collect()
    }

    /// How many sentinels there are (running or not).
    pub fn sentinel_count(&self) -> usize {
        self.sentinels.len()
    }

    /// Sentinel `i`'s process (to pause it, or to query it: its
    /// [`connection`](RedisServer::connection) authenticates). Panics if out of range.
    pub fn sentinel(&self, i: usize) -> &RedisServer {
        &self.sentinels[i]
    }

    /// Sentinel `i`'s process, mutably (to kill it). Prefer
    /// [`restart_sentinel`](Self::restart_sentinel) to restart it. Panics if out of range.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.sentinels[i]
    }

    /// Restarts sentinel `i` on the same port from its own (rewritten) config file, and
    /// sets its short timings again (unless the topology keeps
    /// [default timings](SentinelTopologyBuilder::default_timings)); returns once it answers (not once it has found the
    /// other nodes again). Panics if out of range or if it cannot be started.
    pub fn restart_sentinel(&mut self, i: usize) {
        self.sentinels[i].restart();
        self.tune(i);
    }

    /// Data node `i` (0 is the first master). Panics if out of range.
    pub fn data_node(&self, i: usize) -> &RedisServer {
        &self.data[i]
    }

    /// Data node `i`, mutably (to kill or restart it). Panics if out of range.
    pub fn data_node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.data[i]
    }

    /// Every data node, in order.
    pub fn data_nodes(&self) -> &[RedisServer] {
        &self.data
    }

    /// The index of the data node that the sentinels name as the master (`SENTINEL
    /// get-master-addr-by-name`). Every running, unpaused sentinel must name the same
    /// one: polls until they agree; synchronous, bounded by [`AGREE_LIMIT`]. It does not
    /// wait for the node to be up, nor for a failover in progress to end.
    ///
    /// # Panics
    /// When they do not agree in time, or name an address that is no data node.
    pub fn master_index(&self) -> usize {
        self.poll(
            self.scaled(AGREE_LIMIT),
            "the sentinels to agree on a master",
            || self.agreed_master(),
        )
    }

    /// The data node that the sentinels name as the master ([`master_index`](Self::master_index)).
    pub fn master(&self) -> &RedisServer {
        &self.data[self.master_index()]
    }

    /// The indexes of every data node but the one [`master_index`](Self::master_index)
    /// names, in order (including nodes that are killed or paused).
    pub fn replica_indexes(&self) -> Vec<usize> {
        let master = self.master_index();
        (0..self.data.len()).filter(|&i| i != master).collect()
    }

    /// A failover by command: waits until the topology is settled, runs `SENTINEL
    /// FAILOVER <name>` on a sentinel (retrying while the sentinels answer `NOGOODSLAVE`
    /// or `INPROG`), then waits until the failover is over, as
    /// [`wait_for_new_master`](Self::wait_for_new_master) does. Returns the new master's
    /// index. Synchronous, bounded by [`FAILOVER_LIMIT`] in all; the old master, still
    /// running, becomes a replica of the new one before this returns.
    ///
    /// # Panics
    /// When there is no replica, or the failover does not happen or settle in time.
    pub fn failover(&self) -> usize {
        let deadline = Instant::now() + self.scaled(FAILOVER_LIMIT);
        let old = self.start_failover_by(deadline);
        let left = deadline.saturating_duration_since(Instant::now());
        self.settle(Some(old), left, "the failover to settle")
    }

    /// The first half of [`failover`](Self::failover): waits until the topology is
    /// settled and a sentinel accepts `SENTINEL FAILOVER <name>`, and returns the index
    /// of the master being failed over at once, without waiting for the promotion (to
    /// watch the failover as it happens; [`role`](Self::role) tells when each node
    /// changed). Bounded by [`FAILOVER_LIMIT`].
    ///
    /// # Panics
    /// When there is no replica, or no sentinel accepts the command in time.
    pub fn start_failover(&self) -> usize {
        self.start_failover_by(Instant::now() + self.scaled(FAILOVER_LIMIT))
    }

    fn start_failover_by(&self, deadline: Instant) -> usize {
        assert!(self.data.len() > 1, "a failover needs a replica");
        let left = deadline.saturating_duration_since(Instant::now());
        let old = self.settle(None, left, "a settled topology before a failover");
        self.poll_until(deadline, "a sentinel to accept SENTINEL FAILOVER", || {
            let mut last = String::new();
            for i in self.live_sentinels() {
                let answer = self.sentinel_con(i).and_then(|mut con| {
                    redis::cmd("SENTINEL")
                        .arg("FAILOVER")
                        .arg(&self.master_name)
                        .query::<()>(&mut con)
                });
                match answer {
                    Ok(()) => {
                        log::debug!("sentinel {i} starts a failover of data node {old}");
                        return Ok(());
                    }
                    Err(e) => last = format!("sentinel {i}: {e}"),
                }
            }
            Err(if last.is_empty() {
                "no sentinel is running".to_owned()
            } else {
                last
            })
        });
        old
    }

    /// What data node `i` says it is (the first word of `ROLE`: `"master"` or
    /// `"slave"`), asked on a fresh connection with a 1 s timeout.
    ///
    /// # Errors
    /// When the node does not answer.
    pub fn role(&self, i: usize) -> redis::RedisResult<String> {
        let reply: Vec<redis::Value> =
            redis::cmd("ROLE").query(&mut connect(&self.data[i].url())?)?;
        match reply.first() {
            Some(redis::Value::BulkString(role)) => Ok(String::from_utf8_lossy(role).into_owned()),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "a ROLE reply without a role",
            ))),
        }
    }

    /// Waits for a failover that something else caused (e.g. a test killed or paused
    /// the master, or ran `SENTINEL FAILOVER` itself): until every running, unpaused
    /// sentinel names the same master, other than data node `old`; that node reports
    /// `role:master`; every other running, unpaused data node replicates from it with
    /// its link up; and every sentinel sees those replicas and the other sentinels.
    /// Returns the new master's index. Synchronous, bounded by `limit` (with the default
    /// timings, a killed master is replaced in 2 to 4 s; a failed election makes the
    /// sentinels wait twice the failover timeout before they try again).
    ///
    /// # Panics
    /// When that state is not reached within `limit`.
    pub fn wait_for_new_master(&self, old: usize, limit: Duration) -> usize {
        self.settle(
            Some(old),
            limit,
            &format!("a new master after data node {old}"),
        )
    }

    /// Waits until the topology is settled around whichever master the sentinels name
    /// (the state [`wait_for_new_master`](Self::wait_for_new_master) waits for, any
    /// master allowed): e.g. after a test resumed or restarted a former master, until
    /// the sentinels have made it a replica of the current one. Returns the master's
    /// index. Synchronous, bounded by `limit`.
    ///
    /// # Panics
    /// When that state is not reached within `limit`.
    pub fn wait_settled(&self, limit: Duration) -> usize {
        self.settle(None, limit, "a settled topology")
    }
}

impl Drop for SentinelTopology {
    /// Kills and reaps every process: the sentinels first, then the data nodes.
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            s.kill();
        }
        for d in &mut self.data {
            d.kill();
        }
    }
}

/// Whether a process is running and not paused (so it can answer).
fn live(server: &RedisServer) -> bool {
    server.is_running() && !server.is_paused()
}
