//! The conformance suite on one server without fencing: every acquisition starts with the
//! plain `SET ... NX GET`, and only contention or a retry by the owner runs the script.
mod common;
dlm_testkit::conformance_tests!(
    no_elections = "an election's term is a fencing token: elections need fencing on",
    common::Single::unfenced()
);
