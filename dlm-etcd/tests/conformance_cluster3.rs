//! The shared conformance suite against a real 3-member etcd cluster.
mod common;
dlm_testkit::conformance_tests!(
    mutex_only = "dlm-etcd keeps no semaphores or read-write locks yet",
    common::Cluster::new(3)
);
