//! Waiting on the topology: bounded polling until the sentinels agree on a master and
//! the topology is settled around it, with the sentinels' log tails when a wait runs
//! out; the probe connections and the replies they parse.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use super::{
    DEBUG_TIMINGS, LOG_TAIL_LINES, POLL, PROBE_TIMEOUT, SLOW_TIMINGS_FACTOR, SentinelTopology,
    announced, live,
};
use crate::redis_server::RedisServer;

impl SentinelTopology {
    /// A wait's bound for this topology: `limit`, times [`SLOW_TIMINGS_FACTOR`] with
    /// default timings.
    pub(super) fn scaled(&self, limit: Duration) -> Duration {
        if self.short_periods {
            limit
        } else {
            limit * SLOW_TIMINGS_FACTOR
        }
    }

    /// Sets the short `SENTINEL DEBUG` timings on sentinel `i` (best effort: a server
    /// without `SENTINEL DEBUG` keeps its defaults), unless the topology keeps
    /// [default timings](SentinelTopologyBuilder::default_timings).
    pub(super) fn tune(&self, i: usize) {
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
    pub(super) fn settle(&self, not: Option<usize>, limit: Duration, what: &str) -> usize {
        self.poll(limit, what, || self.settled(not))
    }

    pub(super) fn poll<T>(
        &self,
        limit: Duration,
        what: &str,
        f: impl FnMut() -> Result<T, String>,
    ) -> T {
        self.poll_until(Instant::now() + limit, what, f)
    }

    /// Calls `f` every [`POLL`] until it succeeds; panics with its last error, the
    /// sentinels' log tails and `what` at `deadline`.
    pub(super) fn poll_until<T>(
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
    pub(super) fn live_sentinels(&self) -> Vec<usize> {
        (0..self.sentinels.len())
            .filter(|&i| live(&self.sentinels[i]))
            .collect()
    }

    /// The data node that every live sentinel names, or why there is none.
    pub(super) fn agreed_master(&self) -> Result<usize, String> {
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
    pub(super) fn acknowledged(&self, m: usize) -> Result<(), String> {
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
    pub(super) fn sentinel_con(&self, i: usize) -> redis::RedisResult<redis::Connection> {
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

pub(super) fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
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
