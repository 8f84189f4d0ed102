//! # dlm-etcd: an etcd backend for dlm
//!
//! [`EtcdBackend`] keeps locks in etcd: a granted lock is in etcd's Raft log, so it
//! survives the loss of any minority of members, a leader change and a restart of every
//! member, and its fencing token (the key's `create_revision`) never goes back.
//!
//! It speaks etcd's v3 HTTP/JSON gateway (served on the client port under `/v3/` since
//! etcd 3.4) with a blocking HTTP client: no async runtime, no gRPC, no `protoc`.
//!
//! ```no_run
//! use dlm_core::{Lock, LockClient};
//! use dlm_etcd::EtcdBackend;
//!
//! let client = LockClient::new(EtcdBackend::new(&[
//!     "http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379",
//! ])?);
//! let guard = client.get_lock("nightly-report")?.lock()?;
//! let token = guard.fencing_token(); // the key's create_revision
//! # drop((guard, token));
//! # Ok::<(), dlm_core::Error>(())
//! ```
//!
//! See [`EtcdBackend`] for the keys, the transactions and how dlm's leases map to etcd's
//! whole-second leases.
#![deny(missing_docs)]

// The layers, each importing only from those below it (the operations call each other):
// - `backend`, `builder`: the `LockBackend` impl, each call one operation; the settings.
// - `acquire`, `claims`, `renew`: the operations, functions taking `&Inner`: a mutex's
//   acquisition, release and inspection; a semaphore's or read-write lock's holds; the
//   renewals of every kind of hold.
// - `inner`: `Inner`, what the operations of one backend share, and the lease
//   bookkeeping they all use (grants, keep-alives).
// - `hints`, `leases`, `kv`: the release hints (the watch thread), the record of etcd
//   leases, a key's value as dlm writes and reads it.
// - `gateway`: the HTTP/JSON client of the members.
// - `tls`: the watch stream's TLS connection, what a TLS failure means.

mod acquire;
mod backend;
mod builder;
mod claims;
mod gateway;
mod hints;
mod inner;
mod kv;
mod leases;
mod renew;
mod resource;
mod tls;

pub use backend::EtcdBackend;
pub use builder::EtcdBackendBuilder;
pub use dlm_core::tls::TlsOptions;

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
