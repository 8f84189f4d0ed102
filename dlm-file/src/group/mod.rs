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
//!
//! Here: the holds of this process and their life (grant, renewal, release, downgrade,
//! lease end); `files`: the files' names, the records and one lock attempt; `attempts`:
//! one attempt at each kind of hold; `inspect`: what the files say of the holders, and
//! the forced release.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, LockName, OwnerToken,
};
use rustix::fs::{FlockOperation, flock};

use crate::dir::Identity;
use crate::hints::{GroupKind, SETTLE_LOOK_AGAIN};
use crate::state::{State, flock_error, write_until};

mod attempts;
mod files;
mod inspect;

use files::{mark_file, write_record, write_token, writer_file};

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

    /// Ends the group holds and the writers' marks that ran out; the earliest end left.
    pub(crate) fn reap_groups(&self, now: Instant) -> Option<Instant> {
        let expired: Vec<(HoldKey, GroupHold)> = self
            .groups
            .lock()
            .extract_if(|_, h| h.until <= now)
            .collect();
        for (key, hold) in expired {
            log::debug!(
                "dlm-file: {} {:?}: its lease ran out unrenewed",
                hold.claim.primitive(),
                key.1.as_str()
            );
            self.end_group(&key, hold);
        }
        let ended: Vec<(LockName, Mark)> = self
            .marks
            .lock()
            .extract_if(|_, m| m.until <= now)
            .collect();
        for (name, mark) in ended {
            self.end_mark(&name, mark);
        }
        let holds = self.groups.lock().values().map(|h| h.until).min();
        let marks = self.marks.lock().values().map(|m| m.until).min();
        holds.into_iter().chain(marks).min()
    }
}
