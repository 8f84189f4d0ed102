//! What the files of a group resource say of its holders, and their forced release.

use dlm_core::backend::{BackendError, Claim, Holder, Holders, LockName};
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread};

use super::files::{head_file, held, mark_file, read_record, slot_prefix, writer_file};
use super::{GroupHold, HoldKey};
use crate::hints::GroupKind;
use crate::state::{State, flock_error};

impl State {
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
        let local: Vec<(HoldKey, GroupHold)> = self
            .groups
            .lock()
            .extract_if(|(k, n, _), _| *k == kind && n == name)
            .collect();
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
}
