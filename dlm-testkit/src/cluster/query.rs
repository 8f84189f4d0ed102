//! Asking the nodes: what each one says (`View`), whether the cluster is stable,
//! bounded polling, commands that panic with the nodes' logs on failure.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use super::nodes::{View, cmd_text, info_field, owners, parse_nodes};
use super::{LOG_TAIL_LINES, POLL, QUERY_TIMEOUT, RedisCluster};
use crate::redis_server::RedisServer;

impl RedisCluster {
    /// The running, unpaused nodes.
    pub(super) fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running() && !self.nodes[i].is_paused())
            .collect()
    }

    pub(super) fn index_of_id(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|x| x == id)
    }

    /// The view of the first running, unpaused node; panics if there is none.
    pub(super) fn first_view(&self) -> (usize, View) {
        let Some(&i) = self.live().first() else {
            self.fail("no node is running");
        };
        let view = self
            .view(i)
            .unwrap_or_else(|e| self.fail(&format!("node {i}: {e}")));
        (i, view)
    }

    /// What node `i` says about the cluster.
    pub(super) fn view(&self, i: usize) -> Result<View, String> {
        let node = &self.nodes[i];
        let query = || -> redis::RedisResult<(String, String, String)> {
            let client = redis::Client::open(node.url())?;
            let mut con = client.get_connection_with_timeout(QUERY_TIMEOUT)?;
            con.set_read_timeout(Some(QUERY_TIMEOUT))?;
            con.set_write_timeout(Some(QUERY_TIMEOUT))?;
            redis::pipe()
                .cmd("CLUSTER")
                .arg("INFO")
                .cmd("CLUSTER")
                .arg("NODES")
                .cmd("INFO")
                .arg("replication")
                .query(&mut con)
        };
        let (info, nodes, replication) = query().map_err(|e| e.to_string())?;
        Ok(View {
            info,
            lines: parse_nodes(&nodes)?,
            replication,
        })
    }

    /// Whether every node knows every node, past the handshake.
    pub(super) fn all_known(&self) -> Result<(), String> {
        for i in self.live() {
            let view = self.view(i).map_err(|e| format!("node {i}: {e}"))?;
            self.knows_all(i, &view)?;
        }
        Ok(())
    }

    pub(super) fn knows_all(&self, i: usize, view: &View) -> Result<(), String> {
        if view.lines.len() != self.nodes.len() {
            return Err(format!(
                "node {i} knows {} nodes, not {}",
                view.lines.len(),
                self.nodes.len()
            ));
        }
        for (j, id) in self.ids.iter().enumerate() {
            let line = view
                .line(id)
                .ok_or_else(|| format!("node {i} does not know node {j}"))?;
            if line.has("handshake") || line.has("noaddr") {
                return Err(format!(
                    "node {i} sees node {j} as {}",
                    line.flags.join(",")
                ));
            }
        }
        Ok(())
    }

    /// The views of the running nodes if the cluster is stable (see
    /// [`wait_stable`](Self::wait_stable)), else what is not.
    pub(super) fn settled(&self) -> Result<Vec<(usize, View)>, String> {
        let live = self.live();
        if live.is_empty() {
            return Err("no node is running".to_owned());
        }
        let mut views = Vec::with_capacity(live.len());
        for &i in &live {
            let view = self.view(i).map_err(|e| format!("node {i}: {e}"))?;
            views.push((i, view));
        }
        for (i, view) in &views {
            let state = info_field(&view.info, "cluster_state");
            if state != Some("ok") {
                return Err(format!("node {i}: cluster_state:{}", state.unwrap_or("?")));
            }
            let assigned = info_field(&view.info, "cluster_slots_assigned");
            if assigned != Some("16384") {
                return Err(format!(
                    "node {i}: cluster_slots_assigned:{}",
                    assigned.unwrap_or("?")
                ));
            }
            self.knows_all(*i, view)?;
            for &j in &live {
                let line = view.line(&self.ids[j]).expect("checked by knows_all");
                if line.has("fail") || line.has("fail?") {
                    return Err(format!(
                        "node {i} sees node {j} as {}",
                        line.flags.join(",")
                    ));
                }
            }
            if info_field(&view.replication, "role") == Some("slave") {
                let link = info_field(&view.replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!(
                        "node {i}: master_link_status:{}",
                        link.unwrap_or("?")
                    ));
                }
            }
        }
        let (first, reference) = &views[0];
        let slot_map = owners(&reference.lines);
        for (i, view) in &views[1..] {
            let other = owners(&view.lines);
            if let Some(slot) = (0..slot_map.len()).find(|&s| slot_map[s] != other[s]) {
                return Err(format!(
                    "nodes {first} and {i} disagree on slot {slot}: {:?} vs {:?}",
                    slot_map[slot].map(|id| self.index_of_id(id)),
                    other[slot].map(|id| self.index_of_id(id)),
                ));
            }
        }
        for (j, own) in &views {
            let me = own
                .myself()
                .ok_or_else(|| format!("node {j}: no myself line"))?;
            for (i, view) in &views {
                let seen = view.line(&self.ids[*j]).expect("checked by knows_all");
                if (seen.has("master"), &seen.master) != (me.has("master"), &me.master) {
                    return Err(format!(
                        "node {i} sees node {j} as {} (of {:?}), it says {} (of {:?})",
                        seen.flags.join(","),
                        seen.master.as_deref().and_then(|id| self.index_of_id(id)),
                        me.flags.join(","),
                        me.master.as_deref().and_then(|id| self.index_of_id(id)),
                    ));
                }
            }
        }
        Ok(views)
    }

    /// Polls `check` until it succeeds or `limit` runs out (then panics with its last
    /// complaint and the nodes' logs).
    pub(super) fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        let start = Instant::now();
        loop {
            let why = match check() {
                Ok(v) => {
                    log::debug!("redis cluster: {what} after {:?}", start.elapsed());
                    return v;
                }
                Err(why) => why,
            };
            if start.elapsed() > limit {
                self.fail(&format!("waited {limit:?} for {what}; still: {why}"));
            }
            thread::sleep(POLL);
        }
    }

    /// Runs `cmd` on node `i`; panics with the logs if it fails.
    pub(super) fn run<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.nodes[i].connection())
            .unwrap_or_else(|e| self.fail(&format!("node {i}: {} failed: {e}", cmd_text(cmd))))
    }

    /// Panics with `msg`, the nodes' ports and the tail of every node's log.
    pub(super) fn fail(&self, msg: &str) -> ! {
        let mut logs = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let log = node.log_contents();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
            let _ = writeln!(
                logs,
                "--- node {i} (port {}, pid {}) redis.log tail ---\n{tail}",
                node.port(),
                node.pid()
            );
        }
        let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
        panic!("redis cluster on ports {ports:?}: {msg}\n{logs}")
    }
}
