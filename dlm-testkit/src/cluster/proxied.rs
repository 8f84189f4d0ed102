//! A cluster whose clients reach every node through a [`FaultProxy`].

use super::{CHANGE_TIMEOUT, RedisCluster};
use crate::faults::FaultProxy;

impl RedisCluster {
    /// Puts a [`FaultProxy`] in front of every node and has each node announce its
    /// proxy's port (`cluster-announce-port`), so that a client that follows the slot
    /// map and the redirections (`CLUSTER SLOTS`, `MOVED`, `ASK`) reaches the nodes only
    /// through the proxies: latency or loss set on a proxy applies to every request of
    /// that node. Returns the proxies in node order, once every running node sees every
    /// node at its proxy's port. The nodes keep talking to each other directly (the
    /// cluster bus); [`node_index`](Self::node_index) does not know the proxies' ports.
    ///
    /// # Panics
    /// When a node refuses the setting or the nodes do not agree within 20 s.
    pub fn proxies(&self) -> Vec<FaultProxy> {
        let proxies: Vec<FaultProxy> = self
            .nodes
            .iter()
            .map(|n| FaultProxy::start(n.port()))
            .collect();
        for (i, p) in proxies.iter().enumerate() {
            let _: () = self.run(
                i,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-announce-port")
                    .arg(p.port()),
            );
        }
        let ports: Vec<(String, u16)> = self
            .ids
            .iter()
            .cloned()
            .zip(proxies.iter().map(FaultProxy::port))
            .collect();
        self.wait_for(
            "every node seen at its proxy's port",
            CHANGE_TIMEOUT,
            || {
                for i in self.live() {
                    let text: String = redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query(&mut self.nodes[i].connection())
                        .map_err(|e| format!("node {i}: {e}"))?;
                    for (id, port) in &ports {
                        let seen = text.lines().any(|l| {
                            let mut f = l.split_whitespace();
                            f.next() == Some(id.as_str())
                                && f.next().is_some_and(|addr| {
                                    addr.split('@')
                                        .next()
                                        .and_then(|a| a.rsplit_once(':'))
                                        .is_some_and(|(_, p)| p == port.to_string())
                                })
                        });
                        if !seen {
                            return Err(format!(
                                "node {i} does not see node {id} at port {port} yet"
                            ));
                        }
                    }
                }
                Ok(())
            },
        );
        proxies
    }
}
