//! The shared conformance suite against one real etcd member.
mod common;
dlm_testkit::conformance_tests!(common::Single::new());
