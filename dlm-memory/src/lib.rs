//! # dlm-memory: the in-memory backend of dlm
//!
//! A real [`LockBackend`], not a mock: holders with expiries, fencing tokens from one
//! counter per store (so they increase for every name, with gaps), release wake-ups
//! through [`LockBackend::watch`], and the same semantics as the Redis backends. A name
//! takes memory only while it is held or waited for. Locks are shared by every
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

mod builder;
mod clock;
mod faults;
mod group;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holders, Lease,
    LockBackend, LockName, OwnerToken, WaitList, Watch, every_hold_kind,
};
use group::{Group, GroupKind};
use parking_lot::Mutex;

pub use builder::MemoryBackendBuilder;
pub use clock::{Clock, ManualClock, SystemClock};
pub use faults::Faults;

/// The in-memory lock store. Cloning shares the store.
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    fencing: bool,
    store: Mutex<Store>,
    faults: Faults,
}

/// Removes an observer from its group when its watch is dropped.
struct ObserverGone {
    inner: std::sync::Weak<Inner>,
    key: (LockName, GroupKind),
    id: u64,
}

impl dlm_core::backend::Unsubscribe for ObserverGone {
    fn unsubscribe(self: Box<Self>, _pending_wake: bool) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let now = inner.clock.now();
        let mut store = inner.store.lock();
        if let Some(group) = store.groups.get_mut(&self.key) {
            group.observers.retain(|(id, _)| *id != self.id);
            if group.is_idle(now) {
                store.groups.remove(&self.key);
            }
        }
    }
}

#[derive(Default)]
struct Store {
    /// The last observer id handed out.
    next_observer: u64,
    /// Names that are held or waited for (an entry is removed when neither).
    entries: HashMap<LockName, Entry>,
    /// The names' semaphores and read-write locks (separate from their mutexes).
    groups: HashMap<(LockName, GroupKind), Group>,
    /// The last fencing token issued, for any name: tokens of one name increase because
    /// all tokens do, and a name needs no state of its own once it is free.
    fence: u64,
    /// Entries left by waiters that have gone are swept when the map has grown past this.
    sweep_at: usize,
}

impl Store {
    /// The entry of `name`, created if needed.
    fn entry(&mut self, name: &LockName) -> &mut Entry {
        if !self.entries.contains_key(name) {
            self.entries.insert(name.clone(), Entry::default());
        }
        self.entries.get_mut(name).expect("inserted above")
    }

    /// Forgets `name` if nobody holds or waits for it; now and then, every such name.
    fn tidy(&mut self, name: &LockName, now: Instant) {
        if self.entries.get_mut(name).is_some_and(|e| e.is_idle(now)) {
            self.entries.remove(name);
        }
        if self.entries.len() + self.groups.len() > self.sweep_at {
            self.entries.retain(|_, e| !e.is_idle(now));
            self.groups.retain(|_, g| !g.is_idle(now));
            self.sweep_at = 2 * (self.entries.len() + self.groups.len()) + 64;
        }
    }
}

#[derive(Default)]
struct Entry {
    holder: Option<Holder>,
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

    /// Nobody holds it (or the holder's lease ran out) and nobody waits for it.
    fn is_idle(&mut self, now: Instant) -> bool {
        self.holder(now).is_none() && self.waiters.is_empty()
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
        let mut store = self.inner.store.lock();
        let held = store
            .entries
            .get_mut(&name)
            .and_then(|e| e.holder.take())
            .is_some();
        store.tidy(&name, self.inner.clock.now());
        held
    }

    /// How many waiters are subscribed to `name`'s release hints (to check that none is
    /// left behind).
    pub fn watchers(&self, name: &str) -> usize {
        let Ok(name) = LockName::new(name) else {
            return 0;
        };
        let store = self.inner.store.lock();
        store.entries.get(&name).map_or(0, |e| e.waiters.len())
    }

    /// How many waiters of `name` are asleep offering to take the lock over: a release
    /// made now would hand the lock to the longest waiting of them, in the same step,
    /// instead of letting it go free (a test waits for this before it releases, to see a
    /// hand-over).
    pub fn offers(&self, name: &str) -> usize {
        let Ok(name) = LockName::new(name) else {
            return 0;
        };
        let store = self.inner.store.lock();
        store.entries.get(&name).map_or(0, |e| e.waiters.offers())
    }

    /// How many lock names the store keeps state for: those held or waited for (and a few
    /// left by waiters that gave up, until the next sweep).
    pub fn names(&self) -> usize {
        let store = self.inner.store.lock();
        store.entries.len() + store.groups.len()
    }

    /// Runs the fault knobs, then `f` on the entry of `name` (and the store's last
    /// fencing token); forgets the entry afterwards if nobody holds or waits for it.
    fn with_entry<T>(
        &self,
        name: &LockName,
        f: impl FnOnce(&mut Entry, &mut u64, Instant) -> T,
    ) -> Result<T, BackendError> {
        self.inner.faults.before_call()?;
        let now = self.inner.clock.now();
        let mut guard = self.inner.store.lock();
        let store = &mut *guard;
        let entry = match store.entries.get_mut(name) {
            Some(entry) => entry,
            None => store.entries.entry(name.clone()).or_default(),
        };
        let out = f(entry, &mut store.fence, now);
        store.tidy(name, now);
        drop(guard);
        self.inner.faults.after_call()?;
        Ok(out)
    }

    /// Runs `f` on the group of `claim`'s kind of `name`, its expired holds dropped, with
    /// the store's fencing counter, after the injected faults.
    fn with_group<T>(
        &self,
        name: &LockName,
        claim: Claim,
        f: impl FnOnce(&mut Group, &mut u64, Instant) -> T,
    ) -> Result<T, BackendError> {
        let kind = GroupKind::of(claim).ok_or_else(|| {
            BackendError::new(BackendErrorKind::Unsupported, format!("a {claim} hold"))
        })?;
        self.inner.faults.before_call()?;
        let now = self.inner.clock.now();
        let mut guard = self.inner.store.lock();
        let store = &mut *guard;
        let key = (name.clone(), kind);
        let group = store.groups.entry(key.clone()).or_default();
        group.expire(now);
        let out = f(group, &mut store.fence, now);
        if store.groups.get_mut(&key).is_some_and(|g| g.is_idle(now)) {
            store.groups.remove(&key);
        }
        drop(guard);
        self.inner.faults.after_call()?;
        Ok(out)
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
            .field("names", &self.inner.store.lock().entries.len())
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
        let started = self.inner.clock.now();
        let fencing = self.inner.fencing;
        self.with_entry(name, |entry, last_fence, now| {
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
                *last_fence += 1;
                FencingToken::new(*last_fence)
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
        let started = self.inner.clock.now();
        self.with_entry(name, |entry, _, now| match entry.holder(now) {
            Some(holder) if holder.owner == *owner => {
                holder.expires_at = now + ttl;
                Some(self.lease(started, ttl, holder.fence))
            }
            _ => None,
        })
    }

    /// The token handed out with the acquisition (a token costs nothing here, so every
    /// lease carries one), if `owner` still holds `name`.
    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.fencing {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                "fencing is switched off (MemoryBackend::builder().fencing(false))",
            ));
        }
        self.with_entry(name, |entry, _, now| match entry.holder(now) {
            Some(holder) if holder.owner == *owner => holder.fence,
            _ => None,
        })
    }

    /// Releases, or hands the lock to a waiter of this store that offered to take it
    /// over (see [`WaitList::successor`](dlm_core::backend::WaitList::successor)): the
    /// same step then gives it a new lease and a new fencing token.
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let started = self.inner.clock.now();
        let fencing = self.inner.fencing;
        let mut handed = None;
        let released = self.with_entry(name, |entry, last_fence, now| {
            if entry.holder(now).is_none_or(|h| h.owner != *owner) {
                return false;
            }
            match entry.waiters.successor() {
                Some(next) => {
                    let fence = fencing.then(|| {
                        *last_fence += 1;
                        FencingToken::new(*last_fence)
                    });
                    entry.holder = Some(Holder {
                        owner: *next.owner(),
                        expires_at: now + next.ttl(),
                        fence,
                    });
                    handed = Some((next, fence));
                }
                None => {
                    entry.holder = None;
                    entry.waiters.notify_one();
                }
            }
            true
        });
        // Settled once the call's outcome is known: dropped on an error (the hand-over
        // may have been applied; the waiter undoes it).
        if let (Ok(_), Some((next, fence))) = (&released, handed) {
            let ttl = next.ttl();
            next.grant(self.lease(started, ttl, fence));
        }
        released
    }

    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        self.with_entry(name, |entry, _, now| {
            let held = entry.holder(now).is_some();
            entry.holder = None;
            entry.waiters.notify_one();
            held
        })
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        self.with_entry(name, |entry, _, now| {
            entry.holder(now).map(|h| h.expires_at - now)
        })
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let mut store = self.inner.store.lock();
        Some(store.entry(name).waiters.subscribe())
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        let store = self.inner.store.lock();
        store
            .entries
            .get(name)
            .is_some_and(|e| e.waiters.wake_pending())
    }

    /// The store's clock: a [`ManualClock`] moves the guards' view of their leases too.
    fn now(&self) -> Instant {
        self.inner.clock.now()
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn supports(&self, claim: Claim) -> bool {
        every_hold_kind(claim)
    }

    /// Tokens are handed out with every lease (`request.fenced` changes nothing).
    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        let (claim, ttl) = (request.claim, request.ttl);
        let started = self.inner.clock.now();
        let fencing = self.inner.fencing;
        let admitted = self.with_group(request.name, claim, |group, last_fence, now| {
            group.try_admit(
                request.name,
                claim,
                request.owner,
                now,
                ttl,
                request.label,
                || {
                    fencing.then(|| {
                        *last_fence += 1;
                        FencingToken::new(*last_fence)
                    })
                },
            )
        })??;
        Ok(group::outcome(admitted, |fence| {
            self.lease(started, ttl, fence)
        }))
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let started = self.inner.clock.now();
        self.with_group(name, claim, |group, _, now| {
            group.member(owner).map(|m| {
                m.expires_at = now + ttl;
                self.lease(started, ttl, m.fence)
            })
        })
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        self.with_group(name, claim, |group, _, _| group.release(owner))
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.fencing {
            return self.fence(name, owner); // the error that says fencing is off
        }
        self.with_group(name, claim, |group, _, _| {
            group.member(owner).and_then(|m| m.fence)
        })
    }

    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let kind = GroupKind::of(claim)?;
        let mut store = self.inner.store.lock();
        let group = store.groups.entry((name.clone(), kind)).or_default();
        Some(group.waiters.subscribe())
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.with_group(name, claim, |group, _, _| group.relabel(owner, label))
    }

    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        let kind = GroupKind::of(claim)?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut store = self.inner.store.lock();
        store.next_observer += 1;
        let id = store.next_observer;
        store
            .groups
            .entry((name.clone(), kind))
            .or_default()
            .observers
            .push((id, tx));
        let gone = ObserverGone {
            inner: Arc::downgrade(&self.inner),
            key: (name.clone(), kind),
            id,
        };
        Some(Watch::with_unsubscribe(rx, Box::new(gone)))
    }

    /// With fencing on (an election's term is its token).
    fn supports_elections(&self) -> bool {
        self.inner.fencing
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let started = self.inner.clock.now();
        self.with_group(name, Claim::Write, |group, _, now| {
            group
                .downgrade(writer, reader, now + ttl)
                .map(|fence| self.lease(started, ttl, fence))
        })
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.with_group(name, claim, |group, _, _| group.clear())
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        let kind = GroupKind::of(claim);
        self.with_group(name, claim, |group, _, now| {
            group.inspect(kind.expect("checked by with_group"), now)
        })
    }
}

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
