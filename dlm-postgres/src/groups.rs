//! The semaphore and the read-write lock (and an election, a one-permit semaphore) on
//! [`PostgresBackend`]: each call one call of the schema's group functions (`sql.rs`),
//! every holder a row of `holds` under its resource's row of `groups`. The trait's group
//! methods in `backend.rs` call these.

use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holder, Holders,
    Lease, LockName, OwnerToken, writer_mark,
};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use crate::backend::{PostgresBackend, kind_of, millis, no_row, token};
use crate::sql::Statements;

impl PostgresBackend {
    pub(crate) fn group_acquire(
        &self,
        request: &GroupRequest<'_>,
    ) -> Result<Acquire, BackendError> {
        let owner = request.owner.encoded();
        let name_s = request.name.as_str();
        let owner_s = owner.as_str();
        let kind = kind_of(request.claim) as i8;
        let write = request.claim == Claim::Write;
        let permits: i32 = match request.claim {
            Claim::Permit { permits } => i32::try_from(permits).unwrap_or(i32::MAX),
            _ => 0,
        };
        let ms = millis(request.ttl);
        let mark = millis(writer_mark(request.ttl));
        let label = request.label;
        let sender = self.hints.sender.as_str();
        let mut start = Instant::now();
        let rows = self.call(|c, s, t| {
            start = Instant::now();
            c.query(
                &s.acquire_group,
                &[
                    (&name_s, Type::TEXT),
                    (&kind, Type::CHAR),
                    (&write, Type::BOOL),
                    (&permits, Type::INT4),
                    (&owner_s, Type::TEXT),
                    (&ms, Type::INT8),
                    (&mark, Type::INT8),
                    (&label, Type::TEXT),
                    (&sender, Type::TEXT),
                ],
                t,
            )
        })?;
        let row = rows.first().ok_or_else(no_row)?;
        let granted: bool = row.get(0);
        if let Some(held_with) = row.get::<_, Option<i32>>(3) {
            return Err(BackendError::new(
                BackendErrorKind::Conflict,
                format!(
                    "the semaphore {} is held with {held_with} permits, not {permits}",
                    request.name
                ),
            )
            .never_sent());
        }
        if granted {
            if permits == 1 {
                // An election's new leader: this backend's observers are told now (the
                // server's notification skips the backend that sent it).
                self.hints.released(kind as u8, name_s);
            }
            let fence: i64 = row.get(1);
            Ok(Acquire::Acquired(
                self.lease_from(start, request.ttl)?
                    .with_fence(token(fence)),
            ))
        } else {
            let wait: Option<i64> = row.get(2);
            Ok(Acquire::Held {
                retry_after: wait.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
        }
    }

    pub(crate) fn group_release(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        let kind = kind_of(claim);
        let sender = self.hints.sender.as_str();
        let rows = self.owner_call(
            |s| &s.release_group,
            name,
            kind,
            owner,
            &[(&sender, Type::TEXT)],
        )?;
        let released: bool = rows.first().ok_or_else(no_row)?.get(0);
        self.hints.released(kind, name.as_str());
        Ok(released)
    }

    pub(crate) fn group_fence(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let rows = self.owner_call(|s| &s.fence_group, name, kind_of(claim), owner, &[])?;
        let fence: Option<i64> = rows.first().ok_or_else(no_row)?.get(0);
        Ok(fence.map(token))
    }

    pub(crate) fn group_relabel(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        let kind = kind_of(claim);
        let sender = self.hints.sender.as_str();
        let extra: [(&(dyn ToSql + Sync), Type); 2] = [(&label, Type::TEXT), (&sender, Type::TEXT)];
        let rows = self.owner_call(|s| &s.relabel_group, name, kind, owner, &extra)?;
        let relabelled: bool = rows.first().ok_or_else(no_row)?.get(0);
        if relabelled {
            // This backend's observers now; the server's notification skips its sender.
            self.hints.released(kind, name.as_str());
        }
        Ok(relabelled)
    }

    /// Calls the group function `stmt` picks with (name, kind, owner) and then `extra`:
    /// a release, a relabel, a token's look-up.
    fn owner_call(
        &self,
        stmt: fn(&Statements) -> &String,
        name: &LockName,
        kind: u8,
        owner: &OwnerToken,
        extra: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, BackendError> {
        let owner = owner.encoded();
        let (name_s, owner_s, kind_c) = (name.as_str(), owner.as_str(), kind as i8);
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&name_s, Type::TEXT),
            (&kind_c, Type::CHAR),
            (&owner_s, Type::TEXT),
        ];
        params.extend(extra.iter().cloned());
        self.call(|c, s, t| c.query(stmt(s), &params, t))
    }

    pub(crate) fn group_downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let (writer, reader) = (writer.encoded(), reader.encoded());
        let (name_s, writer_s, reader_s) = (name.as_str(), writer.as_str(), reader.as_str());
        let ms = millis(ttl);
        let sender = self.hints.sender.as_str();
        let mut start = Instant::now();
        let rows = self.call(|c, s, t| {
            start = Instant::now();
            c.query(
                &s.downgrade,
                &[
                    (&name_s, Type::TEXT),
                    (&writer_s, Type::TEXT),
                    (&reader_s, Type::TEXT),
                    (&ms, Type::INT8),
                    (&sender, Type::TEXT),
                ],
                t,
            )
        })?;
        let fence: Option<i64> = rows.first().ok_or_else(no_row)?.get(0);
        if fence.is_some() {
            self.hints.released(b'r', name_s);
        }
        fence
            .map(|f| Ok(self.lease_from(start, ttl)?.with_fence(token(f))))
            .transpose()
    }

    pub(crate) fn group_force_release(
        &self,
        name: &LockName,
        claim: Claim,
    ) -> Result<bool, BackendError> {
        let name_s = name.as_str();
        let kind = kind_of(claim);
        let kind_c = kind as i8;
        let sender = self.hints.sender.as_str();
        let rows = self.call(|c, s, t| {
            c.query(
                &s.force_release_group,
                &[
                    (&name_s, Type::TEXT),
                    (&kind_c, Type::CHAR),
                    (&sender, Type::TEXT),
                ],
                t,
            )
        })?;
        let released: bool = rows.first().ok_or_else(no_row)?.get(0);
        self.hints.released(kind, name_s);
        Ok(released)
    }

    pub(crate) fn group_inspect(
        &self,
        name: &LockName,
        claim: Claim,
    ) -> Result<Holders, BackendError> {
        let name_s = name.as_str();
        let kind = kind_of(claim) as i8;
        let rows = self.call(|c, s, t| {
            c.query(
                &s.inspect_group,
                &[(&name_s, Type::TEXT), (&kind, Type::CHAR)],
                t,
            )
        })?;
        let mut permits = None;
        let holders = rows
            .iter()
            .map(|row| {
                let write: bool = row.get(0);
                let ms: i64 = row.get(1);
                let label: Option<String> = row.get(2);
                let held_with: i32 = row.get(3);
                let claim = match claim {
                    Claim::Permit { .. } => {
                        let n = u32::try_from(held_with).unwrap_or(0);
                        permits = Some(n);
                        Claim::Permit { permits: n }
                    }
                    _ if write => Claim::Write,
                    _ => Claim::Read,
                };
                let fence: i64 = row.get(4);
                Holder::new(claim, Duration::from_millis(ms.max(0) as u64), label)
                    .with_token(Some(token(fence)))
            })
            .collect();
        Ok(Holders::new(permits, holders))
    }
}
