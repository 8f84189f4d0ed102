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

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use crate::redis_server::{RedisServer, RedisServerBuilder};

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

/// Builds a [`SentinelTopology`] with non-default configuration.
#[derive(Debug, Clone)]
pub struct SentinelTopologyBuilder {
    master_name: String,
    replicas: usize,
    sentinels: usize,
    quorum: Option<usize>,
    password: Option<String>,
    sentinel_password: Option<String>,
    down_after: Option<Duration>,
    failover_timeout: Option<Duration>,
    /// Whether the sentinels get the short `SENTINEL DEBUG` timings.
    short_periods: bool,
    /// Extra `--name value` arguments of every data node.
    data_config: Vec<(String, String)>,
    tls: bool,
}

impl Default for SentinelTopologyBuilder {
    fn default() -> Self {
        SentinelTopologyBuilder {
            master_name: "mymaster".to_owned(),
            replicas: 2,
            sentinels: 3,
            quorum: None,
            password: None,
            sentinel_password: None,
            down_after: Some(Duration::from_millis(1000)),
            failover_timeout: Some(Duration::from_millis(5000)),
            short_periods: true,
            data_config: Vec::new(),
            tls: false,
        }
    }
}

impl SentinelTopologyBuilder {
    /// The name the sentinels monitor the master under (default `"mymaster"`).
    pub fn master_name(mut self, name: &str) -> Self {
        self.master_name = name.to_owned();
        self
    }

    /// How many replicas the master has (default 2). With none, no failover can happen.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// How many sentinels monitor the master (default 3, at least 1).
    pub fn sentinels(mut self, n: usize) -> Self {
        self.sentinels = n;
        self
    }

    /// How many sentinels must agree that the master is down (default: a majority of
    /// the sentinels). A failover also needs a majority to elect a leader.
    pub fn quorum(mut self, q: usize) -> Self {
        self.quorum = Some(q);
        self
    }

    /// The data nodes' password: `requirepass` and `masterauth` on every data node,
    /// `sentinel auth-pass` in the sentinels. Their [`RedisServer::url`] carries it.
    pub fn password(mut self, pw: &str) -> Self {
        self.password = Some(pw.to_owned());
        self
    }

    /// The sentinels' own password (`requirepass` on the sentinels, which they also use
    /// between themselves). [`SentinelTopology::sentinel_urls`] carry it.
    pub fn sentinel_password(mut self, pw: &str) -> Self {
        self.sentinel_password = Some(pw.to_owned());
        self
    }

    /// A deployment that uses TLS everywhere: every data node and sentinel opens a TLS
    /// port with a certificate of a test CA made for the topology
    /// ([`SentinelTopology::tls_ca_file`]) for `127.0.0.1`; replication, the sentinels'
    /// links to the data nodes and to each other use TLS (`tls-replication yes`), so the
    /// sentinels name the masters' TLS ports. The plain ports stay open for the testkit's
    /// own connections. Clients use [`SentinelTopology::sentinel_tls_urls`].
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// `sentinel down-after-milliseconds` (default 1 s; Redis's own default, 30 s,
    /// after [`default_timings`](Self::default_timings)): how long a node may fail to
    /// answer before a sentinel considers it down.
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = Some(d);
        self
    }

    /// `sentinel failover-timeout` (default 5 s; Redis's own default, 3 min, after
    /// [`default_timings`](Self::default_timings)). A sentinel that failed to get a
    /// failover done waits twice this long before it tries again.
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = Some(d);
        self
    }

    /// Sentinel's own timings, as a deployment that did not tune them has: no `SENTINEL
    /// DEBUG` (INFO to each node every 10 s, hello messages every 2 s, down-state
    /// questions every 1 s), and no `down-after-milliseconds` nor `failover-timeout` in
    /// the config, so Redis's defaults apply (30 s and 3 min), unless
    /// [`down_after`](Self::down_after) or [`failover_timeout`](Self::failover_timeout)
    /// are called after this. A former master is then demoted about 10 s after a
    /// failover (see the [module docs](self)), and the topology's waits are
    /// [`SLOW_TIMINGS_FACTOR`] times longer.
    pub fn default_timings(mut self) -> Self {
        self.short_periods = false;
        self.down_after = None;
        self.failover_timeout = None;
        self
    }

    /// A configuration directive for every data node, given on its command line as
    /// `--name value` (e.g. `.data_node_config("min-replicas-to-write", "1")`). A
    /// restarted data node keeps it.
    pub fn data_node_config(mut self, name: &str, value: &str) -> Self {
        self.data_config.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts the data nodes and the sentinels, and returns once the topology is ready
    /// (see the [module docs](self)); synchronous, bounded by [`READY_LIMIT`].
    ///
    /// # Panics
    /// When no `redis-server` is found, a process cannot be started, or the topology is
    /// not ready in time (with the last state seen and the sentinels' log tails).
    pub fn spawn(self) -> SentinelTopology {
        assert!(self.sentinels >= 1, "a sentinel topology needs a sentinel");
        let quorum = self.quorum.unwrap_or(self.sentinels / 2 + 1);
        assert!(
            (1..=self.sentinels).contains(&quorum),
            "quorum {quorum} is not within 1..={}",
            self.sentinels
        );
        let started = Instant::now();
        let pki = self.tls.then(crate::tls::TestPki::new);
        let with_tls = |b: RedisServerBuilder| match &pki {
            Some(pki) => b
                .tls(pki, crate::tls::ServerCert::Valid)
                .arg("--tls-replication")
                .arg("yes"),
            None => b,
        };
        let data_node = |master_port: Option<u16>| {
            // A replica's first sync must not wait for more replicas (the default delay
            // of a diskless sync is 5 s).
            let mut b = with_tls(
                RedisServer::builder()
                    .arg("--repl-diskless-sync-delay")
                    .arg("0"),
            );
            if let Some(pw) = &self.password {
                b = b.password(pw).arg("--masterauth").arg(pw);
            }
            for (name, value) in &self.data_config {
                b = b.arg(&format!("--{name}")).arg(value);
            }
            if let Some(port) = master_port {
                b = b.arg("--replicaof").arg("127.0.0.1").arg(&port.to_string());
            }
            b.spawn()
        };
        let master = data_node(None);
        let master_port = announced(&master);
        let mut data = vec![master];
        data.extend((0..self.replicas).map(|_| data_node(Some(master_port))));

        let config = self.sentinel_config(master_port, quorum);
        let sentinel = || {
            let mut b: RedisServerBuilder =
                with_tls(RedisServer::builder().config_file(&config)).arg("--sentinel");
            if let Some(pw) = &self.sentinel_password {
                b = b.password(pw);
            }
            b.spawn()
        };
        let sentinels = (0..self.sentinels).map(|_| sentinel()).collect();
        let topology = SentinelTopology {
            master_name: self.master_name,
            quorum,
            data,
            sentinels,
            pki,
            short_periods: self.short_periods,
        };
        for i in 0..topology.sentinels.len() {
            topology.tune(i);
        }
        let ready = topology.scaled(READY_LIMIT);
        let m = topology.settle(None, ready, "the topology to be ready");
        topology.poll(ready, "every replica's first acknowledgement", || {
            topology.acknowledged(m)
        });
        log::debug!(
            "sentinel topology {:?} ready in {:?}",
            topology.master_name,
            started.elapsed()
        );
        topology
    }

    /// The sentinels' config file (the port comes from the command line).
    fn sentinel_config(&self, master_port: u16, quorum: usize) -> String {
        let name = quote(&self.master_name);
        let mut conf = format!("sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n");
        if let Some(d) = self.down_after {
            let _ = writeln!(
                conf,
                "sentinel down-after-milliseconds {name} {}",
                d.as_millis()
            );
        }
        if let Some(d) = self.failover_timeout {
            let _ = writeln!(conf, "sentinel failover-timeout {name} {}", d.as_millis());
        }
        let _ = writeln!(conf, "sentinel parallel-syncs {name} 1");
        if let Some(pw) = &self.password {
            let _ = writeln!(conf, "sentinel auth-pass {name} {}", quote(pw));
        }
        conf
    }
}

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

    /// A wait's bound for this topology: `limit`, times [`SLOW_TIMINGS_FACTOR`] with
    /// default timings.
    fn scaled(&self, limit: Duration) -> Duration {
        if self.short_periods {
            limit
        } else {
            limit * SLOW_TIMINGS_FACTOR
        }
    }

    /// Sets the short `SENTINEL DEBUG` timings on sentinel `i` (best effort: a server
    /// without `SENTINEL DEBUG` keeps its defaults), unless the topology keeps
    /// [default timings](SentinelTopologyBuilder::default_timings).
    fn tune(&self, i: usize) {
        if !self.short_periods {
            return;
        }
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("DEBUG");
        for (param, ms) in DEBUG_TIMINGS {
            cmd.arg(param).arg(ms);
        }
        let set = self
            .sentinel_con(i)
            .and_then(|mut con| cmd.query::<()>(&mut con));
        if let Err(e) = set {
            log::warn!("sentinel {i}: SENTINEL DEBUG failed ({e}); its timings stay the defaults");
        }
    }

    /// Polls [`settled`](Self::settled) until it holds or `limit` runs out (then panics
    /// with `what`).
    fn settle(&self, not: Option<usize>, limit: Duration, what: &str) -> usize {
        self.poll(limit, what, || self.settled(not))
    }

    fn poll<T>(&self, limit: Duration, what: &str, f: impl FnMut() -> Result<T, String>) -> T {
        self.poll_until(Instant::now() + limit, what, f)
    }

    /// Calls `f` every [`POLL`] until it succeeds; panics with its last error, the
    /// sentinels' log tails and `what` at `deadline`.
    fn poll_until<T>(
        &self,
        deadline: Instant,
        what: &str,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> T {
        let started = Instant::now();
        loop {
            match f() {
                Ok(v) => return v,
                Err(why) if Instant::now() >= deadline => panic!(
                    "sentinel topology {:?}: timed out after {:?} waiting for {what}; last state: {why}\n{}",
                    self.master_name,
                    started.elapsed(),
                    self.log_tails()
                ),
                Err(_) => thread::sleep(POLL),
            }
        }
    }

    /// The sentinels that are running and not paused.
    fn live_sentinels(&self) -> Vec<usize> {
        (0..self.sentinels.len())
            .filter(|&i| live(&self.sentinels[i]))
            .collect()
    }

    /// The data node that every live sentinel names, or why there is none.
    fn agreed_master(&self) -> Result<usize, String> {
        let sentinels = self.live_sentinels();
        if sentinels.is_empty() {
            return Err("no sentinel is running".to_owned());
        }
        let mut agreed: Option<(usize, usize)> = None;
        for s in sentinels {
            let mut con = self
                .sentinel_con(s)
                .map_err(|e| format!("sentinel {s}: {e}"))?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query(&mut con)
                .map_err(|e| format!("sentinel {s}: {e}"))?;
            let (host, port) =
                addr.ok_or_else(|| format!("sentinel {s} does not know {:?}", self.master_name))?;
            let node = self
                .data
                .iter()
                .position(|d| announced(d) == port && host == "127.0.0.1")
                .ok_or_else(|| {
                    format!("sentinel {s} names {host}:{port}, which is no data node")
                })?;
            match agreed {
                None => agreed = Some((s, node)),
                Some((first, m)) if m != node => {
                    return Err(format!(
                        "sentinel {first} names data node {m}, sentinel {s} data node {node}"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(agreed.map(|(_, m)| m).expect("at least one sentinel"))
    }

    /// Whether master `m` has heard from each live replica since its sync (an
    /// acknowledged offset): until then a replica that says its link is up may still be
    /// loading what it was sent, and the first `WAIT` counts it out (a CLI test's
    /// `--wait-replicas 2` failed so, right after the topology started).
    fn acknowledged(&self, m: usize) -> Result<(), String> {
        let replicas = (0..self.data.len())
            .filter(|&i| i != m && live(&self.data[i]))
            .count();
        // A write (a PUBLISH is replicated, and touches no key) and `WAIT` for it: WAIT asks
        // the replicas for their offsets at once (they would otherwise say it once a
        // second), so this returns as soon as every replica acknowledges.
        let acked: i64 = connect(&self.data[m].url())
            .and_then(|mut con| {
                redis::cmd("PUBLISH")
                    .arg("__testkit__:ready")
                    .arg(1)
                    .query::<i64>(&mut con)?;
                redis::cmd("WAIT").arg(replicas).arg(500).query(&mut con)
            })
            .map_err(|e| format!("data node {m}: WAIT: {e}"))?;
        if acked < replicas as i64 {
            return Err(format!(
                "the master, data node {m}: {acked} of {replicas} replicas acknowledged"
            ));
        }
        Ok(())
    }

    /// Whether the topology is settled around a master other than `not`, and which: see
    /// [`wait_for_new_master`](Self::wait_for_new_master).
    fn settled(&self, not: Option<usize>) -> Result<usize, String> {
        let m = self.agreed_master()?;
        if not == Some(m) {
            return Err(format!("the sentinels still name data node {m}"));
        }
        let master = &self.data[m];
        if !live(master) {
            return Err(format!(
                "the named master, data node {m}, is down or paused"
            ));
        }
        let info = replication_info(master).map_err(|e| format!("data node {m}: {e}"))?;
        if info.get("role").map(String::as_str) != Some("master") {
            return Err(format!(
                "data node {m} is named master but reports {info:?}"
            ));
        }
        let port = announced(master).to_string();
        let replicas: Vec<usize> = (0..self.data.len())
            .filter(|&i| i != m && live(&self.data[i]))
            .collect();
        for &r in &replicas {
            let info =
                replication_info(&self.data[r]).map_err(|e| format!("data node {r}: {e}"))?;
            let ok = info.get("role").map(String::as_str) == Some("slave")
                && info.get("master_port") == Some(&port)
                && info.get("master_link_status").map(String::as_str) == Some("up");
            if !ok {
                return Err(format!(
                    "data node {r} is not a replica of data node {m} with its link up: {info:?}"
                ));
            }
        }
        for s in self.live_sentinels() {
            let mut con = self
                .sentinel_con(s)
                .map_err(|e| format!("sentinel {s}: {e}"))?;
            let seen = entries(&mut con, "replicas", &self.master_name)
                .map_err(|e| format!("sentinel {s}: SENTINEL replicas: {e}"))?;
            for &r in &replicas {
                let rport = announced(&self.data[r]).to_string();
                let entry = seen.iter().find(|e| e.get("port") == Some(&rport));
                let ok = entry.is_some_and(|e| {
                    e.get("flags").map(String::as_str) == Some("slave")
                        && e.get("master-link-status").map(String::as_str) == Some("ok")
                        && e.get("master-port") == Some(&port)
                });
                if !ok {
                    return Err(format!(
                        "sentinel {s} does not see data node {r} as a healthy replica: {entry:?}"
                    ));
                }
            }
            let peers = entries(&mut con, "sentinels", &self.master_name)
                .map_err(|e| format!("sentinel {s}: SENTINEL sentinels: {e}"))?;
            for t in self.live_sentinels().into_iter().filter(|&t| t != s) {
                let tport = announced(&self.sentinels[t]).to_string();
                let entry = peers.iter().find(|e| e.get("port") == Some(&tport));
                if entry.and_then(|e| e.get("flags")).map(String::as_str) != Some("sentinel") {
                    return Err(format!("sentinel {s} does not see sentinel {t}: {entry:?}"));
                }
            }
        }
        Ok(m)
    }

    /// A fresh connection to sentinel `i` (authenticated), with short timeouts.
    fn sentinel_con(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        connect(&self.sentinels[i].url())
    }

    /// The last lines of every sentinel's log, for panic messages.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sentinels.iter().enumerate() {
            let log = s.log_contents();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
            let _ = writeln!(
                out,
                "--- sentinel {i} (port {}, pid {}), last {LOG_TAIL_LINES} log lines ---\n{tail}",
                s.port(),
                s.pid()
            );
        }
        out
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

fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(PROBE_TIMEOUT)?;
    con.set_read_timeout(Some(PROBE_TIMEOUT))?;
    con.set_write_timeout(Some(PROBE_TIMEOUT))?;
    Ok(con)
}

/// `INFO replication` of a data node, as field → value.
fn replication_info(node: &RedisServer) -> redis::RedisResult<HashMap<String, String>> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut connect(&node.url())?)?;
    Ok(info
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// The entries of `SENTINEL <what> <name>` (`replicas`, `sentinels`), each as field →
/// value (RESP2 sends each as a flat list of names and values).
fn entries(
    con: &mut redis::Connection,
    what: &str,
    name: &str,
) -> redis::RedisResult<Vec<HashMap<String, String>>> {
    let raw: Vec<Vec<String>> = redis::cmd("SENTINEL").arg(what).arg(name).query(con)?;
    Ok(raw
        .into_iter()
        .map(|flat| {
            flat.chunks_exact(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect()
        })
        .collect())
}

/// A config-file argument: double-quoted, with `\`, `"` and non-printable bytes escaped
/// (`\xHH`), as Redis's config parser reads it.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'\\' | b'"' => {
                out.push('\\');
                out.push(char::from(b));
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_arguments_are_quoted() {
        assert_eq!(quote("mymaster"), "\"mymaster\"");
        assert_eq!(quote("a \"b\"\\c"), "\"a \\\"b\\\"\\\\c\"");
        assert_eq!(quote("é\n"), "\"\\xc3\\xa9\\x0a\"");
    }

    #[test]
    fn sentinel_config_lines() {
        let conf = SentinelTopology::builder()
            .master_name("m 1")
            .password("p\"w")
            .sentinel_config(6379, 2);
        assert_eq!(
            conf,
            "sentinel monitor \"m 1\" 127.0.0.1 6379 2\n\
             sentinel down-after-milliseconds \"m 1\" 1000\n\
             sentinel failover-timeout \"m 1\" 5000\n\
             sentinel parallel-syncs \"m 1\" 1\n\
             sentinel auth-pass \"m 1\" \"p\\\"w\"\n"
        );
    }
    #[test]
    fn default_timings_leave_the_timings_to_redis() {
        let conf = SentinelTopology::builder()
            .default_timings()
            .sentinel_config(6379, 2);
        assert_eq!(
            conf,
            "sentinel monitor \"mymaster\" 127.0.0.1 6379 2\n\
             sentinel parallel-syncs \"mymaster\" 1\n"
        );
        let conf = SentinelTopology::builder()
            .default_timings()
            .down_after(Duration::from_secs(5))
            .sentinel_config(6379, 2);
        assert!(conf.contains("down-after-milliseconds \"mymaster\" 5000\n"));
        assert!(!conf.contains("failover-timeout"));
    }
}
