//! The shared conformance suite against one real redis-server.
mod common;
dlm_testkit::conformance_tests!(common::Single::new());
