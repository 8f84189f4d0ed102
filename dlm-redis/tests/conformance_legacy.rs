//! The conformance suite on Redlock over three Redis 6.2 servers (fencing on: round 1 is
//! the pipelined `SET ... NX GET` + `GET`, which 6.2 refuses; the nodes fall back to the
//! acquire script).
mod common;
dlm_testkit::conformance_tests!(
    ignore = "needs a Redis 6.2 server (DLM_REDIS_LEGACY_SERVER); scripts/test runs these",
    mutex_only = "Redlock keeps no semaphores or read-write locks: a majority per permit does not bound the holders",
    common::Cluster::legacy(3)
);
