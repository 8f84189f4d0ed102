//! # dlm-redis: Redis backends for dlm
//!
//! - [`RedisBackend`]: a lock on one Redis server ([`RedisBackend::builder`]), on the
//!   master a Redis Sentinel deployment names ([`RedisBackend::sentinel`]), or on the
//!   master of the lock's slot in a Redis Cluster ([`RedisBackend::cluster`]); with
//!   [`wait_for_replicas`](RedisBackendBuilder::wait_for_replicas) to narrow the failover
//!   window.
//! - [`Redlock`]: one lock over N independent masters (the Redlock algorithm).
//!
//! Both implement [`dlm_core::backend::LockBackend`]; hand them to a
//! [`LockClient`](dlm_core::LockClient). [`fenced_set`] is the resource-side check for a
//! value kept in Redis.
//!
//! ## Keys and scripts
//! A lock called `n` is the string key `dlm:{n}` (value: the owner token, `~` appended once a
//! waiter has marked it; with a TTL) and its release channel `dlm:{n}:released`. Fencing
//! tokens are stream IDs drawn from `dlm:fence:{tag}`, one stream per cluster slot (the tag
//! puts it in the slot of `dlm:{n}`), which keeps only its last ID and expires
//! `fence_ttl` (24 h by default) after its last use: at most 16,384 such keys per prefix,
//! whatever the number of names. A lost stream starts again from the server's clock,
//! above the tokens it gave (see the README's "Fencing"). Every key has a TTL;
//! [`RedisBackend::keys`] names a lock's keys, and [`key_slot`] a key's cluster slot.
//! Lock names travel in KEYS, and in ARGV only as the release channel (a channel is not
//! a key; for a name that begins with `}` it hashes to another cluster slot than the
//! lock key, so it cannot be declared). Taking a
//! free lock without fencing is a plain `SET key token NX PX ms GET` (Redis 7.0 or later;
//! older servers are detected and get the acquire script); with fencing, the acquire
//! script takes the lock and draws the token in one step, and touches the fencing stream
//! only once it has seen that it is a stream (dlm never changes a key it did not write).
//! Everything else is a Lua script (`src/protocol/lua/`: acquire, extend, release, force release,
//! inspect, commit), run with EVALSHA and reloaded on NOSCRIPT. An uncontended lock + unlock is two round trips
//! per node on pooled connections (three for Redlock with fencing: its commit round).
//!
//! ## TLS
//! A `rediss://` URL connects with TLS (rustls), on every connection dlm opens to that
//! server: lock requests, release hints, the set-up checks. The certificate is checked
//! against the system's roots and the URL's host unless [`TlsOptions`] say otherwise (a
//! CA file, a client certificate for mutual TLS, another name to verify). A certificate
//! problem is a [`BackendErrorKind::Tls`](dlm_core::BackendErrorKind::Tls) error, never
//! retried.
//!
//! ## Connections
//! One r2d2 pool per server, with a connection manager that sets connect, read and write
//! timeouts, so a paused or dead server fails requests within those timeouts instead of
//! hanging. Pools connect lazily: a server that is down at construction fails the calls
//! that need it. A connection that saw an I/O error or timeout is discarded.
//!
//! ## Minimal ACL
//! With the default prefix: `+eval +evalsha +script|load +ping +info +get +set +pexpire
//! +pttl +xadd +append +del +publish +psubscribe ~dlm:* &dlm:*` (the scripts' commands are
//! checked too). Without `&dlm:*` and `+psubscribe`/`+publish`, locking still works and
//! waiters poll instead of being woken. Without the script commands or `+get`, a free
//! lock can still be taken (the plain `SET NX`, fenced or not), but drawing its fencing
//! token and releasing it fail with a permission error (it ends with its lease); without
//! `+xadd` only the token's draw fails. A waiter
//! marks the key it waits for with `APPEND` (so that the holder's release announces
//! itself; an uncontended release publishes nothing).
#![deny(missing_docs)]

mod backends;
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals;
mod conn;
mod fanout;
mod fenced;
mod hints;
mod node;
mod options;
mod protocol;
mod slot;
mod topology;
mod transport;

pub use fenced::{FencedWriteError, fenced_get, fenced_set};
pub use node::SETTINGS_LOG_TARGET;
pub use protocol::LockKeys;
pub use slot::key_slot;
pub use transport::TlsOptions;

pub use backends::{
    ClusterBuilder, RedisBackend, RedisBackendBuilder, Redlock, RedlockBuilder, SentinelBuilder,
    quorum,
};
/// The `redis` crate dlm-redis is built on, re-exported so that a connection for
/// [`fenced_set`] needs no dependency of your own, and always has the version it expects.
pub use redis;

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
