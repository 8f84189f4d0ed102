//! The shared conformance suite against Redlock over five real redis-servers.
mod common;
dlm_testkit::conformance_tests!(common::Cluster::new(5));
