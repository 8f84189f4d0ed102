//! The shared conformance suite against a real 3-member etcd cluster.
mod common;
dlm_testkit::conformance_tests!(common::Cluster::new(3));
