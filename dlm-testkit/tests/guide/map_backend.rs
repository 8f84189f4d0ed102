use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlm_core::backend::{Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName, OwnerToken};

/// Locks in a map behind a mutex, for the threads of one process (like dlm-memory).
/// Cloning shares the map.
#[derive(Clone, Debug, Default)]
pub struct MapBackend {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockName, Entry>,
    /// The last fencing token given: one counter for every name, so tokens only grow.
    /// It lives as long as the locks: when the map is gone, so is every hold.
    last_token: u64,
    /// The size at which expired entries of names nobody asks for again are swept out.
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    owner: OwnerToken,
    expires: Instant,
    token: u64,
}

impl MapBackend {
    /// Runs `f` on the map and the time now, after removing `name`'s entry if it has
    /// expired: `f` sees only a live entry.
    fn with_live<T>(
        &self,
        name: &LockName,
        f: impl FnOnce(&mut State, Instant) -> T,
    ) -> Result<T, BackendError> {
        // A poisoned mutex does not recover: `Other` is not transient, so the front
        // returns the error at once instead of retrying.
        let mut state = self.state.lock().map_err(|_| {
            BackendError::new(BackendErrorKind::Other, "the map's mutex is poisoned")
        })?;
        let now = Instant::now();
        if state.locks.get(name).is_some_and(|e| e.expires <= now) {
            state.locks.remove(name);
        }
        // Every entry ends with its lease, also for names nobody asks for again: sweep
        // when the map has doubled since the last sweep (amortised constant time).
        if state.locks.len() > state.sweep_at {
            state.locks.retain(|_, e| e.expires > now);
            state.sweep_at = 2 * state.locks.len() + 64;
        }
        Ok(f(&mut state, now))
    }
}

impl LockBackend for MapBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.with_live(name, |state, now| {
            let lease = |token| Lease::new(now + ttl).with_fence(FencingToken::new(token));
            match state.locks.get_mut(name) {
                // Ours already (a retry whose first reply was lost): refresh the lease.
                Some(e) if e.owner == *owner => {
                    e.expires = now + ttl;
                    Acquire::Acquired(lease(e.token))
                }
                // Someone else's: say when it can be ours at the latest.
                Some(e) => Acquire::Held {
                    retry_after: Some(e.expires - now),
                },
                None => {
                    state.last_token += 1;
                    let token = state.last_token;
                    let entry = Entry {
                        owner: *owner,
                        expires: now + ttl,
                        token,
                    };
                    state.locks.insert(name.clone(), entry);
                    Acquire::Acquired(lease(token))
                }
            }
        })
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        self.with_live(name, |state, now| {
            // Only the holder's live entry; a missing one is never re-created.
            let e = state.locks.get_mut(name).filter(|e| e.owner == *owner)?;
            e.expires = now + ttl;
            Some(Lease::new(e.expires).with_fence(FencingToken::new(e.token)))
        })
    }

    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        // The token came with the acquisition; asked again, it is the holder's, and a
        // holder that lost the lock gets none.
        self.with_live(name, |state, _| {
            let e = state.locks.get(name).filter(|e| e.owner == *owner)?;
            Some(FencingToken::new(e.token))
        })
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.with_live(name, |state, _| {
            let ours = state.locks.get(name).is_some_and(|e| e.owner == *owner);
            if ours {
                state.locks.remove(name);
            }
            ours
        })
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.with_live(name, |state, _| state.locks.remove(name).is_some())
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.with_live(name, |state, now| {
            state.locks.get(name).map(|e| e.expires - now)
        })
    }
}
