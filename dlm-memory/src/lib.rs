//! # dlm-memory: the in-memory backend of dlm
//!
//! A real [`LockBackend`], not a mock: holders with expiries, a fencing counter per name
//! (tokens 1, 2, 3, ...), release wake-ups through [`LockBackend::watch`], and the same
//! semantics as the Redis backends. Locks are shared by every
//! [`LockClient`](dlm_core::LockClient) (and every clone of the backend) in one process,
//! never across processes.
//!
//! Use it as the embedded default, and as the swap-in for a Redis backend in your own
//! tests. For tests of failure handling it has an injectable [`Clock`] (a [`ManualClock`]
//! makes expiry deterministic) and fault knobs ([`Faults`]).
//!
//! ```
//! use dlm_core::{Lock, LockClient};
//! use dlm_memory::MemoryBackend;
//!
//! let backend = MemoryBackend::new();
//! let a = LockClient::new(backend.clone());
//! let b = LockClient::new(backend);
//! let held = a.get_lock("report")?.lock()?;
//! assert!(b.get_lock("report")?.try_lock()?.is_none());
//! drop(held);
//! assert!(b.get_lock("report")?.try_lock()?.is_some());
//! # Ok::<(), dlm_core::Error>(())
//! ```
#![deny(missing_docs)]

mod clock;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlm_core::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, WaitList, Watch,
};
use parking_lot::Mutex;

pub use clock::{Clock, ManualClock, SystemClock};

/// The in-memory lock store. Cloning shares the store.
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    fencing: bool,
    entries: Mutex<HashMap<LockName, Entry>>,
    faults: Faults,
}

#[derive(Default)]
struct Entry {
    holder: Option<Holder>,
    /// The last fencing token issued for this name. Never reset.
    fence: u64,
    waiters: WaitList,
}

struct Holder {
    owner: OwnerToken,
    expires_at: Instant,
    fence: Option<FencingToken>,
}

impl Entry {
    /// The live holder, dropping an expired one.
    fn holder(&mut self, now: Instant) -> Option<&mut Holder> {
        if self.holder.as_ref().is_some_and(|h| now >= h.expires_at) {
            self.holder = None;
        }
        self.holder.as_mut()
    }
}

impl MemoryBackend {
    /// A store on the real clock, with fencing tokens.
    pub fn new() -> Self {
        MemoryBackend::builder().build()
    }

    /// A builder to choose the clock and whether fencing tokens are issued.
    pub fn builder() -> MemoryBackendBuilder {
        MemoryBackendBuilder {
            clock: Arc::new(SystemClock),
            fencing: true,
        }
    }

    /// The fault knobs of this store.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Expires `name` now, as if its lease ran out (no release hint is sent, as with a real
    /// expiry). Returns whether it was held.
    pub fn expire_now(&self, name: &str) -> bool {
        let Ok(name) = LockName::new(name) else {
            return false;
        };
        let mut entries = self.inner.entries.lock();
        entries
            .get_mut(&name)
            .and_then(|e| e.holder.take())
            .is_some()
    }

    /// How many waiters are subscribed to `name`'s release hints (to check that none is
    /// left behind).
    pub fn watchers(&self, name: &str) -> usize {
        let Ok(name) = LockName::new(name) else {
            return 0;
        };
        let entries = self.inner.entries.lock();
        entries.get(&name).map_or(0, |e| e.waiters.len())
    }

    /// Runs the fault knobs, then `f` on the entry of `name`.
    fn with_entry<T>(
        &self,
        name: &LockName,
        f: impl FnOnce(&mut Entry, Instant) -> T,
    ) -> Result<T, BackendError> {
        self.inner.faults.before_call()?;
        let now = self.inner.clock.now();
        let mut entries = self.inner.entries.lock();
        let entry = match entries.get_mut(name) {
            Some(entry) => entry,
            None => entries.entry(name.clone()).or_default(),
        };
        Ok(f(entry, now))
    }

    fn lease(&self, started: Instant, ttl: Duration, fence: Option<FencingToken>) -> Lease {
        let lease = Lease::new(started + ttl);
        match fence {
            Some(fence) => lease.with_fence(fence),
            None => lease,
        }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("clock", &self.inner.clock)
            .field("fencing", &self.inner.fencing)
            .field("names", &self.inner.entries.lock().len())
            .finish_non_exhaustive()
    }
}

impl LockBackend for MemoryBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        let started = Instant::now();
        let fencing = self.inner.fencing;
        self.with_entry(name, |entry, now| {
            let expires_at = now + ttl;
            if let Some(holder) = entry.holder(now) {
                if holder.owner != *owner {
                    return Acquire::Held {
                        retry_after: Some(holder.expires_at - now),
                    };
                }
                holder.expires_at = expires_at;
                return Acquire::Acquired(self.lease(started, ttl, holder.fence));
            }
            let fence = fencing.then(|| {
                entry.fence += 1;
                FencingToken::new(entry.fence)
            });
            entry.holder = Some(Holder {
                owner: *owner,
                expires_at,
                fence,
            });
            Acquire::Acquired(self.lease(started, ttl, fence))
        })
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let started = Instant::now();
        self.with_entry(name, |entry, now| match entry.holder(now) {
            Some(holder) if holder.owner == *owner => {
                holder.expires_at = now + ttl;
                Some(self.lease(started, ttl, holder.fence))
            }
            _ => None,
        })
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        self.with_entry(name, |entry, now| match entry.holder(now) {
            Some(holder) if holder.owner == *owner => {
                entry.holder = None;
                entry.waiters.notify_one();
                true
            }
            _ => false,
        })
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.with_entry(name, |entry, now| {
            let held = entry.holder(now).is_some();
            entry.holder = None;
            entry.waiters.notify_one();
            held
        })
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.with_entry(name, |entry, now| {
            entry.holder(now).map(|h| h.expires_at - now)
        })
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let mut entries = self.inner.entries.lock();
        Some(entries.entry(name.clone()).or_default().waiters.subscribe())
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        let entries = self.inner.entries.lock();
        entries.get(name).is_some_and(|e| e.waiters.wake_pending())
    }
}

/// Configures a [`MemoryBackend`]. Created by [`MemoryBackend::builder`].
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder {
    clock: Arc<dyn Clock>,
    fencing: bool,
}

impl MemoryBackendBuilder {
    /// The clock expiry follows. Defaults to [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Whether acquisitions carry fencing tokens (1, 2, 3, ... per name). Defaults to
    /// `true`.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryBackend {
        MemoryBackend {
            inner: Arc::new(Inner {
                clock: self.clock,
                fencing: self.fencing,
                entries: Mutex::new(HashMap::new()),
                faults: Faults::default(),
            }),
        }
    }
}

/// Fault knobs of a [`MemoryBackend`], to exercise the error paths of code that uses
/// locks. Every backend call (except `watch`) passes through them.
#[derive(Debug, Default)]
pub struct Faults {
    fail_next: Mutex<Option<(u64, BackendErrorKind)>>,
    delay: Mutex<Duration>,
    calls: AtomicU64,
}

impl Faults {
    /// Makes the next `n` calls fail with an error of `kind`.
    pub fn fail_next(&self, n: u64, kind: BackendErrorKind) {
        *self.fail_next.lock() = (n > 0).then_some((n, kind));
    }

    /// Makes every call take at least `delay` (zero: no delay), like a slow network.
    pub fn delay_calls(&self, delay: Duration) {
        *self.delay.lock() = delay;
    }

    /// How many calls the store has received (failed ones included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn before_call(&self) -> Result<(), BackendError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let delay = *self.delay.lock();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut fail = self.fail_next.lock();
        if let Some((n, kind)) = *fail {
            *fail = (n > 1).then_some((n - 1, kind));
            return Err(BackendError::new(kind, "injected fault"));
        }
        Ok(())
    }
}
