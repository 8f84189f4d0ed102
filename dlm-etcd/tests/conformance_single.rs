//! The shared conformance suite against one real etcd member.
mod common;
dlm_testkit::conformance_tests!(
    no_elections =
        "etcd keeps no elections yet (no relabel, no observer hints, no terms in inspection)",
    common::Single::new()
);
