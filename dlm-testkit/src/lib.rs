//! # dlm-testkit: testing dlm and its backends
//!
//! - [`conformance`]: the behaviour every [`LockBackend`](dlm_core::backend::LockBackend) must
//!   show, one `pub fn` per case; [`conformance_tests!`] stamps one `#[test]` per case for
//!   a backend fixture.
//! - [`redis_server`]: real `redis-server` processes on free 127.0.0.1 ports, with
//!   controls to pause, kill and restart them; killed and reaped on drop.
//! - [`sentinel`]: a Redis Sentinel topology of real processes (a master, replicas,
//!   sentinels), ready when spawned, with failovers on demand.
//! - [`cluster`]: a real Redis Cluster of such servers (masters and replicas), with
//!   stepwise slot migration and failover.
//! - [`etcd`]: real `etcd` processes: one member, or an `n`-member cluster, with
//!   controls to pause, kill (`-9`) and restart members; killed and reaped on drop.
//! - [`postgres`]: real PostgreSQL servers (`initdb` and `postgres`) on free ports, with
//!   controls to pause, kill (`-9`), restart, stop and start them; killed on drop.
//! - [`postgres_pair`]: a PostgreSQL primary and a streaming standby (asynchronous or
//!   synchronous), with promotion and replay waits, for failover tests.
//! - [`pgbouncer`]: real PgBouncer processes (session, transaction or statement pooling)
//!   in front of a [`postgres`] server, on free ports; killed on drop.
//! - [`history`]: a checker for recorded holds (mutual exclusion, fencing order).
//! - [`logs`]: captures the process's log records, to check warnings and secrets.
//! - [`faults`]: a TCP proxy that injects network faults (latency, stalls, loss, resets)
//!   between a client and a server.
//! - [`skew`]: wall-clock jumps on a server (an `LD_PRELOAD` shim built on first use).
//! - [`guide`]: writing a backend, a complete one, and the conformance suite run on it.
//! - [`scale`]: the scale bar of the renewal rule (thousands of holds of every kind
//!   through a slow network), for any backend.
//! - [`CountingBackend`]: a wrapper that counts backend calls (to prove that bad input is
//!   rejected before any I/O, or that a waiter sends nothing while it waits).
//! - [`FaultyBackend`]: a wrapper that loses replies of requests the store applied, or
//!   fails requests before they are sent (what the front must undo or send again).
#![deny(missing_docs)]

pub mod cluster;
pub mod conformance;
mod counting;
pub mod etcd;
pub mod faults;
mod faulty;
pub mod guide;
pub mod history;
pub mod logs;
mod pg_os;
pub mod pgbouncer;
pub mod postgres;
pub mod postgres_pair;
mod process;
pub mod redis_server;
pub mod scale;
pub mod sentinel;
pub mod skew;
mod tempdirs;
pub mod tls;

pub use conformance::fixture::{Fixture, Shared};
pub use counting::{CountingBackend, Round};
pub use faulty::FaultyBackend;

use std::sync::atomic::{AtomicU64, Ordering};

/// A lock name no other test uses: `prefix`, a process-wide counter and random bits.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{:08x}",
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
}

/// Timing-sensitive cases run alone (write), the others together (read): on a 2-core
/// machine a wake-up bound of 50 ms must not measure the neighbouring tests' servers.
#[doc(hidden)]
pub static TIMING: parking_lot::RwLock<()> = parking_lot::RwLock::new(());

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
