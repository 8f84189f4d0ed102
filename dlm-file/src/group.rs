//! Semaphores and read-write locks: holds of a group of holders, each on kernel locks of
//! the directory's files.
//!
//! - **A semaphore** `NAME` of `N` permits is the file `s.NAME`, which every holder of a
//!   permit locks shared and which holds the permit count, and `N` slot files
//!   `p.NAME.0` .. `p.NAME.N-1`: a permit is an exclusive lock of a free slot. The count
//!   is written under an exclusive lock of `s.NAME`, which only an acquirer that finds no
//!   holder gets; every other acquirer reads it under its shared lock and is refused
//!   with `Conflict` when it asked for another count.
//! - **A read-write lock** `NAME` is the file `r.NAME`, locked shared by its readers and
//!   exclusively by its writer; the writer file `x.NAME`, locked by the writer from the
//!   attempt that gets in to the end of its hold (one writer tries at a time); the mark
//!   `w.NAME`, locked by a writer refused because of readers, until it gets in or its mark
//!   ends (new readers look at it and wait); and each reader's record `q.NAME.I`. A
//!   downgrade turns the writer's lock of `r.NAME` into a shared one while it still holds
//!   the writer file, so no other writer can get in between.
//! - **Records**: each hold's own file (its slot, its reader's record, the writer file)
//!   holds its lease end, its fencing token and its label, for inspection. The file is
//!   open for writing while held, so the end of the hold is an event of the directory,
//!   whatever ended it: a release removes the file, a process that dies closes it.
//! - **Attempts** open files for reading only: a refused attempt closes them without an
//!   event, so waiters do not wake each other.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holder, Holders, LockName,
    OwnerToken, WRITER_MARK, writer_mark,
};
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread, pwrite};

use crate::dir::{Attempted, Dir, Identity};
use crate::hints::{GroupKind, SETTLE_LOOK_AGAIN};
use crate::state::{State, flock_error, read_left, until_bytes, write_until};

/// The largest permit count a semaphore of this backend takes: a refused attempt tries
/// every permit's file.
pub(crate) const MAX_PERMITS: u32 = 1024;

/// The most readers a read-write lock of this backend admits at once (each has a record
/// file, found by trying them in turn).
const MAX_READERS: u32 = 4096;

/// How long a refused attempt waits for an event before it looks again, when the
/// holders' lease ends are not known.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// A hold's key in this process's table: the resource and the owner.
pub(crate) type HoldKey = (GroupKind, LockName, OwnerToken);

/// A file locked by this process, still at its path when it was locked.
pub(crate) struct Locked {
    file: String,
    fd: OwnedFd,
    id: Identity,
}

/// One group hold of this process.
pub(crate) struct GroupHold {
    claim: Claim,
    /// `s.NAME` (shared), or `r.NAME` (shared by a reader, exclusive for the writer).
    head: Locked,
    /// The hold's own file, locked exclusively: its slot, its reader's record, the
    /// writer file.
    own: Locked,
    /// `own`, open for writing: the hold's record.
    record: OwnedFd,
    pub(crate) until: Instant,
    token: Option<FencingToken>,
    label: Option<String>,
}

/// A writer's mark: the mark file of a read-write lock, held while the writer waits.
pub(crate) struct Mark {
    gate: Locked,
    record: OwnedFd,
    pub(crate) until: Instant,
}

/// What an attempt at a group hold came to.
pub(crate) enum Outcome {
    /// Held until `until`, with its token if one was drawn.
    Granted {
        until: Instant,
        token: Option<FencingToken>,
    },
    /// Refused: look again after `retry`; `mark` is the end of the mark a refused writer
    /// left (the lease thread ends it then).
    Refused {
        retry: Duration,
        mark: Option<Instant>,
    },
}

fn refused(retry: Duration) -> Outcome {
    Outcome::Refused { retry, mark: None }
}

pub(crate) fn kind_of(claim: Claim) -> GroupKind {
    match claim {
        Claim::Permit { .. } => GroupKind::Semaphore,
        _ => GroupKind::ReadWrite,
    }
}

fn head_file(kind: GroupKind, name: &LockName) -> String {
    match kind {
        GroupKind::Semaphore => format!("s.{name}", name = name.as_str()),
        GroupKind::ReadWrite => format!("r.{name}", name = name.as_str()),
    }
}

fn slot_prefix(kind: GroupKind, name: &LockName) -> String {
    match kind {
        GroupKind::Semaphore => format!("p.{name}.", name = name.as_str()),
        GroupKind::ReadWrite => format!("q.{name}.", name = name.as_str()),
    }
}

/// A read-write lock's mark file: locked by a writer that waits for readers to leave.
fn mark_file(name: &LockName) -> String {
    format!("w.{name}", name = name.as_str())
}

/// A read-write lock's writer file: locked by its writer, from the attempt that gets in
/// to the end of its hold; holds the writer's record.
fn writer_file(name: &LockName) -> String {
    format!("x.{name}", name = name.as_str())
}

/// The record of a hold: its lease end (the monotonic clock in ns, as the mutex writes
/// it), its token (0: none) and its label.
fn write_record(fd: &OwnedFd, until: Instant, token: Option<FencingToken>, label: Option<&str>) {
    let label = label.unwrap_or("").as_bytes();
    let label = &label[..label.len().min(usize::from(u16::MAX))];
    let mut buf = Vec::with_capacity(18 + label.len());
    buf.extend_from_slice(&until_bytes(until));
    buf.extend_from_slice(&token.map_or(0, FencingToken::get).to_le_bytes());
    buf.extend_from_slice(&u16::try_from(label.len()).unwrap_or(0).to_le_bytes());
    buf.extend_from_slice(label);
    if let Err(e) = pwrite(fd, &buf, 0) {
        log::debug!("dlm-file: cannot write a hold's record: {e}");
    }
}

fn write_token(fd: &OwnedFd, token: FencingToken) {
    if let Err(e) = pwrite(fd, &token.get().to_le_bytes(), 8) {
        log::debug!("dlm-file: cannot write a hold's token: {e}");
    }
}

/// A record as another process wrote it: its remaining lease (zero when past), token
/// and label. `None`: not written yet (a hold being granted).
fn read_record(fd: &OwnedFd) -> Option<(Duration, Option<FencingToken>, Option<String>)> {
    let mut buf = vec![0u8; 18 + dlm_core::backend::MAX_LABEL_LEN];
    let n = pread(fd, &mut buf, 0).unwrap_or(0);
    if n < 18 {
        return None;
    }
    let left = read_left(fd).unwrap_or_default();
    let token = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let len = usize::from(u16::from_le_bytes([buf[16], buf[17]]));
    let label = (len > 0 && 18 + len <= n)
        .then(|| String::from_utf8_lossy(&buf[18..18 + len]).into_owned());
    Some((left, (token != 0).then(|| FencingToken::new(token)), label))
}

/// One attempt at a kernel lock (`op`, non-blocking) of `file`, made if missing: the file
/// locked and still at its path, or refused (the lease end the holder wrote, if any).
fn lock_at(
    dir: &Dir,
    file: &str,
    op: FlockOperation,
) -> Result<Result<Locked, Option<Duration>>, BackendError> {
    // A file removed by its holder's release between our open and our lock is a dead
    // inode: lock the new one. Each pass follows a release: a few are plenty.
    for _ in 0..8 {
        match dir
            .lock(file, op, true, false)?
            .expect("opened with create")
        {
            Attempted::Locked((fd, id)) => {
                return Ok(Ok(Locked {
                    file: file.to_owned(),
                    fd,
                    id,
                }));
            }
            Attempted::Refused((fd, _)) => return Ok(Err(read_left(&fd))),
            Attempted::Unlinked => {}
        }
    }
    Ok(Err(None))
}

/// `locked`'s file open for writing (the hold's record), if it is still the file locked.
fn open_record(dir: &Dir, locked: &Locked) -> Result<Option<OwnedFd>, BackendError> {
    Ok(dir
        .open_with(&locked.file, false, true)?
        .filter(|(_, id)| *id == locked.id)
        .map(|(fd, _)| fd))
}

/// A first free slot among `files`, locked, with its record open.
fn take_slot(
    dir: &Dir,
    files: impl Iterator<Item = String>,
) -> Result<Result<(Locked, OwnedFd), Option<Duration>>, BackendError> {
    let mut soonest: Option<Duration> = None;
    for file in files {
        match lock_at(dir, &file, FlockOperation::NonBlockingLockExclusive)? {
            Ok(slot) => {
                if let Some(record) = open_record(dir, &slot)? {
                    return Ok(Ok((slot, record)));
                }
            }
            Err(left) => {
                // No lease end written: a hold being granted, or an inspection's look at
                // that moment (neither makes an event): look again soon.
                let left = left.unwrap_or(SETTLE_LOOK_AGAIN * 5);
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
            }
        }
    }
    Ok(Err(soonest))
}

impl State {
    fn linked(&self, hold: &GroupHold) -> Result<bool, BackendError> {
        Ok(self.dir.identity_of(&hold.head.file)? == Some(hold.head.id)
            && self.dir.identity_of(&hold.own.file)? == Some(hold.own.id))
    }

    /// One attempt at `request`'s hold.
    pub(crate) fn try_group(&self, request: &GroupRequest<'_>) -> Result<Outcome, BackendError> {
        let kind = kind_of(request.claim);
        let key: HoldKey = (kind, request.name.clone(), *request.owner);
        let now = Instant::now();
        let until = now + request.ttl;
        {
            let mut groups = self.groups.lock();
            if let Some(h) = groups.get_mut(&key) {
                // Ours already (a retry after a lost reply): refreshed.
                if h.until > now && self.linked(h)? {
                    h.until = until;
                    write_until(&h.record, until);
                    return Ok(Outcome::Granted {
                        until,
                        token: h.token,
                    });
                }
                let old = groups.remove(&key).expect("present");
                drop(groups);
                self.end_group(&key, old);
            }
        }
        let taken = match request.claim {
            Claim::Permit { permits } => self.take_permit(request.name, permits)?,
            Claim::Read => self.take_read(request.name)?,
            _ => self.take_write(request.name, request.ttl)?,
        };
        let (head, own, record) = match taken {
            Ok(parts) => parts,
            Err(Outcome::Refused { retry, mark })
                if self
                    .group_hints
                    .recently_hinted(&(kind, request.name.clone())) =>
            {
                return Ok(Outcome::Refused {
                    retry: retry.min(SETTLE_LOOK_AGAIN),
                    mark,
                });
            }
            Err(outcome) => return Ok(outcome),
        };
        let mut token = None;
        if request.fenced && self.fencing {
            match self.tokens.draw(&self.dir) {
                Ok(t) => token = Some(t),
                // The acquisition stands; the token is drawn when it is read.
                Err(e) => log::debug!("dlm-file: drawing a token with a grant: {e}"),
            }
        }
        write_record(&record, until, token, request.label);
        if kind == GroupKind::Semaphore {
            // An election's observers in other processes learn of the new holder.
            self.touch(&own);
        }
        let hold = GroupHold {
            claim: request.claim,
            head,
            own,
            record,
            until,
            token,
            label: request.label.map(str::to_owned),
        };
        self.groups.lock().insert(key.clone(), hold);
        self.group_hints.notify(&(kind, request.name.clone()));
        Ok(Outcome::Granted { until, token })
    }

    /// An event of `file`'s directory watch: opened for writing and closed.
    fn touch(&self, locked: &Locked) {
        let _ = self.dir.open_with(&locked.file, false, true);
    }

    /// `s.NAME` locked shared, holding `permits` as its count; `Err`: refused.
    fn take_permit(
        &self,
        name: &LockName,
        permits: u32,
    ) -> Result<Result<(Locked, Locked, OwnedFd), Outcome>, BackendError> {
        let Some(head) = self.counted_head(name, permits)? else {
            return Ok(Err(refused(SETTLE_LOOK_AGAIN)));
        };
        let prefix = slot_prefix(GroupKind::Semaphore, name);
        match take_slot(&self.dir, (0..permits).map(|i| format!("{prefix}{i}")))? {
            Ok((slot, record)) => Ok(Ok((head, slot, record))),
            Err(soonest) => Ok(Err(refused(soonest.unwrap_or(LOOK_AGAIN)))),
        }
    }

    /// The semaphore's count file locked shared, holding `permits`: written when no
    /// permit is held (its exclusive lock is free), read otherwise. `None`: another
    /// acquirer is writing it right now.
    fn counted_head(&self, name: &LockName, permits: u32) -> Result<Option<Locked>, BackendError> {
        let file = head_file(GroupKind::Semaphore, name);
        for _ in 0..8 {
            let (fd, id) = self
                .dir
                .open_with(&file, true, false)?
                .expect("opened with create");
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    // Nobody holds a permit: the count is this acquirer's.
                    if self.dir.identity_of(&file)? != Some(id) {
                        continue;
                    }
                    let Some((w, _)) = self
                        .dir
                        .open_with(&file, false, true)?
                        .filter(|(_, wid)| *wid == id)
                    else {
                        continue;
                    };
                    pwrite(&w, &permits.to_le_bytes(), 0).map_err(|e| {
                        BackendError::new(BackendErrorKind::Other, format!("{file}: write: {e}"))
                    })?;
                    drop(w);
                    // Not atomic: another acquirer may write its count in between, which
                    // the read below sees.
                    match flock(&fd, FlockOperation::NonBlockingLockShared) {
                        Ok(()) => {}
                        Err(Errno::WOULDBLOCK | Errno::INTR) => continue,
                        Err(e) => return Err(flock_error(e)),
                    }
                }
                Err(Errno::WOULDBLOCK) => match flock(&fd, FlockOperation::NonBlockingLockShared) {
                    Ok(()) => {}
                    Err(Errno::WOULDBLOCK) => return Ok(None),
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(flock_error(e)),
                },
                Err(Errno::INTR) => continue,
                Err(e) => return Err(flock_error(e)),
            }
            if self.dir.identity_of(&file)? != Some(id) {
                continue;
            }
            let mut buf = [0u8; 4];
            if pread(&fd, &mut buf, 0).ok() != Some(4) {
                continue;
            }
            let held_with = u32::from_le_bytes(buf);
            if held_with != permits {
                if !self.any_permit_held(name, held_with)? {
                    // The count of a semaphore nobody holds any more, kept by the shared
                    // lock of another acquirer passing by: look again soon.
                    return Ok(None);
                }
                return Err(BackendError::new(
                    BackendErrorKind::Conflict,
                    format!(
                        "the semaphore {} is held with {held_with} permits, not {permits}",
                        name.as_str()
                    ),
                ));
            }
            return Ok(Some(Locked { file, fd, id }));
        }
        Ok(None)
    }

    /// Whether any of the first `count` permits of the semaphore `name` is held.
    fn any_permit_held(&self, name: &LockName, count: u32) -> Result<bool, BackendError> {
        let prefix = slot_prefix(GroupKind::Semaphore, name);
        for i in 0..count.min(MAX_PERMITS) {
            let Some((fd, _)) = self.dir.open_with(&format!("{prefix}{i}"), false, false)? else {
                continue;
            };
            match flock(&fd, FlockOperation::NonBlockingLockShared) {
                Ok(()) => {
                    let _ = flock(&fd, FlockOperation::Unlock);
                }
                Err(Errno::WOULDBLOCK) => return Ok(true),
                Err(e) => return Err(flock_error(e)),
            }
        }
        Ok(false)
    }

    /// Whether a writer waits for the readers of `name` to leave (it holds the mark file):
    /// how long its mark lasts.
    fn gate_closed(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let Some((fd, _)) = self.dir.open_with(&mark_file(name), false, false)? else {
            return Ok(None);
        };
        match flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                // Left by a writer whose process ended while it waited.
                drop(fd);
                self.sweep_writer_files(name);
                Ok(None)
            }
            Err(Errno::WOULDBLOCK) => Ok(Some(read_left(&fd).unwrap_or(WRITER_MARK))),
            Err(Errno::INTR) => Ok(Some(SETTLE_LOOK_AGAIN)),
            Err(e) => Err(flock_error(e)),
        }
    }

    fn take_read(
        &self,
        name: &LockName,
    ) -> Result<Result<(Locked, Locked, OwnedFd), Outcome>, BackendError> {
        if let Some(left) = self.gate_closed(name)? {
            // A writer waits or writes: new readers wait behind it.
            return Ok(Err(refused(left.min(WRITER_MARK))));
        }
        let head = match lock_at(
            &self.dir,
            &head_file(GroupKind::ReadWrite, name),
            FlockOperation::NonBlockingLockShared,
        )? {
            Ok(head) => head,
            Err(_) => return Ok(Err(refused(LOOK_AGAIN))),
        };
        match self.reader_slot(name)? {
            Some((slot, record)) => Ok(Ok((head, slot, record))),
            None => Ok(Err(refused(LOOK_AGAIN))),
        }
    }

    fn reader_slot(&self, name: &LockName) -> Result<Option<(Locked, OwnedFd)>, BackendError> {
        let prefix = slot_prefix(GroupKind::ReadWrite, name);
        Ok(take_slot(&self.dir, (0..MAX_READERS).map(|i| format!("{prefix}{i}")))?.ok())
    }

    fn take_write(
        &self,
        name: &LockName,
        ttl: Duration,
    ) -> Result<Result<(Locked, Locked, OwnedFd), Outcome>, BackendError> {
        let mark_for = writer_mark(ttl);
        // The mark: this process's (a writer of it was refused before: every attempt has
        // an owner token of its own), or a new one if no other process's writer marks (a
        // reader's look at the mark file can refuse it for a moment: the next attempt
        // marks). A write granted to a writer of this process ends it.
        let mut mark = self.marks.lock().remove(name);
        if let Some(m) = &mark
            && self.dir.identity_of(&m.gate.file)? != Some(m.gate.id)
        {
            // Removed under it (a forced release): it marks nothing any more.
            mark = None;
        }
        if mark.is_none()
            && let Ok(gate) = lock_at(
                &self.dir,
                &mark_file(name),
                FlockOperation::NonBlockingLockExclusive,
            )?
            && let Some(record) = open_record(&self.dir, &gate)?
        {
            mark = Some(Mark {
                gate,
                record,
                until: Instant::now(),
            });
        }
        let refused = |mark: Option<Mark>, left: Option<Duration>| {
            let Some(mut mark) = mark else {
                // Not marked: come back soon to mark.
                return Err(refused(
                    left.unwrap_or(LOOK_AGAIN).min(SETTLE_LOOK_AGAIN * 5),
                ));
            };
            // Others inside: the mark stays while this writer comes back before it ends.
            mark.until = Instant::now() + mark_for;
            write_until(&mark.record, mark.until);
            let until = mark.until;
            self.marks.lock().insert(name.clone(), mark);
            Err(Outcome::Refused {
                retry: left.unwrap_or(mark_for).min(mark_for / 3),
                mark: Some(until),
            })
        };
        // The writers' file: one writer at a time, from its attempt to the end of its hold.
        let writer = match lock_at(
            &self.dir,
            &writer_file(name),
            FlockOperation::NonBlockingLockExclusive,
        )? {
            Ok(writer) => writer,
            Err(left) => return Ok(refused(mark, left)),
        };
        let head = match lock_at(
            &self.dir,
            &head_file(GroupKind::ReadWrite, name),
            FlockOperation::NonBlockingLockExclusive,
        )? {
            Ok(head) => head,
            Err(_) => return Ok(refused(mark, None)),
        };
        let Some(record) = open_record(&self.dir, &writer)? else {
            return Ok(refused(mark, None));
        };
        if let Some(mark) = mark {
            self.end_mark(name, mark);
        }
        Ok(Ok((head, writer, record)))
    }

    /// Ends `hold` (out of the table): its own file removed while it still names the
    /// locked one, then closed; the head file removed by the last holder (whose shared
    /// lock turns exclusive) or the writer; local waiters woken. Whether its files were
    /// still the hold's.
    pub(crate) fn end_group(&self, key: &HoldKey, hold: GroupHold) -> bool {
        let linked = |l: &Locked| {
            self.dir
                .identity_of(&l.file)
                .map(|at| at == Some(l.id))
                .unwrap_or(false)
        };
        // The head first, so that the events of the hold's own file (which wake the
        // waiters) come once its lock is gone. The last holder (its shared lock turned
        // exclusive; the writer's is) removes it, if the path still names it once the
        // lock is exclusive.
        // Whether the hold was intact: looked at while its lock is still held (a failed
        // conversion drops it, and the last holder may then remove the file at once).
        let head = linked(&hold.head);
        let last = hold.claim == Claim::Write
            || flock(&hold.head.fd, FlockOperation::NonBlockingLockExclusive).is_ok();
        if last
            && (if hold.claim == Claim::Write {
                head
            } else {
                linked(&hold.head)
            })
            && let Err(e) = self.dir.remove(&hold.head.file)
        {
            log::warn!("dlm-file: {e}");
        }
        drop(hold.head);
        let own = linked(&hold.own);
        if own && let Err(e) = self.dir.remove(&hold.own.file) {
            log::warn!("dlm-file: {e}");
        }
        drop(hold.record);
        drop(hold.own);
        if last && hold.claim == Claim::Read {
            self.sweep_writer_files(&key.1);
        }
        self.group_hints.notify(&(key.0, key.1.clone()));
        own && head
    }

    /// Removes the mark and writer files of `name` that nobody holds: left by writers
    /// refused because of readers (the writer file) and by writers whose process ended
    /// while they waited (the mark; a process's exit closes its files but leaves them).
    fn sweep_writer_files(&self, name: &LockName) {
        for file in [mark_file(name), writer_file(name)] {
            if let Ok(Some((fd, id))) = self.dir.open_with(&file, false, false)
                && flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok()
            {
                self.remove_locked(Locked { file, fd, id });
            }
        }
    }

    /// Removes `locked`'s file if it is still the one locked, then closes it.
    fn remove_locked(&self, locked: Locked) {
        if self.dir.identity_of(&locked.file).ok().flatten() == Some(locked.id)
            && let Err(e) = self.dir.remove(&locked.file)
        {
            log::warn!("dlm-file: {e}");
        }
    }

    /// Ends a writer's mark: its file removed and closed, readers woken. The writer file
    /// that a refused attempt left goes too, unless a writer holds it.
    pub(crate) fn end_mark(&self, name: &LockName, mark: Mark) {
        drop(mark.record);
        self.remove_locked(mark.gate);
        self.sweep_writer_files(name);
        self.group_hints
            .notify(&(GroupKind::ReadWrite, name.clone()));
    }

    pub(crate) fn extend_group(
        &self,
        key: &HoldKey,
        ttl: Duration,
    ) -> Result<Option<(Instant, Option<FencingToken>)>, BackendError> {
        let now = Instant::now();
        let mut groups = self.groups.lock();
        let Some(h) = groups.get_mut(key) else {
            return Ok(None);
        };
        if h.until <= now {
            let old = groups.remove(key).expect("present");
            drop(groups);
            self.end_group(key, old);
            return Ok(None);
        }
        if !self.linked(h)? {
            log::warn!(
                "dlm-file: {} {:?}: its files were removed or replaced while held",
                h.claim.primitive(),
                key.1.as_str()
            );
            groups.remove(key);
            return Ok(None);
        }
        h.until = now + ttl;
        write_until(&h.record, h.until);
        Ok(Some((h.until, h.token)))
    }

    pub(crate) fn release_group(&self, key: &HoldKey) -> bool {
        let Some(hold) = self.groups.lock().remove(key) else {
            return false;
        };
        let unexpired = hold.until > Instant::now();
        self.end_group(key, hold) && unexpired
    }

    pub(crate) fn fence_group(&self, key: &HoldKey) -> Result<Option<FencingToken>, BackendError> {
        // Drawn while the hold's entry is locked: its release waits for the draw.
        let mut groups = self.groups.lock();
        let Some(h) = groups.get_mut(key) else {
            return Ok(None);
        };
        if h.until <= Instant::now() || !self.linked(h)? {
            return Ok(None);
        }
        if let Some(t) = h.token {
            return Ok(Some(t));
        }
        let token = self.tokens.draw(&self.dir)?;
        h.token = Some(token);
        write_token(&h.record, token);
        Ok(Some(token))
    }

    pub(crate) fn relabel_group(
        &self,
        key: &HoldKey,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        let mut groups = self.groups.lock();
        let Some(h) = groups.get_mut(key) else {
            return Ok(false);
        };
        if h.until <= Instant::now() || !self.linked(h)? {
            return Ok(false);
        }
        h.label = label.map(str::to_owned);
        write_record(&h.record, h.until, h.token, label);
        self.touch(&h.own);
        drop(groups);
        self.group_hints.notify(&(key.0, key.1.clone()));
        Ok(true)
    }

    /// `writer`'s write hold turned into `reader`'s read hold for `ttl`: the lock of
    /// `r.NAME` made shared while the writer still holds the writer file (no other writer
    /// can try meanwhile), then the writer file given up.
    pub(crate) fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<(Instant, Option<FencingToken>)>, BackendError> {
        let wkey: HoldKey = (GroupKind::ReadWrite, name.clone(), *writer);
        let hold = {
            let mut groups = self.groups.lock();
            match groups.remove(&wkey) {
                Some(h) if h.claim == Claim::Write => h,
                Some(other) => {
                    groups.insert(wkey, other);
                    return Ok(None);
                }
                None => return Ok(None),
            }
        };
        if hold.until <= Instant::now() || !self.linked(&hold)? {
            self.end_group(&wkey, hold);
            return Ok(None);
        }
        let mut hold = hold;
        if let Err(e) = flock(&hold.head.fd, FlockOperation::NonBlockingLockShared) {
            // The conversion dropped the exclusive lock: readers may be in; the head goes
            // only if nobody else holds it.
            hold.claim = Claim::Read;
            self.end_group(&wkey, hold);
            return Err(flock_error(e));
        }
        // From here the head is held shared, as by a reader.
        hold.claim = Claim::Read;
        let Some((slot, record)) = self.reader_slot(name)? else {
            self.end_group(&wkey, hold);
            return Err(BackendError::new(
                BackendErrorKind::Busy,
                format!(
                    "the read-write lock {} has {MAX_READERS} readers",
                    name.as_str()
                ),
            ));
        };
        let until = Instant::now() + ttl;
        write_record(&record, until, hold.token, hold.label.as_deref());
        // The writer file goes: another writer may try once this reader is in.
        let GroupHold {
            head,
            own: writer_file,
            record: writer_record,
            token,
            label,
            ..
        } = hold;
        drop(writer_record);
        self.remove_locked(writer_file);
        self.group_hints
            .notify(&(GroupKind::ReadWrite, name.clone()));
        let read = GroupHold {
            claim: Claim::Read,
            head,
            own: slot,
            record,
            until,
            token,
            label,
        };
        self.groups
            .lock()
            .insert((GroupKind::ReadWrite, name.clone(), *reader), read);
        Ok(Some((until, token)))
    }

    /// Who holds the resource `name` of kind `kind`, as its files say: each hold's
    /// file is probed with a shared lock (refused: held), and its record read.
    pub(crate) fn inspect_group(
        &self,
        kind: GroupKind,
        name: &LockName,
    ) -> Result<Holders, BackendError> {
        let head = head_file(kind, name);
        let Some((fd, _)) = self.dir.open_with(&head, false, false)? else {
            return Ok(Holders::default());
        };
        // Each probe is given back at once: a lock kept would refuse others' attempts
        // without an event to wake them.
        let held = |fd: &OwnedFd| -> Result<bool, BackendError> {
            match flock(fd, FlockOperation::NonBlockingLockShared) {
                Ok(()) => {
                    let _ = flock(fd, FlockOperation::Unlock);
                    Ok(false)
                }
                Err(Errno::WOULDBLOCK) => Ok(true),
                Err(e) => Err(flock_error(e)),
            }
        };
        let mut holders = Vec::new();
        let mut count = None;
        match kind {
            GroupKind::Semaphore => {
                match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {
                        let _ = flock(&fd, FlockOperation::Unlock);
                        return Ok(Holders::default());
                    }
                    Err(Errno::WOULDBLOCK) => {}
                    Err(e) => return Err(flock_error(e)),
                }
                let mut buf = [0u8; 4];
                if pread(&fd, &mut buf, 0).ok() == Some(4) {
                    count = Some(u32::from_le_bytes(buf));
                }
            }
            GroupKind::ReadWrite => {
                if held(&fd)? {
                    // The writer: its record is in the writer file.
                    // (A last reader's release holds it exclusively for a moment too: a
                    // writer is one that holds the writer file.)
                    if let Some((writer, _)) =
                        self.dir.open_with(&writer_file(name), false, false)?
                        && held(&writer)?
                        && let Some((left, token, label)) = read_record(&writer)
                        && !left.is_zero()
                    {
                        holders.push(Holder::new(Claim::Write, left, label).with_token(token));
                    }
                    return Ok(Holders::new(None, holders));
                }
            }
        }
        let prefix = slot_prefix(kind, name);
        for file in self.dir.files_with_prefix(&prefix)? {
            if !file[prefix.len()..].bytes().all(|b| b.is_ascii_digit()) {
                continue; // another name's slot (a name with a dot in it)
            }
            let Some((slot, _)) = self.dir.open_with(&file, false, false)? else {
                continue;
            };
            if held(&slot)?
                && let Some((left, token, label)) = read_record(&slot)
                && !left.is_zero()
            {
                let claim = match (kind, count) {
                    (GroupKind::Semaphore, Some(permits)) => Claim::Permit { permits },
                    (GroupKind::Semaphore, None) => continue,
                    (GroupKind::ReadWrite, _) => Claim::Read,
                };
                holders.push(Holder::new(claim, left, label).with_token(token));
            }
        }
        let permits = count.filter(|_| !holders.is_empty());
        Ok(Holders::new(permits, holders))
    }

    /// Ends every hold of the resource: this process's at once, other processes' by
    /// removing the files they locked (each learns at its next renewal that its file is
    /// gone). Whether anything was held.
    pub(crate) fn force_release_group(
        &self,
        kind: GroupKind,
        name: &LockName,
    ) -> Result<bool, BackendError> {
        let held = !self.inspect_group(kind, name)?.is_free();
        let local: Vec<(HoldKey, GroupHold)> = {
            let mut groups = self.groups.lock();
            let keys: Vec<HoldKey> = groups
                .keys()
                .filter(|(k, n, _)| *k == kind && n == name)
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| groups.remove(&k).map(|h| (k, h)))
                .collect()
        };
        let local_held = !local.is_empty();
        for (key, hold) in local {
            self.end_group(&key, hold);
        }
        if kind == GroupKind::ReadWrite {
            let mark = self.marks.lock().remove(name);
            if let Some(mark) = mark {
                self.end_mark(name, mark);
            }
            self.dir.remove(&mark_file(name))?;
            self.dir.remove(&writer_file(name))?;
        }
        let prefix = slot_prefix(kind, name);
        for file in self.dir.files_with_prefix(&prefix)? {
            if file[prefix.len()..].bytes().all(|b| b.is_ascii_digit()) {
                self.dir.remove(&file)?;
            }
        }
        self.dir.remove(&head_file(kind, name))?;
        self.group_hints.notify(&(kind, name.clone()));
        Ok(held || local_held)
    }

    /// Ends the group holds and the writers' marks that ran out; the earliest end left.
    pub(crate) fn reap_groups(&self, now: Instant) -> Option<Instant> {
        let expired: Vec<(HoldKey, GroupHold)> = {
            let mut groups = self.groups.lock();
            let keys: Vec<HoldKey> = groups
                .iter()
                .filter(|(_, h)| h.until <= now)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| groups.remove(&k).map(|h| (k, h)))
                .collect()
        };
        for (key, hold) in expired {
            log::debug!(
                "dlm-file: {} {:?}: its lease ran out unrenewed",
                hold.claim.primitive(),
                key.1.as_str()
            );
            self.end_group(&key, hold);
        }
        let ended: Vec<(LockName, Mark)> = {
            let mut marks = self.marks.lock();
            let keys: Vec<LockName> = marks
                .iter()
                .filter(|(_, m)| m.until <= now)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| marks.remove(&k).map(|m| (k, m)))
                .collect()
        };
        for (name, mark) in ended {
            self.end_mark(&name, mark);
        }
        let holds = self.groups.lock().values().map(|h| h.until).min();
        let marks = self.marks.lock().values().map(|m| m.until).min();
        holds.into_iter().chain(marks).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_back_with_token_and_label() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::for_tests(&tmp.path().join("d"));
        let fd = dir.open_file("p.x.0", true).unwrap().unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        write_record(&fd, until, Some(FencingToken::new(42)), Some("host:1"));
        let other = dir.open_file("p.x.0", false).unwrap().unwrap();
        let (left, token, label) = read_record(&other).unwrap();
        assert!(left > Duration::from_secs(9));
        assert_eq!(token, Some(FencingToken::new(42)));
        assert_eq!(label.as_deref(), Some("host:1"));
        write_record(&fd, until, None, None);
        let (_, token, label) = read_record(&other).unwrap();
        assert_eq!((token, label), (None, None));
    }
}
