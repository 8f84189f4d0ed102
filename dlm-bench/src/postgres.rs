//! The PostgreSQL rows' bars, written with the synchronous `postgres` crate, one
//! connection per handle, prepared statements: a minimal client of dlm's mechanism (a
//! lease as a row of an unlogged table, one statement to acquire and one to release,
//! written the way the minimal Redis client is), and the raw session advisory-lock cycle
//! (`pg_advisory_lock` / `pg_advisory_unlock`), where the mechanism differs.

use std::time::{Duration, Instant};

use postgres::{Client, NoTls, Statement};

use crate::system::{LockHandle, LockSystem};

/// The minimal client's own schema: an unlogged table of leases and a sequence of tokens.
const SETUP: &str = "CREATE SCHEMA IF NOT EXISTS bench_min;
CREATE UNLOGGED TABLE IF NOT EXISTS bench_min.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires timestamptz NOT NULL,
    token bigint NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS bench_min.tokens;";

/// The acquisition, one statement: insert the name's row, or take it where its lease has
/// ended, drawing the token in `DO UPDATE`, on the locked row (PostgreSQL evaluates it
/// again, and draws again, on a row changed meanwhile), so a later holder of the row
/// always draws a larger one; a row back (with its token) is a grant. The release marks
/// the row free instead of deleting it: a new row's token is drawn before its
/// insertion, and with rows deleted at their release a slow attempt could insert after
/// a faster one had held and released the name, with a smaller token (what dlm's
/// history checker caught). This is dlm's statement, without its hold-back epoch and
/// durable mark.
const ACQUIRE: &str = "INSERT INTO bench_min.locks AS l (name, owner, expires, token) \
VALUES ($1, $2, clock_timestamp() + $3::int8 * interval '1 ms', nextval('bench_min.tokens')) \
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires = excluded.expires, \
token = nextval('bench_min.tokens') WHERE l.expires <= clock_timestamp() RETURNING l.token";

/// The release: the row, while it is still this owner's, marked free.
const RELEASE: &str = "UPDATE bench_min.locks SET owner = '', expires = '-infinity' \
WHERE name = $1 AND owner = $2";

/// How long the minimal client sleeps between attempts while it waits (it has no
/// wake-ups).
pub const POLL: Duration = Duration::from_millis(1);

fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).expect("connect to PostgreSQL")
}

/// Which statements a [`MinimalPostgres`] sends.
enum Sql {
    /// Its own lean pair ([`ACQUIRE`], [`RELEASE`]) on its own table.
    Lean,
    /// dlm's own pair, on dlm's schema, given by the backend
    /// (`PostgresBackend::mutex_statements`): what is left between dlm and this client
    /// is the client's cost alone.
    Dlm { acquire: String, release: String },
}

/// The minimal rows client: acquire = one `INSERT ... ON CONFLICT DO UPDATE ... WHERE
/// expired RETURNING token` (a token from its own sequence), release = one owner-checked
/// `UPDATE` that marks the row free; `lock` polls `try_lock` with a sleep of [`POLL`]. What dlm's
/// PostgreSQL backend does at its least: no hold-back epoch, no durable mark, no waiting
/// list, no notification.
pub struct MinimalPostgres {
    url: String,
    ttl_ms: i64,
    sql: Sql,
}

impl MinimalPostgres {
    /// The client on the server at `url`, leases of `ttl`; creates its table and sequence.
    pub fn new(url: &str, ttl: Duration) -> Self {
        connect(url)
            .batch_execute(SETUP)
            .expect("create bench_min.locks");
        MinimalPostgres {
            url: url.to_owned(),
            ttl_ms: ttl.as_millis() as i64,
            sql: Sql::Lean,
        }
    }

    /// The same client sending dlm's statements of `backend`: the floor of any client of
    /// dlm's mechanism. One hold through dlm first installs dlm's schema and opens its
    /// epoch (which the acquisition statement checks).
    pub fn with_statements_of(
        url: &str,
        ttl: Duration,
        backend: &std::sync::Arc<dlm_postgres::PostgresBackend>,
    ) -> Self {
        use dlm_core::Lock;
        let client = dlm_core::LockClient::builder(backend.clone())
            .lease(ttl)
            .build()
            .expect("a dlm client");
        let lock = client.get_lock("bench-min-open").expect("a lock name");
        let guard = lock.try_lock().expect("a first hold through dlm");
        drop(guard.expect("bench-min-open is free"));
        let (acquire, release) = backend.mutex_statements();
        MinimalPostgres {
            url: url.to_owned(),
            ttl_ms: ttl.as_millis() as i64,
            sql: Sql::Dlm {
                acquire: acquire.to_owned(),
                release: release.to_owned(),
            },
        }
    }
}

/// The name of the minimal client that sends dlm's statements.
pub const MINIMAL_POSTGRES_DLM_SQL: &str = "minimal (postgres, dlm's statements)";

impl LockSystem for MinimalPostgres {
    fn name(&self) -> String {
        match self.sql {
            Sql::Lean => crate::report::MINIMAL_POSTGRES.into(),
            Sql::Dlm { .. } => MINIMAL_POSTGRES_DLM_SQL.into(),
        }
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        use postgres::types::Type;
        let mut client = connect(&self.url);
        let owner = format!("{:032x}", rand::random::<u128>());
        let (acquire, release, owner) = match &self.sql {
            Sql::Lean => (
                client.prepare(ACQUIRE).expect("prepare the acquisition"),
                client.prepare(RELEASE).expect("prepare the release"),
                owner,
            ),
            Sql::Dlm { acquire, release } => (
                client
                    .prepare_typed(acquire, &[Type::TEXT, Type::TEXT, Type::INT8])
                    .expect("prepare dlm's acquisition"),
                client
                    .prepare_typed(release, &[Type::TEXT, Type::TEXT, Type::TEXT])
                    .expect("prepare dlm's release"),
                // As long as dlm's owner tokens (client id, thread, sequence).
                format!("{owner}:1:1"),
            ),
        };
        let sender = match self.sql {
            Sql::Lean => None,
            Sql::Dlm { .. } => Some(format!("{:016x}", rand::random::<u64>())),
        };
        Box::new(MinimalPostgresHandle {
            client,
            acquire,
            release,
            sender,
            owner,
            ttl_ms: self.ttl_ms,
            held: None,
        })
    }
}

struct MinimalPostgresHandle {
    client: Client,
    acquire: Statement,
    release: Statement,
    /// dlm's release takes a sender id (`Sql::Dlm`); the lean one does not.
    sender: Option<String>,
    owner: String,
    ttl_ms: i64,
    held: Option<String>,
}

impl LockHandle for MinimalPostgresHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        let granted = self
            .client
            .query_opt(&self.acquire, &[&key, &self.owner, &self.ttl_ms])
            .is_ok_and(|row| row.is_some_and(|r| r.get::<_, i64>(0) > 0));
        // (dlm's acquisition also answers the lease's end and the epoch's start, with which
        // dlm raises the durable mark about once a second: not done here, a floor.)
        if granted {
            self.held = Some(key.to_owned());
        }
        granted
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
        loop {
            if self.try_lock(key) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    fn unlock(&mut self) {
        if let Some(key) = self.held.take() {
            let _ = match &self.sender {
                None => self.client.execute(&self.release, &[&key, &self.owner]),
                Some(sender) => self
                    .client
                    .execute(&self.release, &[&key, &self.owner, sender]),
            };
        }
    }
}

/// The raw session advisory-lock cycle: `pg_try_advisory_lock(hashtext(name))` /
/// `pg_advisory_lock(...)` (its wait: the server's lock queue, bounded by the session's
/// `lock_timeout`) and `pg_advisory_unlock(...)`, one connection per handle. No lease: the
/// lock lives as long as the session.
pub struct AdvisoryLock {
    pub url: String,
}

impl LockSystem for AdvisoryLock {
    fn name(&self) -> String {
        "advisory lock (postgres)".into()
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let mut client = connect(&self.url);
        let mut prepare = |sql: &str| client.prepare(sql).expect("prepare");
        let try_lock = prepare("SELECT pg_try_advisory_lock(hashtext($1))");
        let lock = prepare("SELECT pg_advisory_lock(hashtext($1))");
        let unlock = prepare("SELECT pg_advisory_unlock(hashtext($1))");
        Box::new(AdvisoryHandle {
            client,
            try_lock,
            lock,
            unlock,
            lock_timeout_ms: None,
            held: None,
        })
    }
}

struct AdvisoryHandle {
    client: Client,
    try_lock: Statement,
    lock: Statement,
    unlock: Statement,
    /// The session's `lock_timeout`, once set (set again only when it changes).
    lock_timeout_ms: Option<u64>,
    held: Option<String>,
}

impl LockHandle for AdvisoryHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        let granted = self
            .client
            .query_one(&self.try_lock, &[&key])
            .is_ok_and(|r| r.get::<_, bool>(0));
        if granted {
            self.held = Some(key.to_owned());
        }
        granted
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        if self.lock_timeout_ms != Some(max_wait_ms) {
            // 0 would mean no limit: at least 1 ms.
            let set = format!("SET lock_timeout = {}", max_wait_ms.max(1));
            if self.client.batch_execute(&set).is_err() {
                return false;
            }
            self.lock_timeout_ms = Some(max_wait_ms);
        }
        // A wait beyond lock_timeout fails (55P03): not acquired.
        let granted = self.client.execute(&self.lock, &[&key]).is_ok();
        if granted {
            self.held = Some(key.to_owned());
        }
        granted
    }

    fn unlock(&mut self) {
        if let Some(key) = self.held.take() {
            let _ = self.client.execute(&self.unlock, &[&key]);
        }
    }
}
