//! The shared conformance suite against one real redis-server.
mod common;
dlm_testkit::conformance_tests!(
    mutex_only = "dlm-redis keeps no semaphores or read-write locks yet",
    common::Single::new()
);
