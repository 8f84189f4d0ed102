//! `PostgresBackend`: each `LockBackend` call one statement, a call of one of the schema's
//! functions (`sql`), on a connection lent by the pool. The backend, its connections and
//! the mutex's calls are here; the group holds' calls (semaphores, read-write locks,
//! elections) are in `groups.rs`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlm_core::InvalidArgument;
use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holders, Lease,
    LockBackend, LockName, OwnerToken, Renewal, Renewed, Watch, every_hold_kind,
};
use tokio_postgres::types::{ToSql, Type};

use crate::conn::{Conn, How};
use crate::hints::Hints;
use crate::pool::Pool;
use crate::resolved::Resolved;
use crate::schema::Schema;
use crate::sql::Statements;

/// How often expired rows are swept (by the first renewal round or release after it).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A lock backend on a PostgreSQL server (14 or later): leases as rows of unlogged
/// tables, expiring on the server's clock; fencing tokens from a sequence; wake-ups by
/// `LISTEN`/`NOTIFY`.
///
/// - **Tables.** dlm keeps everything in one schema (default `dlm`), created at first
///   use: a lock is a row of `dlm.locks` (name, owner token, expiry, fencing token); the
///   holders of semaphores and read-write locks are rows of `dlm.holds`. An acquisition
///   of a lock and its release are one prepared statement each; the rest (a held lock,
///   renewals, semaphores and read-write locks, administration) are calls of the
///   schema's PL/pgSQL functions. Each request is one transaction. dlm never touches a
///   table it did not create.
/// - **Unlogged.** The lease tables are `UNLOGGED`: an acquisition writes no WAL and
///   waits for no `fsync` (about 140 µs per acquire-and-release on one connection, against
///   290 µs for logged rows, measured with pgbench). A crash empties them, and so does the
///   promotion of a standby (unlogged tables are not replicated). So the latest end of any
///   lease granted is also kept, durably, in a logged row (written at most about once a
///   second, with a second of slack), and after such an emptying nothing is granted
///   before it: a lock granted before a crash is not granted to anyone else before its
///   lease could have ended.
/// - **Fencing tokens** are drawn from a logged sequence with every grant, and set forward
///   to the server's clock in microseconds whenever the tables were emptied: they never
///   go back, across `kill -9`, restarts and a standby's promotion.
/// - **Sessions.** No lock lives in a session: a connection goes back to the pool after
///   each request, and a connection pooler in transaction mode (PgBouncer) changes
///   nothing. A holder whose process dies, or whose connection is cut, keeps its lock
///   until its lease ends (or the watchdog stops renewing it), never longer.
/// - **Wake-ups.** A release notifies (`pg_notify`) when someone waits, and one listening
///   connection per backend routes it to the waiters.
///
/// The server's clock is the leases' clock: a step of it (not a slew) shortens or
/// lengthens every lease by as much.
pub struct PostgresBackend {
    pool: Pool,
    stmts: Statements,
    /// dlm's schema: its SQL, whether it is there, the grants it needs.
    schema: Schema,
    /// Whether statements are prepared on each connection (see `Conn::query`).
    prepare: AtomicBool,
    drift_factor: f64,
    pub(crate) hints: Hints,
    /// When the last sweep was made, in ms since `born`.
    swept: AtomicU64,
    /// The durable mark as `keep_mark` last answered it, and the epoch it was answered
    /// in: a grant of that epoch whose lease ends no later is covered without asking. The
    /// mark only goes up on a server; another server (a failover, a proxy that moved, a
    /// schema made again) has another epoch, so nothing learned on one covers the other.
    mark: parking_lot::Mutex<Mark>,
    born: Instant,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("pool", &self.pool)
            .field("schema", &self.schema.name())
            .finish_non_exhaustive()
    }
}

/// The durable mark known for an epoch, both in whole microseconds since 1970 on the
/// server's clock (the epoch's start exactly, the mark rounded down).
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    epoch: i64,
    until: i64,
}

impl Mark {
    const UNKNOWN: Mark = Mark {
        epoch: i64::MIN,
        until: i64::MIN,
    };

    /// Whether a lease of `epoch` ending at `ends` (rounded up) is covered.
    fn covers(self, epoch: i64, ends: i64) -> bool {
        self.epoch == epoch && ends <= self.until
    }

    /// `keep_mark` answered `until` in `epoch`.
    fn learned(&mut self, epoch: i64, until: i64) {
        if self.epoch == epoch {
            self.until = self.until.max(until);
        } else {
            *self = Mark { epoch, until };
        }
    }
}

/// The one-letter kind of a claim in the tables: `m`, `s` or `r`.
pub(crate) fn kind_of(claim: Claim) -> u8 {
    match claim {
        Claim::Permit { .. } => b's',
        Claim::Read | Claim::Write => b'r',
        _ => b'm',
    }
}

/// `ttl` in whole milliseconds, rounded up (the server's lease is never shorter).
pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

pub(crate) fn token(t: i64) -> FencingToken {
    FencingToken::new(u64::try_from(t).unwrap_or(0))
}

impl PostgresBackend {
    pub(crate) fn from_resolved(r: Resolved) -> Result<Self, InvalidArgument> {
        let channel = format!("dlm_{}", r.schema);
        let role = r.connector.config.get_user().unwrap_or_default().to_owned();
        let hints = Hints::new(r.listen, channel.clone());
        Ok(PostgresBackend {
            pool: Pool::new(r.connector, r.pool_size),
            stmts: Statements::new(&r.schema, &channel),
            schema: Schema::new(r.schema, &channel, role),
            prepare: AtomicBool::new(true),
            drift_factor: r.drift_factor,
            hints,
            swept: AtomicU64::new(0),
            mark: parking_lot::Mutex::new(Mark::UNKNOWN),
            born: Instant::now(),
        })
    }

    /// The SQL that creates dlm's schema (tables, sequence, functions). dlm runs it at
    /// first use when its role may create a schema in the database; otherwise an
    /// administrator runs it once, as a role that may, and grants dlm's role what it
    /// needs (see the crate's documentation).
    pub fn schema_sql(&self) -> &str {
        self.schema.sql()
    }

    /// The statements that give the role `role` what dlm needs in its schema, once an
    /// administrator has created it ([`schema_sql`](Self::schema_sql)): the use of the
    /// schema, reading and writing its tables, drawing from its sequence.
    pub fn grants_sql(&self, role: &str) -> String {
        self.schema.grants_sql(role)
    }

    /// The two statements of an uncontended mutex hold as dlm sends them (prepared, one
    /// round trip each): the acquisition (`$1` the name, `$2` the owner, `$3` the lease
    /// in milliseconds as `int8`; a row back is a grant) and the release (`$1` the
    /// name, `$2` the owner, `$3` the sender's id in notifications). For reading
    /// `pg_stat_statements`, and for comparisons: `dlm-bench` runs them with a minimal
    /// client to tell the client's cost from the server's. The text is this version's:
    /// it changes with the schema, so nothing should depend on it beyond that.
    pub fn mutex_statements(&self) -> (&str, &str) {
        (&self.stmts.acquire, &self.stmts.release)
    }

    /// The lease `ttl` asked for at `start` gives its holder: shortened by the drift
    /// allowance.
    pub(crate) fn lease_from(&self, start: Instant, ttl: Duration) -> Result<Lease, BackendError> {
        let drift = ttl.mul_f64(self.drift_factor) + Duration::from_millis(2);
        ttl.checked_sub(drift)
            .and_then(|d| start.checked_add(d))
            .map(Lease::new)
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    "the lease is too short for the drift allowance",
                )
                .never_sent()
            })
    }

    /// Runs `f` on a lent connection, once the schema is there.
    pub(crate) fn call<T>(
        &self,
        f: impl FnOnce(&mut Conn, &Statements, &How<'_>) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut conn = self.pool.get()?;
        self.schema
            .ensure(&mut conn, &self.stmts, self.pool.io_timeout())?;
        let how = How {
            timeout: self.pool.io_timeout(),
            prepare: &self.prepare,
        };
        let answer = f(&mut conn, &self.stmts, &how);
        answer.map_err(|e| self.schema.after(e))
    }

    /// Sweeps expired rows if the last sweep is a minute old (errors only logged).
    fn maybe_sweep(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.swept.load(Ordering::Relaxed);
        let every = SWEEP_EVERY.as_millis() as u64;
        if now < last + every
            || self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if let Err(e) = self.call(|c, s, t| c.query(&s.sweep, &[], t)) {
            log::debug!("dlm-postgres: sweeping expired rows failed: {e}");
        }
    }

    /// One attempt at the mutex: the one statement that inserts or takes the name's row
    /// (and, when its lease may outlast the durable mark as last learned, the mark raised
    /// before the grant is answered), else `acquire_slow` (a new epoch, or held: when to look again).
    fn acquire_mutex(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let owner = owner.encoded();
        let (name_s, owner_s, ms) = (name.as_str(), owner.as_str(), millis(ttl));
        let mut start = Instant::now();
        self.call(|c, s, t| {
            let params: &[(&(dyn ToSql + Sync), Type)] = &[
                (&name_s, Type::TEXT),
                (&owner_s, Type::TEXT),
                (&ms, Type::INT8),
            ];
            let mut wait = None;
            // A second go only when `acquire_slow` says the name may be free now (it
            // opened an epoch that holds nothing back, or the row was freed meanwhile).
            for _ in 0..2 {
                start = Instant::now();
                let rows = c.query(&s.acquire, params, t)?;
                if let Some(row) = rows.first() {
                    let fence: i64 = row.get(0);
                    let ends: Option<i64> = row.get(1);
                    let epoch: Option<i64> = row.get(2);
                    let covered = ends
                        .zip(epoch)
                        .is_some_and(|(ends, epoch)| self.mark.lock().covers(epoch, ends));
                    if !covered {
                        // The grant is made: a failure now is the grant's, which the
                        // front undoes (the error must not say "never sent").
                        let rows = c.query(&s.keep, &[(&ms, Type::INT8)], t).map_err(|e| {
                            BackendError::new(
                                e.kind(),
                                format!("the grant's durable mark: {}", e.message()),
                            )
                        })?;
                        // Learned only when the server that answered is in the grant's
                        // epoch (a pooler may have sent this statement elsewhere).
                        let answer = rows.first().and_then(|r| {
                            let until = r.try_get::<_, Option<i64>>(0).ok().flatten()?;
                            let at = r.try_get::<_, Option<i64>>(1).ok().flatten()?;
                            Some((until, at))
                        });
                        if let (Some(epoch), Some((until, at))) = (epoch, answer)
                            && at == epoch
                        {
                            self.mark.lock().learned(epoch, until);
                        }
                    }
                    return Ok(Acquire::Acquired(
                        self.lease_from(start, ttl)?.with_fence(token(fence)),
                    ));
                }
                let rows = c.query(&s.acquire_slow, params, t)?;
                let row = rows.first().ok_or_else(no_row)?;
                wait = row.get::<_, Option<i64>>(2);
                if wait != Some(0) {
                    break;
                }
            }
            Ok(Acquire::Held {
                retry_after: wait.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
        })
    }
}

pub(crate) fn no_row() -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, "the server answered no row")
}

impl LockBackend for PostgresBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.acquire_mutex(name, owner, ttl)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let owner = owner.encoded();
        let (name_s, owner_s, ms) = (name.as_str(), owner.as_str(), millis(ttl));
        let mut start = Instant::now();
        let rows = self.call(|c, s, t| {
            start = Instant::now();
            c.query(
                &s.extend,
                &[
                    (&name_s, Type::TEXT),
                    (&owner_s, Type::TEXT),
                    (&ms, Type::INT8),
                ],
                t,
            )
        })?;
        let fence: Option<i64> = rows.first().ok_or_else(no_row)?.get(0);
        fence
            .map(|f| Ok(self.lease_from(start, ttl)?.with_fence(token(f))))
            .transpose()
    }

    fn extend_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        if renewals.is_empty() {
            return;
        }
        let kinds: Vec<i8> = renewals.iter().map(|r| kind_of(r.claim) as i8).collect();
        let names: Vec<&str> = renewals.iter().map(|r| r.name.as_str()).collect();
        let owners: Vec<_> = renewals.iter().map(|r| r.owner.encoded()).collect();
        let owners: Vec<&str> = owners.iter().map(|o| o.as_str()).collect();
        let ttls: Vec<i64> = renewals.iter().map(|r| millis(r.ttl)).collect();
        let mut start = Instant::now();
        let answer = self.call(|c, s, t| {
            start = Instant::now();
            c.query(
                &s.extend_many,
                &[
                    (&kinds, Type::CHAR_ARRAY),
                    (&names, Type::TEXT_ARRAY),
                    (&owners, Type::TEXT_ARRAY),
                    (&ttls, Type::INT8_ARRAY),
                ],
                t,
            )
        });
        match answer {
            Ok(rows) => {
                let mut tokens = vec![None; renewals.len()];
                for row in rows {
                    let i: i32 = row.get(0);
                    let fence: i64 = row.get(1);
                    if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| tokens.get_mut(i))
                    {
                        *slot = Some(fence);
                    }
                }
                for (i, (r, fence)) in renewals.iter().zip(tokens).enumerate() {
                    let outcome = fence
                        .map(|f| Ok(self.lease_from(start, r.ttl)?.with_fence(token(f))))
                        .transpose();
                    renewed(i, outcome);
                }
            }
            Err(e) => {
                for i in 0..renewals.len() {
                    renewed(i, Err(e.duplicate()));
                }
            }
        }
        self.maybe_sweep();
    }

    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let owner = owner.encoded();
        let (name_s, owner_s) = (name.as_str(), owner.as_str());
        let rows = self.call(|c, s, t| {
            c.query(
                &s.fence,
                &[(&name_s, Type::TEXT), (&owner_s, Type::TEXT)],
                t,
            )
        })?;
        let fence: Option<i64> = rows.first().ok_or_else(no_row)?.get(0);
        Ok(fence.map(token))
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let owner = owner.encoded();
        let (name_s, owner_s) = (name.as_str(), owner.as_str());
        let sender = self.hints.sender.as_str();
        let rows = self.call(|c, s, t| {
            c.query(
                &s.release,
                &[
                    (&name_s, Type::TEXT),
                    (&owner_s, Type::TEXT),
                    (&sender, Type::TEXT),
                ],
                t,
            )
        })?;
        let released = rows.first().is_some_and(|r| r.get::<_, bool>(0));
        self.hints.released(b'm', name_s);
        self.maybe_sweep();
        Ok(released)
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let name_s = name.as_str();
        let sender = self.hints.sender.as_str();
        let rows = self.call(|c, s, t| {
            c.query(
                &s.force_release,
                &[(&name_s, Type::TEXT), (&sender, Type::TEXT)],
                t,
            )
        })?;
        let released: bool = rows.first().ok_or_else(no_row)?.get(0);
        self.hints.released(b'm', name_s);
        Ok(released)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let name_s = name.as_str();
        let rows = self.call(|c, s, t| c.query(&s.inspect, &[(&name_s, Type::TEXT)], t))?;
        let ms: Option<i64> = rows.first().ok_or_else(no_row)?.get(0);
        Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        self.hints.subscribe(b'm', name.as_str())
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.hints.wake_pending(name.as_str())
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn supports(&self, claim: Claim) -> bool {
        every_hold_kind(claim)
    }

    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        self.group_acquire(request)
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let mut outcome = None;
        self.extend_many(&[Renewal::new(name, claim, owner, ttl)], &mut |_, o| {
            outcome = Some(o)
        });
        outcome.unwrap_or_else(|| Err(no_row()))
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.group_release(name, claim, owner)
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        self.group_fence(name, claim, owner)
    }

    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.hints.subscribe(kind_of(claim), name.as_str())
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.group_relabel(name, claim, owner, label)
    }

    /// The group's waiters are all woken by each notification already; a one-permit
    /// semaphore announces its grants, releases and relabels whether or not anyone waits.
    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.watch_group(name, claim)
    }

    fn supports_elections(&self) -> bool {
        true
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.group_downgrade(name, writer, reader, ttl)
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.group_force_release(name, claim)
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.group_inspect(name, claim)
    }
}

#[cfg(test)]
mod tests {
    use super::Mark;

    #[test]
    fn a_mark_covers_leases_of_its_own_epoch_only() {
        let mut mark = Mark::UNKNOWN;
        assert!(!mark.covers(5, 0));
        mark.learned(5, 100);
        assert!(mark.covers(5, 100));
        assert!(!mark.covers(5, 101));
        assert!(!mark.covers(6, 10), "another epoch's mark covers nothing");
        // It only goes up within an epoch (a slower answer comes late)...
        mark.learned(5, 90);
        assert!(mark.covers(5, 100));
        // ...and is replaced by another epoch's, even a lower one.
        mark.learned(6, 50);
        assert!(mark.covers(6, 50));
        assert!(!mark.covers(6, 51));
        assert!(!mark.covers(5, 60));
    }
}
