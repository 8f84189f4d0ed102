//! The shared conformance suite against Redlock over five real redis-servers.
mod common;
dlm_testkit::conformance_tests!(
    mutex_only = "Redlock keeps no semaphores or read-write locks: a majority per permit does not bound the holders",
    common::Cluster::new(5)
);
