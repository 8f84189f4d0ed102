//! The guard that represents one hold of a lock.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Claim, FencingToken, Lease};
use crate::error::{Error, Result};
use crate::hold::{Holding, LockShared};
use crate::keep_alive::KeepAlive;
use crate::lost::LostSignal;
use crate::signal::Signal;

/// One hold of a lock. Created by the acquisition methods of [`Lock`](crate::Lock);
/// releases the hold when dropped.
///
/// Dropping is best effort: a failure to release is logged (with `log`) and never panics.
/// A release that fails transiently is sent again in the background until it succeeds or
/// the lease ends; when the guard is the client's last handle, its drop waits for such
/// releases at most [`RetryPolicy::release_wait`](crate::RetryPolicy::release_wait) (5 s).
/// Call [`unlock`](LockGuard::unlock) to see the outcome. A guard is `Send` and `'static`: it can be moved to another thread
/// or stored; the hold still belongs to the thread that acquired it (re-entrancy and
/// [`Lock::unlock`](crate::Lock::unlock) go by that thread).
///
/// ```
/// use std::time::Duration;
/// use dlm_core::{Error, Lock, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let client = LockClient::builder(MemoryBackend::new())
///     .lease(Duration::from_secs(60))
///     .build()?;
/// let lock = client.get_lock("batch-7")?;
/// let guard = lock.lock()?;
/// for step in 0..3 {
///     guard.ensure_held()?;                  // stop if the lease is gone (no I/O)
///     // ... step `step` of the work, writing with guard.fencing_token() ...
/// #   let _ = step;
/// }
/// guard.extend(Duration::from_secs(60))?;    // more time, if still ours
/// assert!(guard.is_held() && guard.fencing_token().is_ok());
/// match guard.unlock() {                     // the outcome of the release
///     Ok(()) => {}
///     Err(Error::LockLost) => eprintln!("someone may have run at the same time"),
///     Err(e) => return Err(e),
/// }
/// assert!(!lock.is_locked()?);
///
/// {
///     let _guard = lock.lock()?;
///     assert!(lock.is_locked()?);
/// }                                          // dropped: released (best effort)
/// assert!(!lock.is_locked()?);
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[must_use = "if unused the lock is released immediately"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    lock: Arc<LockShared>,
    /// Keeps the client's renewal thread running while this guard exists.
    _keep_alive: Arc<KeepAlive>,
    generation: u64,
    /// The lease as of acquisition; the shared state has the current one.
    lease: Lease,
    active: bool,
}

impl LockGuard {
    pub(crate) fn new(
        lock: Arc<LockShared>,
        keep_alive: Arc<KeepAlive>,
        generation: u64,
        lease: Lease,
    ) -> Self {
        LockGuard {
            lock,
            _keep_alive: keep_alive,
            generation,
            lease,
            active: true,
        }
    }

    /// The name of the lock.
    pub fn name(&self) -> &str {
        self.lock.name.as_str()
    }

    /// The kind of hold: [`Claim::Exclusive`] for a mutex's, [`Claim::Permit`] for a
    /// semaphore's, [`Claim::Read`] or [`Claim::Write`] for a read-write lock's (a read
    /// taken by a writer's thread is counted on its write hold: `Write`).
    pub fn claim(&self) -> Claim {
        self.lock.claim
    }

    /// Gives back this hold; the last hold releases the lock.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lease had already run out or been taken (whatever the
    /// lock protected may have been entered by someone else meanwhile);
    /// [`Error::Backend`] when the backend could not be reached: a transient failure is
    /// sent again in the background until it succeeds or the lease ends (see
    /// [`LockClient::flush_releases`](crate::LockClient::flush_releases)).
    pub fn unlock(mut self) -> Result<()> {
        self.active = false;
        self.release()
    }

    /// Keeps the hold without the guard: it must be given back later with
    /// [`Lock::unlock`](crate::Lock::unlock) from the thread that acquired it (the Java
    /// style of `lock(); try { ... } finally { unlock(); }` across scopes).
    pub fn into_hold(mut self) {
        self.active = false;
    }

    /// The end of the lease as this process knows it: monotonic, already reduced by the
    /// acquisition's round trip and the backend's drift allowance.
    pub fn valid_until(&self) -> Instant {
        self.with_holding(|h| h.lease.valid_until())
            .unwrap_or(self.lease.valid_until())
    }

    /// `true` once [`valid_until`](LockGuard::valid_until) has passed.
    pub fn is_expired(&self) -> bool {
        self.lock.client.backend.now() >= self.valid_until()
    }

    /// `true` while this acquisition is current, its lease has not run out, and no
    /// extension found it gone. Local knowledge: no I/O.
    pub fn is_held(&self) -> bool {
        let now = self.lock.client.backend.now();
        self.with_holding(|h| h.is_valid(now)).unwrap_or(false)
    }

    /// `Ok(())` when [`is_held`](LockGuard::is_held), else [`Error::LockLost`]: a
    /// check to put between steps of long work.
    pub fn ensure_held(&self) -> Result<()> {
        if self.is_held() {
            Ok(())
        } else {
            Err(Error::LockLost)
        }
    }

    /// A [`LostSignal`] of this hold: it tells another thread (or this one, without I/O)
    /// whether the hold is [`Held`](crate::HoldState::Held), [`Lost`](crate::HoldState::Lost) (a
    /// watchdog renewal or an [`extend`](LockGuard::extend) found the lock gone, renewals
    /// failed until the lease ran out, or a fixed lease ran out), or
    /// [`Released`](crate::HoldState::Released), and can wait for the end.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlm_core::{HoldState, Lock, LockClient};
    /// use dlm_memory::MemoryBackend;
    ///
    /// let lock = LockClient::new(MemoryBackend::new()).get_lock("batch")?;
    /// let guard = lock.lock()?;
    /// let signal = guard.lost_signal();
    /// assert_eq!(signal.wait_timeout(Duration::from_millis(10)), HoldState::Held);
    /// guard.unlock()?;
    /// assert_eq!(signal.state(), HoldState::Released); // done, not lost
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn lost_signal(&self) -> LostSignal {
        let mut state = self.lock.state.lock();
        match state
            .holding
            .as_mut()
            .filter(|h| h.generation == self.generation)
        {
            Some(h) if h.lost => LostSignal::ended(self.lock.clone(), self.generation, true),
            Some(h) => {
                let signal = h.signal.get_or_insert_with(Signal::new);
                LostSignal::new(self.lock.clone(), self.generation, signal)
            }
            None => {
                // This acquisition is already over, and this guard did not release it:
                // lost if its lease ran out, else released through another way
                // (`Lock::unlock`, `release`).
                drop(state);
                let lost = self.lock.client.backend.now() >= self.valid_until();
                LostSignal::ended(self.lock.clone(), self.generation, lost)
            }
        }
    }

    /// The fencing token of this hold: hand it to the resource with every write, so that
    /// the resource can refuse a holder whose lease ran out (see
    /// [`FencedResource`](crate::FencedResource)).
    ///
    /// The token is drawn on the first call of a hold (one request to the backend, which
    /// checks that the lock is still ours and draws it in one atomic step), unless it
    /// came with the acquisition: the backend hands tokens out with every lease, or the
    /// client drew it there because the last hold of this lock read its token (see
    /// [`TokenDraw`](crate::TokenDraw)). Later calls, and every re-entrant guard of the
    /// same hold, get the same token without I/O. An acquisition whose token is never
    /// read costs what an unfenced one costs (after one that did read, one unused draw on
    /// the server). Tokens drawn by successive
    /// holders of a name increase with their holds; a new acquisition after a release
    /// gets a new token.
    ///
    /// ```
    /// use dlm_core::{FencedResource, Lock, LockClient};
    /// use dlm_memory::MemoryBackend;
    ///
    /// let lock = LockClient::new(MemoryBackend::new()).get_lock("ledger")?;
    /// let ledger = FencedResource::new(Vec::new());
    /// let guard = lock.lock()?;
    /// let token = guard.fencing_token()?;              // drawn here, if not already
    /// ledger.write(token, |entries| entries.push("credit 10"))?;
    /// assert_eq!(lock.lock()?.fencing_token()?, token); // a re-entry shares it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::LockLost`] when this hold is over or known lost (no I/O then), or when the
    /// backend found the lock no longer ours: a holder that lost its lock never gets a
    /// token. [`Error::Backend`] when the backend failed (transient kinds may be retried:
    /// a later call draws again), or with [`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported)
    /// when the backend issues no tokens (fencing switched off).
    pub fn fencing_token(&self) -> Result<FencingToken> {
        let backend = &self.lock.client.backend;
        let owner = {
            let mut state = self.lock.state.lock();
            let holding = state
                .holding
                .as_mut()
                .filter(|h| h.generation == self.generation)
                .ok_or(Error::LockLost)?;
            if !holding.is_valid(backend.now()) {
                return Err(Error::LockLost);
            }
            if let Some(fence) = holding.fence {
                holding.read = true;
                return Ok(fence);
            }
            holding.token
        };
        // No state mutex across the request, as for extensions.
        let drawn = self.lock.fence_at_backend(&owner);
        self.lock
            .with_current(self.generation, |holding| match drawn {
                // A draw of another thread's guard of this hold that came first wins: one
                // token per hold.
                Ok(Some(fence)) => {
                    holding.read = true;
                    Ok(*holding.fence.get_or_insert(fence))
                }
                Ok(None) => {
                    holding.mark_lost();
                    Err(Error::LockLost)
                }
                Err(e) => Err(e.into()),
            })
            .unwrap_or(Err(Error::LockLost))
    }

    /// The hold's fencing token if it is already known (handed out with the acquisition
    /// or drawn by an earlier [`fencing_token`](LockGuard::fencing_token)): no I/O. It
    /// does not count as a read for the prediction of [`TokenDraw`](crate::TokenDraw).
    pub fn known_fencing_token(&self) -> Option<FencingToken> {
        self.with_holding(|h| h.fence).flatten()
    }

    /// Resets the lease to `ttl` from now, if the lock is still ours.
    ///
    /// No lock is held across the request: [`is_held`](LockGuard::is_held) and the other
    /// local questions answer at once while an extension waits on a slow server.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `ttl` the client does not accept (no I/O then);
    /// [`Error::LockLost`] when the lock is no longer ours (the guard then reports
    /// [`is_held`](LockGuard::is_held) `false`), also when the hold ended while the
    /// request was under way; [`Error::Backend`] on failure.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        let client = &self.lock.client;
        client.check_lease(ttl)?;
        let started = self
            .lock
            .with_current(self.generation, |h| h.start_renewal())
            .ok_or(Error::LockLost)?;
        let metrics = &self.lock.metrics;
        let result = metrics.check(self.lock.extend_at_backend(&started.token, ttl));
        // Applied (and counted) only if the hold is still this acquisition and not found
        // lost meanwhile.
        let mut give_up = None;
        let mut result = Some(result);
        let outcome = self
            .lock
            .with_current(self.generation, |holding| {
                let result = result.take().expect("run once");
                metrics.renewal(matches!(result, Ok(Some(_))));
                match result {
                    Ok(Some(lease)) if holding.renewed(started, lease, client.backend.now()) => {
                        Ok(())
                    }
                    // It came back after the lease had run out here: lost all the same, and
                    // the hold it renewed at the store is released.
                    Ok(Some(lease)) => {
                        metrics.lost();
                        give_up = Some(lease.valid_until());
                        Err(Error::LockLost)
                    }
                    Ok(None) => {
                        holding.mark_lost();
                        metrics.lost();
                        Err(Error::LockLost)
                    }
                    Err(e) => Err(e.into()),
                }
            })
            .unwrap_or(Err(Error::LockLost));
        // The hold ended while the request was under way: what it may have renewed at
        // the store is nobody's.
        match result {
            Some(Ok(Some(lease))) => give_up = Some(lease.valid_until()),
            Some(Err(e)) if e.may_have_applied() => give_up = Some(client.backend.now() + ttl),
            _ => {}
        }
        if let Some(until) = give_up {
            crate::watchdog::Renewable::give_up(&*self.lock, &started.token, until);
        }
        outcome
    }

    /// The hold state this guard belongs to and its acquisition.
    pub(crate) fn hold(&self) -> (&Arc<LockShared>, u64) {
        (&self.lock, self.generation)
    }

    /// Consumes the guard without releasing anything: its hold ended another way.
    pub(crate) fn forget(mut self) {
        self.active = false;
    }

    fn with_holding<T>(&self, f: impl FnOnce(&Holding) -> T) -> Option<T> {
        let state = self.lock.state.lock();
        state
            .holding
            .as_ref()
            .filter(|h| h.generation == self.generation)
            .map(f)
    }

    fn release(&self) -> Result<()> {
        match self.lock.release_hold(self.generation, false) {
            // A guard whose acquisition was superseded lost its lease.
            Err(Error::NotHeld) => Err(Error::LockLost),
            other => other,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        self.active = false;
        match self.release() {
            Ok(()) => {}
            Err(Error::LockLost) => log::warn!(
                "lock {:?}: the lease was lost before the guard was dropped",
                self.lock.name
            ),
            Err(e) => log::warn!(
                "lock {:?}: release on drop failed (sent again in the background while it fails transiently, until the lease ends): {e}",
                self.lock.name
            ),
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.lock.name)
            .field("fencing_token", &self.known_fencing_token())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}
