//! The shared conformance suite against a real 3-member etcd cluster.
mod common;
dlm_testkit::conformance_tests!(
    no_elections =
        "etcd keeps no elections yet (no relabel, no observer hints, no terms in inspection)",
    common::Cluster::new(3)
);
