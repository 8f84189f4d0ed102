//! dlm's schema in a database: found at its version or installed at first use, and what
//! a role without the rights to it is told.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlm_core::backend::{BackendError, BackendErrorKind};
use parking_lot::Mutex;
use tokio_postgres::error::SqlState;

use crate::conn::{Conn, How};
use crate::sql::{self, Statements};

/// dlm's schema of one backend.
pub(crate) struct Schema {
    name: String,
    sql: String,
    /// The role dlm connects as (for the grants it needs).
    role: String,
    /// Whether the schema was found (or installed) at its version.
    ready: AtomicBool,
    install: Mutex<()>,
}

impl Schema {
    pub(crate) fn new(name: String, channel: &str, role: String) -> Schema {
        Schema {
            sql: sql::schema_sql(&name, channel),
            name,
            role,
            ready: AtomicBool::new(false),
            install: Mutex::new(()),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// The statements that give `role` what dlm needs in the schema.
    pub(crate) fn grants_sql(&self, role: &str) -> String {
        let (s, r) = (&self.name, role.replace('"', "\"\""));
        format!(
            "GRANT USAGE ON SCHEMA \"{s}\" TO \"{r}\"; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{s}\" TO \"{r}\"; \
             GRANT SELECT, USAGE, UPDATE ON SEQUENCE \"{s}\".tokens TO \"{r}\";"
        )
    }

    /// What a request's failure becomes: a refusal for want of rights names the grants an
    /// administrator must run; a schema that went away (dropped by hand) is installed
    /// again at the next request.
    pub(crate) fn after(&self, e: BackendError) -> BackendError {
        if e.message().contains("(42883)") || e.message().contains("(42P01)") {
            self.ready.store(false, Ordering::Release);
        }
        if e.kind() != BackendErrorKind::Permission {
            return e;
        }
        BackendError::new(
            BackendErrorKind::Permission,
            format!(
                "{}. dlm's role needs: {}",
                e.message(),
                self.grants_sql(&self.role)
            ),
        )
        .never_sent()
    }

    /// Finds the schema at its version, or installs it, once per backend. Nothing of a
    /// lock is sent before, so a failure here applied nothing.
    pub(crate) fn ensure(
        &self,
        conn: &mut Conn,
        stmts: &Statements,
        timeout: Duration,
    ) -> Result<(), BackendError> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let _installing = self.install.lock();
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let how = How {
            timeout,
            prepare: &AtomicBool::new(false),
        };
        let missing = |e: &BackendError| {
            [SqlState::UNDEFINED_TABLE, SqlState::INVALID_SCHEMA_NAME]
                .iter()
                .any(|c| e.message().contains(&format!("({})", c.code())))
        };
        let version = match conn.query(&stmts.version, &[], &how) {
            Ok(rows) => rows.first().map_or(0, |r| r.get::<_, i32>(0)),
            Err(e) if missing(&e) => 0,
            Err(e) => return Err(e.never_sent()),
        };
        if version < sql::VERSION {
            // Creating the schema takes longer than a request: a generous deadline.
            let install = timeout.max(Duration::from_secs(10));
            // Under the installation lock, the version again: of several backends that
            // found it old at once, one installs and the others find it done (each
            // installation locks dlm's tables until it commits, which held everyone's
            // requests past their deadline when eight backends installed in turn).
            if let Err(e) = self.install_under_lock(conn, stmts, install) {
                let _ = conn.batch("ROLLBACK", timeout);
                if e.kind() != BackendErrorKind::Permission {
                    return Err(e.never_sent());
                }
                if e.kind() != BackendErrorKind::Permission {
                    return Err(e.never_sent());
                }
                return Err(BackendError::new(
                    BackendErrorKind::Permission,
                    format!(
                        "dlm's schema {:?} is missing or out of date, and this role may not create it ({}). \
                         Have an administrator run PostgresBackend::schema_sql() once (or grant this role \
                         CREATE on the database), then: {}",
                        self.name,
                        e.message(),
                        self.grants_sql(&self.role)
                    ),
                )
                .never_sent());
            }
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// In one transaction: the installation lock, the version found under it, and the
    /// schema installed if that is older.
    fn install_under_lock(
        &self,
        conn: &mut Conn,
        stmts: &Statements,
        timeout: Duration,
    ) -> Result<(), BackendError> {
        conn.batch(
            &format!("BEGIN; SELECT pg_advisory_xact_lock({})", sql::INSTALL_LOCK),
            timeout,
        )?;
        let how = How {
            timeout,
            prepare: &AtomicBool::new(false),
        };
        // `to_regclass` first: a query of a missing table would abort the transaction.
        let settings = format!("\"{}\".settings", self.name);
        let exists = conn.query(
            "SELECT to_regclass($1) IS NOT NULL",
            &[(&settings.as_str(), tokio_postgres::types::Type::TEXT)],
            &how,
        )?;
        let version = if exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
            conn.query(&stmts.version, &[], &how)?
                .first()
                .map_or(0, |r| r.get::<_, i32>(0))
        } else {
            0
        };
        if version < sql::VERSION {
            log::info!(
                "dlm-postgres: installing schema {:?} (version {})",
                self.name,
                sql::VERSION
            );
            conn.batch(&self.sql, timeout)?;
        }
        conn.batch("COMMIT", timeout)
    }
}
