//! The files of a group resource: their names, the holds' records in them, and one
//! attempt at a kernel lock of one of them.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use dlm_core::backend::{BackendError, FencingToken, LockName};
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread, pwrite};

use super::Locked;
use crate::dir::{Attempted, Dir};
use crate::hints::{GroupKind, SETTLE_LOOK_AGAIN};
use crate::state::{flock_error, read_left, until_bytes};

pub(super) fn head_file(kind: GroupKind, name: &LockName) -> String {
    match kind {
        GroupKind::Semaphore => format!("s.{name}", name = name.as_str()),
        GroupKind::ReadWrite => format!("r.{name}", name = name.as_str()),
    }
}

pub(super) fn slot_prefix(kind: GroupKind, name: &LockName) -> String {
    match kind {
        GroupKind::Semaphore => format!("p.{name}.", name = name.as_str()),
        GroupKind::ReadWrite => format!("q.{name}.", name = name.as_str()),
    }
}

/// A read-write lock's mark file: locked by a writer that waits for readers to leave.
pub(super) fn mark_file(name: &LockName) -> String {
    format!("w.{name}", name = name.as_str())
}

/// A read-write lock's writer file: locked by its writer, from the attempt that gets in
/// to the end of its hold; holds the writer's record.
pub(super) fn writer_file(name: &LockName) -> String {
    format!("x.{name}", name = name.as_str())
}

/// The record of a hold: its lease end (the monotonic clock in ns, as the mutex writes
/// it), its token (0: none) and its label.
pub(super) fn write_record(
    fd: &OwnedFd,
    until: Instant,
    token: Option<FencingToken>,
    label: Option<&str>,
) {
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

pub(super) fn write_token(fd: &OwnedFd, token: FencingToken) {
    if let Err(e) = pwrite(fd, &token.get().to_le_bytes(), 8) {
        log::debug!("dlm-file: cannot write a hold's token: {e}");
    }
}

/// A record as another process wrote it: its remaining lease (zero when past), token
/// and label. `None`: not written yet (a hold being granted).
pub(super) fn read_record(
    fd: &OwnedFd,
) -> Option<(Duration, Option<FencingToken>, Option<String>)> {
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
pub(super) fn lock_at(
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

/// Whether another open file holds a lock of `fd`'s file: one shared attempt, given back
/// at once (a lock kept would refuse others' attempts without an event to wake them).
pub(super) fn held(fd: &OwnedFd) -> Result<bool, BackendError> {
    match flock(fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = flock(fd, FlockOperation::Unlock);
            Ok(false)
        }
        Err(Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(flock_error(e)),
    }
}

/// `locked`'s file open for writing (the hold's record), if it is still the file locked.
pub(super) fn open_record(dir: &Dir, locked: &Locked) -> Result<Option<OwnedFd>, BackendError> {
    Ok(dir
        .open_with(&locked.file, false, true)?
        .filter(|(_, id)| *id == locked.id)
        .map(|(fd, _)| fd))
}

/// A first free slot among `files`, locked, with its record open.
pub(super) fn take_slot(
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
