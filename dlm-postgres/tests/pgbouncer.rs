//! The shared conformance suite through PgBouncer in transaction pooling mode: each
//! request of dlm's is one statement, its own transaction, so it may run on any of the
//! pooler's server connections, shared with other clients; nothing of dlm's lives in a
//! session. The release hints are listened for on the server itself (`listen_url`): a
//! `LISTEN` through a transaction pooler hears nothing (`pgbouncer_waiting.rs` shows
//! what waiters do then).
//!
//! One server and one pooler (20 server connections) are shared by every case of this
//! binary.
mod common;

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_postgres::PostgresBackend;
use dlm_testkit::Shared;
use dlm_testkit::pgbouncer::{PgBouncer, PoolMode};
use dlm_testkit::postgres::PostgresServer;

/// A server and the pooler in front of it (the pooler first: it is dropped first).
struct Pooled {
    bouncer: PgBouncer,
    server: PostgresServer,
}

static POOLED: Shared<Pooled> = Shared::new();

/// Backends that send their requests through the pooler and listen on the server.
struct Bounced(Arc<Pooled>);

impl Bounced {
    fn new() -> Self {
        Bounced(POOLED.get(|| {
            let server = PostgresServer::spawn();
            let bouncer = PgBouncer::spawn(&server, PoolMode::Transaction);
            Pooled { bouncer, server }
        }))
    }
}

impl dlm_testkit::Fixture for Bounced {
    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            PostgresBackend::builder(&self.0.bouncer.url())
                .listen_url(&self.0.server.url())
                .io_timeout(common::CALM)
                .connect_timeout(common::CALM)
                .build()
                .unwrap(),
        )
    }
}

dlm_testkit::conformance_tests!(Bounced::new());
