//! The conformance suite on Redlock over three Redis 6.2 servers (fencing on: round 1 is
//! the pipelined `SET ... NX GET` + `GET`, which 6.2 refuses; the nodes fall back to the
//! acquire script).
mod common;
dlm_testkit::conformance_tests!(optional: common::Cluster::legacy(3));
