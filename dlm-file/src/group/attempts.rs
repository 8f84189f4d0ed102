//! One attempt at each kind of group hold: a permit, a read hold, a write hold (with the
//! writer's mark); the files locked, or why not.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, BackendErrorKind, LockName, WRITER_MARK, writer_mark};
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread, pwrite};

use super::files::{
    head_file, held, lock_at, mark_file, open_record, slot_prefix, take_slot, writer_file,
};
use super::{LOOK_AGAIN, Locked, MAX_PERMITS, MAX_READERS, Mark, Outcome, refused};
use crate::hints::{GroupKind, SETTLE_LOOK_AGAIN};
use crate::state::{State, flock_error, read_left, write_until};

impl State {
    /// `s.NAME` locked shared, holding `permits` as its count; `Err`: refused.
    pub(super) fn take_permit(
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
            if held(&fd)? {
                return Ok(true);
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

    pub(super) fn take_read(
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

    pub(super) fn reader_slot(
        &self,
        name: &LockName,
    ) -> Result<Option<(Locked, OwnedFd)>, BackendError> {
        let prefix = slot_prefix(GroupKind::ReadWrite, name);
        Ok(take_slot(&self.dir, (0..MAX_READERS).map(|i| format!("{prefix}{i}")))?.ok())
    }

    pub(super) fn take_write(
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
}
