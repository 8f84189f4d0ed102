//! The shared conformance suite against one real etcd member.
mod common;
dlm_testkit::conformance_tests!(
    mutex_only = "dlm-etcd keeps no semaphores or read-write locks yet",
    common::Single::new()
);
