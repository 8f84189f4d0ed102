//! The shared conformance suite against one real redis-server over TLS (`rediss://`, a
//! test CA): lock connections and the release-hint listener both speak TLS.
mod common;
dlm_testkit::conformance_tests!(common::TlsSingle::new());
