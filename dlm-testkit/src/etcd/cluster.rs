//! [`EtcdCluster`]: several members of one etcd cluster.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{EtcdServer, EtcdTls, START_TIMEOUT, require_etcd};
use crate::process::{START_ATTEMPTS, Startup, free_ports, pick_port};

/// `n` etcd members forming one cluster (each an [`EtcdServer`]), killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    pub(super) members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `n` members of one new cluster (a token of its own: it never merges with
    /// another) and waits until every member is healthy.
    ///
    /// # Panics
    /// When etcd is missing or the cluster does not come up (with the logs' tails).
    pub fn spawn(n: usize) -> EtcdCluster {
        Self::spawn_with(n, None)
    }

    pub(super) fn spawn_with(n: usize, tls: Option<EtcdTls>) -> EtcdCluster {
        assert!(n >= 1, "a cluster needs a member");
        let binary = require_etcd();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let token = format!(
            "dlm-test-{}-{}-{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let mut members: Vec<EtcdServer> = (0..n)
            .map(|i| EtcdServer::new(&binary, format!("m{i}"), &token))
            .collect();
        for m in members.iter_mut() {
            m.tls = tls.clone();
        }
        for attempt in 1..=START_ATTEMPTS {
            for m in members.iter_mut() {
                m.kill();
                free_ports(&[m.client_port, m.peer_port, m.tls_port]);
                m.client_port = pick_port();
                m.peer_port = pick_port();
                if m.tls.is_some() {
                    m.tls_port = pick_port();
                }
                // A failed attempt may have written a data dir for other ports.
                let _ = fs::remove_dir_all(m.dir().join("data"));
            }
            let initial = members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
                .collect::<Vec<_>>()
                .join(",");
            for m in members.iter_mut() {
                m.initial_cluster = initial.clone();
                m.launch();
            }
            let mut retry = false;
            for m in &members {
                match m.wait_started(true) {
                    Startup::Ready => {}
                    Startup::PortTaken => {
                        log::debug!("etcd {}: port taken (attempt {attempt})", m.name);
                        retry = true;
                        break;
                    }
                    Startup::Failed(why) => m.fail(&format!("failed to start: {why}")),
                }
            }
            if !retry {
                log::debug!(
                    "etcd cluster of {n} ready: {:?}",
                    members.iter().map(EtcdServer::url).collect::<Vec<_>>()
                );
                return EtcdCluster { members };
            }
        }
        panic!("etcd: ports still taken after {START_ATTEMPTS} attempts");
    }

    /// Every member's client URL, in order.
    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::url).collect()
    }

    /// Member `i`. Panics if out of range.
    pub fn get(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// Member `i`, mutably (to kill or restart it). Panics if out of range.
    pub fn get_mut(&mut self, i: usize) -> &mut EtcdServer {
        &mut self.members[i]
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none (never, for a spawned cluster).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The index of the member that the running, unpaused members agree is the leader,
    /// if they do.
    pub fn leader(&self) -> Option<usize> {
        let mut leader = None;
        for m in self
            .members
            .iter()
            .filter(|m| m.is_running() && !m.is_paused())
        {
            let (_, l) = m.status()?;
            match &leader {
                None => leader = Some(l),
                Some(known) if *known == l => {}
                Some(_) => return None,
            }
        }
        let leader = leader?;
        self.members
            .iter()
            .position(|m| m.status().is_some_and(|(id, _)| id == leader))
    }

    /// Waits (up to 20 s) until the live members agree on a leader, and returns its index.
    ///
    /// # Panics
    /// When they do not.
    pub fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(i) = self.leader() {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {START_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills every member, then starts them all again on the same ports and data dirs,
    /// and waits until all are healthy.
    pub fn restart_all(&mut self) {
        for m in self.members.iter_mut() {
            m.kill();
        }
        // All at once: a member serves clients only once a quorum is up.
        for m in self.members.iter_mut() {
            m.launch();
        }
        self.wait_healthy();
    }

    /// Waits (up to 20 s) until every running, unpaused member is healthy.
    ///
    /// # Panics
    /// When one is not.
    pub fn wait_healthy(&self) {
        for m in self
            .members
            .iter()
            .filter(|m| m.is_running() && !m.is_paused())
        {
            if let Startup::Failed(why) = m.wait_started(true) {
                m.fail(&format!("not healthy: {why}"));
            }
        }
    }
}
