//! [`SentinelTopologyBuilder`]: the topology's shape and settings, the start-up (data
//! nodes, then sentinels from a written config file) and that config file.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::{READY_LIMIT, SentinelTopology, announced};
use crate::redis_server::{RedisServer, RedisServerBuilder};

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
    /// failover (see the [module docs](super)), and the topology's waits are
    /// [`SLOW_TIMINGS_FACTOR`](super::SLOW_TIMINGS_FACTOR) times longer.
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
    /// (see the [module docs](super)); synchronous, bounded by [`READY_LIMIT`].
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
