//! The backends, on top: [`RedisBackend`] (one lock on the node its topology names: one
//! server, Sentinel's master, the master of the lock's cluster slot) and [`Redlock`] (one
//! lock over N independent masters), with one builder per deployment.

mod builders;
mod redis;
mod redlock;

pub use builders::{ClusterBuilder, RedisBackendBuilder, RedlockBuilder, SentinelBuilder};
pub use redis::RedisBackend;
pub use redlock::{Redlock, quorum};
