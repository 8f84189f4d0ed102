//! One attempt at the mutex: the backend's table of this process's holds first, then
//! the kernel lock of the name's file.

use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, BackendError, Lease, LockName, OwnerToken};

use crate::state::{Hold, write_until};
use crate::{FileBackend, hints};

/// How long a waiter looks again after an attempt that found the lock held by a process
/// whose lease end is not known, or already past (a stopped holder keeps its kernel lock).
const UNKNOWN_HOLDER_LOOK_AGAIN: Duration = Duration::from_secs(1);

impl FileBackend {
    pub(crate) fn lease(&self, hold: &Hold) -> Lease {
        let lease = Lease::new(hold.until);
        match hold.token {
            Some(t) => lease.with_fence(t),
            None => lease,
        }
    }

    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Result<Acquire, BackendError> {
        let state = &self.inner.state;
        let now = Instant::now();
        let until = now + ttl;
        let mut holds = state.holds.lock();
        if let Some(h) = holds.get_mut(name) {
            if h.owner == *owner {
                if state.still_linked(name, h)? {
                    h.until = until;
                    write_until(&h.file, until);
                    let lease = self.lease(h);
                    drop(holds);
                    self.reaper_knows(until);
                    return Ok(Acquire::Acquired(lease));
                }
                // Its file was removed or replaced: that hold is over.
                holds.remove(name);
            } else if h.until > now {
                return Ok(Acquire::Held {
                    retry_after: Some(h.until - now),
                });
            } else {
                let old = holds.remove(name).expect("present");
                drop(holds);
                state.end(name, old);
                holds = state.holds.lock();
            }
        }
        // The kernel decides from here: the table is not held across the system calls (a
        // name that another hold of this process has cannot be locked by this attempt).
        drop(holds);
        let (file, identity) = match state.lock_file(name)? {
            Ok(locked) => locked,
            Err(left) => {
                let retry_after = if state.registry.recently_hinted(name) {
                    // Woken by a closed file whose lock the kernel may not have dropped
                    // yet (a dying holder): look again soon, once.
                    hints::SETTLE_LOOK_AGAIN
                } else {
                    left.unwrap_or(UNKNOWN_HOLDER_LOOK_AGAIN)
                };
                return Ok(Acquire::Held {
                    retry_after: Some(retry_after),
                });
            }
        };
        write_until(&file, until);
        let mut hold = Hold {
            owner: *owner,
            file,
            identity,
            until,
            token: None,
        };
        if fenced && state.fencing {
            match state.tokens.draw(&state.dir) {
                Ok(t) => hold.token = Some(t),
                // The acquisition stands; the token is drawn when it is read.
                Err(e) => log::debug!("dlm-file: drawing a token with a grant: {e}"),
            }
        }
        let lease = self.lease(&hold);
        state.holds.lock().insert(name.clone(), hold);
        self.reaper_knows(until);
        Ok(Acquire::Acquired(lease))
    }
}
