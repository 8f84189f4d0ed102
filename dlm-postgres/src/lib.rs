//! # dlm-postgres: a PostgreSQL backend for dlm
//!
//! [`PostgresBackend`] keeps locks in a PostgreSQL server most teams already run: leases
//! as rows of unlogged tables that expire on the server's clock, fencing tokens from a
//! sequence that never goes back (across `kill -9`, restarts and a standby's promotion),
//! and wake-ups by `LISTEN`/`NOTIFY`. Every kind of hold: locks, semaphores, read-write
//! locks. Blocking: a request runs on the calling thread, over a socket of dlm's own,
//! bounded by its deadline; only the one listening connection (wake-ups) has a runtime
//! and a thread of its own. Nothing async reaches the API.
//!
//! ```no_run
//! use dlm_core::{Lock, LockClient};
//! use dlm_postgres::PostgresBackend;
//!
//! let client = LockClient::new(PostgresBackend::new(
//!     "postgresql://app@db.internal:5432/app",
//! )?);
//! let guard = client.get_lock("nightly-report")?.lock()?;
//! let token = guard.fencing_token(); // from the dlm.tokens sequence
//! # drop((guard, token));
//! # Ok::<(), dlm_core::Error>(())
//! ```
//!
//! See [`PostgresBackend`] for the tables, what a crash does and the clock it relies on.
#![deny(missing_docs)]

// The layers, each importing only from those below it:
// - `backend`, `builder`: the `LockBackend` impl, each call one statement; the settings.
// - `hints`: the listening connection and its thread (release wake-ups).
// - `resolved`: what the builder resolved (the backend is made from it).
// - `schema`: dlm's schema in the database: found, installed, the grants it needs.
// - `pool`: the connections, lent one request at a time.
// - `conn`: one connection, its deadlines, what its errors mean.
// - `sql`: the schema (tables, sequence, functions) and the statements that call it.

mod backend;
mod builder;
mod conn;
mod failure;
mod groups;
mod hints;
mod io;
mod pool;
mod resolved;
mod schema;
mod sql;

pub use backend::PostgresBackend;
pub use builder::PostgresBackendBuilder;
pub use dlm_core::tls::TlsOptions;

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
