//! The shared conformance suite against one real PostgreSQL server, every kind of hold.
mod common;
dlm_testkit::conformance_tests!(common::Single::new());
