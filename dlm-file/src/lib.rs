//! The file backend of dlm: locks between the processes of one machine, with no server.
//!
//! A lock is a `flock(2)` on a file of one directory (`m.NAME`), taken by the kernel: a
//! process that ends for any reason frees its locks at once. The front in `dlm-core`
//! gives it what it gives every backend: waits with deadlines and interrupts, re-entrancy,
//! guards, the lost signal, fencing tokens, metrics.
//!
//! ```
//! use dlm_core::{Lock, LockClient};
//! use dlm_file::FileBackend;
//!
//! # let tmp = tempfile::tempdir()?;
//! # let dir = tmp.path().join("locks");
//! let backend = FileBackend::new(&dir)?;           // made 0700 if missing
//! let a = LockClient::new(backend.clone());
//! let b = LockClient::new(backend);                // or another process
//! let guard = a.get_lock("nightly")?.lock()?;
//! assert!(b.get_lock("nightly")?.try_lock()?.is_none());
//! let token = guard.fencing_token()?;              // increases across holders and crashes
//! # let _ = token;
//! drop(guard);
//! assert!(b.get_lock("nightly")?.try_lock()?.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What it keeps, and what it does not:
//! - **One holder at a time** among the processes that use the directory, by the
//!   kernel's lock. A holder that dies frees its lock at once; a waiter is woken by an
//!   inotify event of the directory (the holder's file removed by its release, or closed
//!   as its process ended), never by polling.
//! - **Files**: a name used once leaves no file (its release removes it); a name released
//!   again within a second keeps its file between holds (an open and a close per hold
//!   instead of a create and an unlink), removed once unused for a second or when the
//!   backend is dropped. A crashed holder's file stays until the name is next held.
//! - **Leases** end a hold that its owner stops renewing while its process lives (a fixed
//!   lease, a leaked guard past `max_hold`): a thread of the holder's process releases it
//!   then. A holder whose whole process is stopped (`SIGSTOP`, a debugger) keeps its lock
//!   however long it is stopped: nothing outside the process can end a kernel lock it
//!   holds. Fencing tokens still order its late writes.
//! - **A lock file removed or replaced** while held (by `force_unlock`, by hand, by a
//!   cleanup job) ends the hold: the next renewal compares the file's inode with the one
//!   locked and reports the lock lost, and the next acquisition makes a new file.
//! - **Fencing tokens** come from one counter per directory (`.tokens`), never below the
//!   wall clock in µs and never above a reservation made durable with `fdatasync` before
//!   a token passes it: they increase across holders, crashes and reboots (a directory on
//!   a tmpfs loses the counter at a reboot; the clock term keeps tokens increasing while
//!   the clock has not gone back). A token is drawn when it is read, or with the
//!   acquisition when the last hold of the lock read its token.
//! - **The directory** is made `0700` (files `0600`), or `0770`/`0660` when shared with
//!   its group on purpose. It is refused when it is a symbolic link, not a directory,
//!   owned by another user, writable by others, or on a network file system (NFS, SMB,
//!   FUSE...) unless allowed; lock files are opened without following symbolic links and
//!   refused when another user made them.
//! - **Semaphores, read-write locks and elections** are kept on the same kernel locks:
//!   a permit is the lock of one of the semaphore's slot files (at most 1,024 permits),
//!   readers share the lock of the read-write lock's file and its writer takes it alone,
//!   preferred by new readers while it waits; each hold's record (lease end, token,
//!   label) is in a file of its own, for inspection (see `group/files.rs`).
//! - **Names** are file names: no `/`, not `.` or `..`, at most 242 bytes; refused with
//!   `Error::InvalidArgument` when a handle is made.
#![deny(missing_docs)]

mod builder;

mod dir;

mod group;

mod hints;

mod mutex;

mod state;

mod tokens;

pub use builder::FileBackendBuilder;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, GroupRequest, Holders, Lease,
    LockBackend, LockName, OwnerToken, Watch, every_hold_kind,
};
use dlm_core::{Error, InvalidArgument};
use parking_lot::Mutex;

use crate::group::{HoldKey, MAX_PERMITS, Outcome, kind_of};
use crate::hints::Listener;
use crate::state::{Reaper, State, file_name, write_until};

/// Locks in a directory of the local file system, between the processes (and threads)
/// of one machine. Cloning shares the backend; see the [crate documentation](crate).
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

struct Inner {
    state: Arc<State>,
    /// The inotify thread, started by the first wait.
    listener: Mutex<Option<Listener>>,
    /// The thread that ends unrenewed leases, started by the first hold.
    reaper: Mutex<Option<Reaper>>,
}

impl FileBackend {
    /// A backend over the directory `dir`, with the default settings (see
    /// [`builder`](FileBackend::builder)).
    ///
    /// # Errors
    /// As [`FileBackendBuilder::build`].
    pub fn new(dir: impl AsRef<Path>) -> Result<FileBackend, Error> {
        FileBackend::builder(dir).build()
    }

    /// A builder for a backend over the directory `dir`.
    pub fn builder(dir: impl AsRef<Path>) -> FileBackendBuilder {
        FileBackendBuilder::new(dir.as_ref())
    }

    /// The directory the locks are in.
    pub fn dir(&self) -> &Path {
        &self.inner.state.dir.path
    }

    /// Starts the thread that ends unrenewed leases, if it is not running, and tells it
    /// about a lease that ends at `until`.
    fn reaper_knows(&self, until: Instant) {
        if self.inner.state.wake_reaper_by(until) {
            return;
        }
        let mut reaper = self.inner.reaper.lock();
        match reaper.as_ref() {
            Some(_) => {
                self.inner.state.wake_reaper_by(until);
            }
            None => match Reaper::start(self.inner.state.clone()) {
                Ok(r) => *reaper = Some(r),
                Err(e) => log::warn!(
                    "dlm-file: cannot start the lease thread ({e}); unrenewed leases end \
                     at the next attempt of this process only"
                ),
            },
        }
    }

    /// Starts the inotify thread if it is not running: `false` when it cannot run.
    fn listening(&self) -> bool {
        let state = &self.inner.state;
        let mut listener = self.inner.listener.lock();
        if listener.is_none() {
            match Listener::start(
                &state.dir.fd,
                state.registry.clone(),
                state.group_hints.clone(),
            ) {
                Ok(l) => *listener = Some(l),
                Err(e) => {
                    log::warn!("dlm-file: cannot watch the directory ({e}); waiters poll");
                    return false;
                }
            }
        }
        true
    }

    fn group_key(name: &LockName, claim: Claim, owner: &OwnerToken) -> HoldKey {
        (kind_of(claim), name.clone(), *owner)
    }

    fn group_lease(&self, until: Instant, token: Option<FencingToken>) -> Lease {
        self.reaper_knows(until);
        let lease = Lease::new(until);
        match token {
            Some(t) => lease.with_fence(t),
            None => lease,
        }
    }
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.inner.state.dir.path)
            .field("holds", &self.inner.state.holds.lock().len())
            .finish_non_exhaustive()
    }
}

impl LockBackend for FileBackend {
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.acquire(name, owner, ttl, false)
    }

    fn try_acquire_fenced(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError> {
        self.acquire(name, owner, ttl, true)
    }

    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let state = &self.inner.state;
        let until = Instant::now() + ttl;
        let mut holds = state.holds.lock();
        let Some(h) = holds.get_mut(name).filter(|h| h.owner == *owner) else {
            return Ok(None);
        };
        if h.until <= Instant::now() {
            let old = holds.remove(name).expect("present");
            drop(holds);
            state.end(name, old);
            return Ok(None);
        }
        if !state.still_linked(name, h)? {
            log::warn!(
                "dlm-file: lock {:?}: its file was removed or replaced while held",
                name.as_str()
            );
            holds.remove(name);
            return Ok(None);
        }
        h.until = until;
        write_until(&h.file, until);
        let lease = self.lease(h);
        drop(holds);
        self.reaper_knows(until);
        Ok(Some(lease))
    }

    fn fence(
        &self,
        name: &LockName,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        let state = &self.inner.state;
        if !state.fencing {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                "fencing is switched off for this file backend",
            ));
        }
        // Drawn while the hold's entry is locked: its release, which drops the kernel
        // lock, waits for the draw, so every later holder draws after it.
        let mut holds = state.holds.lock();
        let Some(h) = holds.get_mut(name).filter(|h| h.owner == *owner) else {
            return Ok(None);
        };
        if h.until <= Instant::now() || !state.still_linked(name, h)? {
            return Ok(None);
        }
        let token = state.tokens.draw(&state.dir)?;
        h.token = Some(token);
        Ok(Some(token))
    }

    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError> {
        let state = &self.inner.state;
        let hold = {
            let mut holds = state.holds.lock();
            match holds.get(name) {
                Some(h) if h.owner == *owner => holds.remove(name),
                _ => None,
            }
        };
        let Some(hold) = hold else {
            return Ok(false);
        };
        let unexpired = hold.until > Instant::now();
        let linked = state.end(name, hold);
        Ok(unexpired && linked)
    }

    /// Removes the lock file: the next acquisition makes a new one, and the holder, whose
    /// kernel lock is on the removed file, learns that it lost the lock at its next
    /// renewal (the file at the path is no longer the one it locked), as a holder of any
    /// backend learns of a forced release. A hold of this backend ends at once.
    fn force_release(&self, name: &LockName) -> Result<bool, BackendError> {
        let state = &self.inner.state;
        let local = state.holds.lock().remove(name);
        if let Some(hold) = local {
            state.end(name, hold);
            return Ok(true);
        }
        let held = state.held_elsewhere(name)?.is_some();
        if held {
            state.dir.remove(&file_name(name))?;
            state.registry.notify(name);
        }
        Ok(held)
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let state = &self.inner.state;
        if let Some(h) = state.holds.lock().get(name) {
            let left = h.until.saturating_duration_since(Instant::now());
            return Ok((!left.is_zero()).then_some(left));
        }
        state.held_elsewhere(name)
    }

    fn watch(&self, name: &LockName) -> Option<Watch> {
        let state = &self.inner.state;
        if !self.listening() {
            return None;
        }
        let probes = state.probes.clone();
        Some(state.registry.subscribe(
            name,
            Box::new(move |name| {
                // The last local waiter left: nobody here waits for the probe's close.
                probes.lock().remove(name);
            }),
        ))
    }

    fn wake_pending(&self, name: &LockName) -> bool {
        self.inner.state.registry.wake_pending(name)
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn check_name(&self, name: &LockName) -> Result<(), InvalidArgument> {
        dir::check_name(name)
    }

    fn check_claim(&self, claim: Claim) -> Result<(), InvalidArgument> {
        match claim {
            Claim::Permit { permits } if permits > MAX_PERMITS => Err(InvalidArgument::new(
                "permits",
                format!(
                    "{permits}: a semaphore of the file backend has at most {MAX_PERMITS} \
                     permits (an attempt tries each permit's file in turn)"
                ),
            )),
            _ => Ok(()),
        }
    }

    fn supports(&self, claim: Claim) -> bool {
        every_hold_kind(claim)
    }

    fn supports_elections(&self) -> bool {
        true
    }

    fn try_acquire_group(&self, request: &GroupRequest<'_>) -> Result<Acquire, BackendError> {
        if let Claim::Permit { permits } = request.claim
            && permits > MAX_PERMITS
        {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                format!("a semaphore of the file backend has at most {MAX_PERMITS} permits"),
            )
            .never_sent());
        }
        match self.inner.state.try_group(request)? {
            Outcome::Granted { until, token } => {
                Ok(Acquire::Acquired(self.group_lease(until, token)))
            }
            Outcome::Refused { retry, mark } => {
                if let Some(mark) = mark {
                    self.reaper_knows(mark);
                }
                Ok(Acquire::Held {
                    retry_after: Some(retry),
                })
            }
        }
    }

    fn extend_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        let key = Self::group_key(name, claim, owner);
        Ok(self
            .inner
            .state
            .extend_group(&key, ttl)?
            .map(|(until, token)| self.group_lease(until, token)))
    }

    fn release_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<bool, BackendError> {
        Ok(self
            .inner
            .state
            .release_group(&Self::group_key(name, claim, owner)))
    }

    fn fence_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
    ) -> Result<Option<FencingToken>, BackendError> {
        if !self.inner.state.fencing {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                "fencing is switched off for this file backend",
            ));
        }
        self.inner
            .state
            .fence_group(&Self::group_key(name, claim, owner))
    }

    fn watch_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.listening().then(|| {
            self.inner
                .state
                .group_hints
                .subscribe((kind_of(claim), name.clone()), false)
        })
    }

    fn relabel_group(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        label: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.inner
            .state
            .relabel_group(&Self::group_key(name, claim, owner), label)
    }

    fn observe_group(&self, name: &LockName, claim: Claim) -> Option<Watch> {
        self.listening().then(|| {
            self.inner
                .state
                .group_hints
                .subscribe((kind_of(claim), name.clone()), true)
        })
    }

    fn downgrade(
        &self,
        name: &LockName,
        writer: &OwnerToken,
        reader: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError> {
        Ok(self
            .inner
            .state
            .downgrade(name, writer, reader, ttl)?
            .map(|(until, token)| self.group_lease(until, token)))
    }

    fn force_release_group(&self, name: &LockName, claim: Claim) -> Result<bool, BackendError> {
        self.inner.state.force_release_group(kind_of(claim), name)
    }

    fn inspect_group(&self, name: &LockName, claim: Claim) -> Result<Holders, BackendError> {
        self.inner.state.inspect_group(kind_of(claim), name)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The threads first (they hold the state), then the kept files go, and the holds'
        // files close with the state.
        drop(self.reaper.lock().take());
        drop(self.listener.lock().take());
        self.state.sweep_all();
    }
}

/// The README's examples, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
