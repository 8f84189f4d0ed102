//! The shared conformance suite against Redlock over three real redis-servers.
mod common;
dlm_testkit::conformance_tests!(common::Cluster::new(3));
