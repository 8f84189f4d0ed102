//! The memory, single-Redis and Redlock targets, and what every Redis target counts.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dlm_core::backend::{BackendErrorKind, LockBackend};
use dlm_memory::MemoryBackend;
use dlm_redis::{RedisBackend, Redlock};
use dlm_testkit::faults::{Direction, FaultProxy};
use dlm_testkit::redis_server::RedisServer;
use dlm_testkit::skew::ClockSkew;
use rand::Rng;
use rand::rngs::StdRng;

use crate::{Declared, LEASE, LOCKS, Target};

// --- memory -----------------------------------------------------------------------------

pub(crate) struct MemoryTarget {
    backend: Arc<MemoryBackend>,
}

impl MemoryTarget {
    pub(crate) fn new() -> Self {
        MemoryTarget {
            backend: Arc::new(MemoryBackend::new()),
        }
    }
}

impl Target for MemoryTarget {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        self.backend.clone()
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let faults = self.backend.faults();
        match rng.random_range(0..3) {
            0 => {
                faults.delay_calls(Duration::from_millis(50));
                thread::sleep(Duration::from_secs(3));
                faults.delay_calls(Duration::ZERO);
                "slow calls"
            }
            1 => {
                faults.fail_next(20, BackendErrorKind::Unavailable);
                thread::sleep(Duration::from_secs(1));
                "errors"
            }
            _ => {
                let name = format!("soak-{}", rng.random_range(0..LOCKS));
                declared.window(|| {
                    // A lease ending under its holder: what a clock jump does.
                    self.backend.expire_now(&name);
                    thread::sleep(Duration::from_millis(200));
                });
                "lease expired (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.backend.names()
    }

    fn connections(&self) -> usize {
        0
    }
}

// --- Redis ------------------------------------------------------------------------------

/// One Redis node as the soak runs it: AOF `always`, a shimmed clock, clients through a
/// fault proxy, and an admin connection straight to the server.
struct Node {
    server: RedisServer,
    proxy: FaultProxy,
    skew: ClockSkew,
}

impl Node {
    fn spawn() -> Node {
        let skew = ClockSkew::new();
        let server = RedisServer::builder()
            .appendonly(true)
            .clock_skew(&skew)
            .spawn();
        let proxy = FaultProxy::start(server.port());
        Node {
            server,
            proxy,
            skew,
        }
    }

    /// Kills the server and starts it again with its data gone.
    fn restart_empty(&mut self) {
        self.server.kill();
        let _ = std::fs::remove_dir_all(self.server.dir().join("appendonlydir"));
        self.server.restart();
    }

    fn leaked_keys(&self) -> usize {
        leaked_keys(&self.server)
    }

    fn connections(&self) -> usize {
        connections(&self.server) + self.proxy.connections()
    }

    /// The clock back by 10 s for 3 s, then forward again to where it was: the way back
    /// is a forward jump, so it is declared.
    fn clock_back_and_restore(&self, declared: &Declared) {
        let by = Duration::from_secs(10);
        self.skew.back(by);
        thread::sleep(Duration::from_secs(3));
        declared.window(|| {
            self.skew.forward(by);
            thread::sleep(Duration::from_millis(200));
        });
    }
}

pub(crate) struct SingleTarget {
    node: Node,
}

impl SingleTarget {
    pub(crate) fn new() -> Self {
        SingleTarget {
            node: Node::spawn(),
        }
    }
}

impl Target for SingleTarget {
    fn name(&self) -> &'static str {
        "single"
    }

    fn clients(&self) -> usize {
        2
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::builder(&self.node.proxy.url())
                .connect_timeout(Duration::from_millis(300))
                .io_timeout(Duration::from_millis(300))
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let node = &mut self.node;
        match rng.random_range(0..11) {
            0 => {
                node.server.pause();
                thread::sleep(LEASE + Duration::from_secs(1));
                node.server.resume();
                "pause > lease"
            }
            1 => {
                node.server.pause();
                thread::sleep(LEASE / 4);
                node.server.resume();
                "pause < lease"
            }
            2 => {
                node.server.restart();
                "kill + AOF restart"
            }
            3 => {
                declared.window(|| node.restart_empty());
                "restart empty (declared)"
            }
            4 => {
                node.proxy
                    .set_latency(Direction::Both, Duration::from_millis(50));
                thread::sleep(Duration::from_secs(3));
                node.proxy.heal();
                "latency 50 ms"
            }
            5 => {
                node.proxy.stall(Direction::ToServer);
                thread::sleep(Duration::from_secs(1));
                node.proxy.heal();
                "stall 1 s"
            }
            6 => {
                node.proxy.reset_all();
                "reset"
            }
            7 => {
                node.proxy.blackhole(Direction::Both);
                thread::sleep(LEASE + Duration::from_secs(1));
                node.proxy.heal();
                "black hole > lease"
            }
            8 => {
                node.proxy.drop_replies(3);
                thread::sleep(Duration::from_secs(1));
                node.proxy.heal();
                "lost replies"
            }
            9 => {
                node.clock_back_and_restore(declared);
                "clock back"
            }
            _ => {
                declared.window(|| {
                    node.skew.forward(Duration::from_secs(5));
                    thread::sleep(Duration::from_millis(200));
                });
                "clock forward (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.node.leaked_keys()
    }

    fn connections(&self) -> usize {
        self.node.connections()
    }
}

pub(crate) struct RedlockTarget {
    nodes: Vec<Node>,
}

impl RedlockTarget {
    pub(crate) fn new(n: usize) -> Self {
        RedlockTarget {
            nodes: (0..n).map(|_| Node::spawn()).collect(),
        }
    }

    /// `k` distinct nodes, at random.
    fn pick(&self, rng: &mut StdRng, k: usize) -> Vec<usize> {
        rand::seq::index::sample(rng, self.nodes.len(), k).into_vec()
    }
}

impl Target for RedlockTarget {
    fn name(&self) -> &'static str {
        "redlock-5"
    }

    fn clients(&self) -> usize {
        3
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.proxy.url()).collect();
        Arc::new(
            Redlock::builder(&urls)
                .connect_timeout(Duration::from_millis(200))
                .io_timeout(Duration::from_millis(200))
                .build()
                .expect("a backend"),
        )
    }

    fn fault(&mut self, rng: &mut StdRng, declared: &Declared) -> &'static str {
        let minority = self.nodes.len() / 2;
        match rng.random_range(0..11) {
            0 | 1 => {
                let (k, what) = if rng.random_bool(0.5) {
                    (minority, "minority pause > lease")
                } else {
                    (minority + 1, "majority pause > lease")
                };
                let picked = self.pick(rng, k);
                picked.iter().for_each(|&i| self.nodes[i].server.pause());
                thread::sleep(LEASE + Duration::from_secs(1));
                picked.iter().for_each(|&i| self.nodes[i].server.resume());
                what
            }
            2 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].server.restart();
                "kill + AOF restart"
            }
            3 => {
                let i = self.pick(rng, 1)[0];
                declared.window(|| self.nodes[i].restart_empty());
                "restart empty (declared)"
            }
            4 => {
                let picked = self.pick(rng, minority);
                for &i in &picked {
                    self.nodes[i]
                        .proxy
                        .set_latency(Direction::Both, Duration::from_millis(50));
                }
                thread::sleep(Duration::from_secs(3));
                picked.iter().for_each(|&i| self.nodes[i].proxy.heal());
                "minority latency 50 ms"
            }
            5 | 6 => {
                let (k, what) = if rng.random_bool(0.5) {
                    (minority, "minority black hole > lease")
                } else {
                    (minority + 1, "majority black hole > lease")
                };
                let picked = self.pick(rng, k);
                for &i in &picked {
                    self.nodes[i].proxy.blackhole(Direction::Both);
                }
                thread::sleep(LEASE + Duration::from_secs(1));
                picked.iter().for_each(|&i| self.nodes[i].proxy.heal());
                what
            }
            7 => {
                self.nodes.iter().for_each(|n| n.proxy.reset_all());
                "reset all"
            }
            8 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].proxy.stall(Direction::ToClient);
                thread::sleep(Duration::from_secs(1));
                self.nodes[i].proxy.heal();
                "stall 1 s"
            }
            9 => {
                let i = self.pick(rng, 1)[0];
                self.nodes[i].clock_back_and_restore(declared);
                "clock back"
            }
            _ => {
                // Always the same majority, by the same amount: the skewed nodes agree with
                // each other, and every quorum holds one of them, so a node that restarts
                // empty later cannot issue a token below theirs (the documented assumption:
                // clocks agree within the time between a commit and a loss).
                declared.window(|| {
                    for n in &self.nodes[..=minority] {
                        n.skew.forward(Duration::from_secs(5));
                    }
                    thread::sleep(Duration::from_millis(200));
                });
                "majority clock forward (declared)"
            }
        }
    }

    fn leaked_keys(&self) -> usize {
        self.nodes.iter().map(Node::leaked_keys).sum()
    }

    fn connections(&self) -> usize {
        self.nodes.iter().map(Node::connections).sum()
    }
}

/// Lock keys left on `server` (every `dlm:` key but the fencing streams), and fencing
/// streams without a TTL.
pub(crate) fn leaked_keys(server: &RedisServer) -> usize {
    let mut c = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("dlm:*")
        .query(&mut c)
        .unwrap_or_default();
    keys.iter()
        .filter(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut c).unwrap_or(-2);
            !k.starts_with("dlm:fence:") || ttl == -1
        })
        .count()
}

/// Client connections open on `server` (a data node or a sentinel): all but this admin
/// connection, the replication links (flags `S` and `M`) and the sentinels' own links
/// (named `sentinel-<id>-cmd` or `-pubsub`).
pub(crate) fn connections(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap_or_default();
    list.lines()
        .filter(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
            };
            field("cmd") != "client|list"
                && !field("flags").contains(['S', 'M'])
                && !field("name").starts_with("sentinel-")
        })
        .count()
}
