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
//! - **Names** are file names: no `/`, not `.` or `..`, at most 253 bytes; refused with
//!   `Error::InvalidArgument` when a handle is made.
//! - Semaphores, read-write locks and elections are not kept yet: refused with
//!   `Unsupported` when a handle is made.
#![deny(missing_docs)]

mod dir;
mod hints;
mod holders;
mod tokens;

use std::collections::HashMap;
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, FencingToken, Lease, LockBackend, LockName,
    OwnerToken, Watch,
};
use dlm_core::{Error, InvalidArgument};
use parking_lot::Mutex;
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread, pwrite};
use rustix::time::{ClockId, clock_gettime};

use crate::dir::{Dir, DirOptions, MUTEX_PREFIX};
use crate::hints::{Listener, Registry};
use crate::tokens::Tokens;

/// A name released again within this long of its last release by this backend is hot:
/// its file is kept at the release (the next hold opens it instead of creating it).
const HOT: Duration = Duration::from_secs(1);

/// How long a kept file stays unused before the backend removes it.
const IDLE: Duration = Duration::from_secs(1);

/// How long a waiter looks again after an attempt that found the lock held by a process
/// whose lease end is not known, or already past (a stopped holder keeps its kernel lock).
const UNKNOWN_HOLDER_LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Locks in a directory of the local file system, between the processes (and threads)
/// of one machine. Cloning shares the backend; see the [crate documentation](crate).
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

/// Builds a [`FileBackend`] with settings other than the defaults.
#[derive(Clone, Debug)]
#[must_use]
pub struct FileBackendBuilder {
    path: PathBuf,
    group_shared: bool,
    allow_network_fs: bool,
    fencing: bool,
}

impl FileBackendBuilder {
    /// Shares the directory with its group: made `0770` (lock files `0660`), and lock
    /// files made by other members of the group are used. The default is `false`: `0700`
    /// and this user's files only.
    pub fn group_shared(mut self, on: bool) -> Self {
        self.group_shared = on;
        self
    }

    /// Accepts a directory on a network file system (NFS, SMB/CIFS, FUSE, Ceph, AFS, 9p).
    /// Refused by default: there `flock` is the server's lock (or a local one that other
    /// machines do not see), which may be lost with a lease the client does not watch,
    /// and inotify does not see other machines' changes.
    pub fn allow_network_fs(mut self, on: bool) -> Self {
        self.allow_network_fs = on;
        self
    }

    /// Whether holds get fencing tokens (the default: yes). Off, the counter file is
    /// never touched and [`fencing_token`](dlm_core::LockGuard::fencing_token) is
    /// `Unsupported`.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Opens the directory (making it, and its missing parents, if it does not exist) and
    /// checks it. Nothing is created inside it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the directory cannot be trusted (a symbolic link,
    /// not a directory, another user's, writable by others, on a network file system);
    /// a [`BackendErrorKind::Permission`] error when it cannot be made or written.
    pub fn build(self) -> Result<FileBackend, Error> {
        let dir = Dir::open(
            &self.path,
            DirOptions {
                group_shared: self.group_shared,
                allow_network: self.allow_network_fs,
            },
        )?;
        let state = Arc::new(State {
            dir,
            holds: Mutex::new(HashMap::new()),
            probes: Arc::new(Mutex::new(HashMap::new())),
            registry: Arc::new(Registry::default()),
            tokens: Tokens::default(),
            fencing: self.fencing,
            recent: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            reaper_wake: Mutex::new(ReaperWake::default()),
        });
        Ok(FileBackend {
            inner: Arc::new(Inner {
                state,
                listener: Mutex::new(None),
                reaper: Mutex::new(None),
            }),
        })
    }
}

struct Inner {
    state: Arc<State>,
    /// The inotify thread, started by the first wait.
    listener: Mutex<Option<Listener>>,
    /// The thread that ends unrenewed leases, started by the first hold.
    reaper: Mutex<Option<Reaper>>,
}

/// What the backend's threads share with it.
struct State {
    dir: Dir,
    /// This process's holds, by name.
    holds: Mutex<HashMap<LockName, Hold>>,
    /// Lock files kept open between the attempts of this process's waiters: an attempt
    /// that closed its file would send every other process's waiters an event.
    probes: Arc<Mutex<HashMap<LockName, dir::OpenFile>>>,
    registry: Arc<Registry>,
    tokens: Tokens,
    fencing: bool,
    /// When this backend last released each name (within [`HOT`]).
    recent: Mutex<HashMap<LockName, Instant>>,
    /// The files kept at a release (hot names), with when: removed once [`IDLE`].
    kept: Mutex<HashMap<LockName, Instant>>,
    /// How to wake the lease thread, once it runs, and when it will look next.
    reaper_wake: Mutex<ReaperWake>,
}

/// The lease thread's wake-up: its channel, and when it plans to look next (a kick is
/// sent only for something due before that, so a busy backend does not wake it at every
/// hold).
#[derive(Default)]
struct ReaperWake {
    kick: Option<Sender<()>>,
    next: Option<Instant>,
}

/// One hold of this process: the locked file, kept open while held.
struct Hold {
    owner: OwnerToken,
    file: OwnedFd,
    /// The locked file's device and inode: the path must still name it.
    identity: (u64, u64),
    until: Instant,
    token: Option<FencingToken>,
}

/// One attempt at a kernel lock: the locked file and its device and inode, or (held by
/// another process) how long that holder's lease has left, when known.
type Attempt = Result<(OwnedFd, (u64, u64)), Option<Duration>>;

fn file_name(name: &LockName) -> String {
    format!("{MUTEX_PREFIX}{}", name.as_str())
}

fn monotonic_ns() -> i128 {
    let t = clock_gettime(ClockId::Monotonic);
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// Writes the hold's lease end into its file (the monotonic clock, in ns, which every
/// process of the machine shares), for other processes' inspections and waits.
fn write_until(file: &OwnedFd, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    let end = monotonic_ns() + i128::try_from(left.as_nanos()).unwrap_or(i128::MAX / 2);
    let end = i64::try_from(end).unwrap_or(i64::MAX);
    if let Err(e) = pwrite(file, &end.to_le_bytes(), 0) {
        log::debug!("dlm-file: cannot write a lease end: {e}");
    }
}

/// The lease end another process wrote into `file`: how long is left (zero when past or
/// unknown).
fn read_left(file: &OwnedFd) -> Option<Duration> {
    let mut buf = [0u8; 8];
    let n = pread(file, &mut buf, 0).ok()?;
    if n != 8 {
        return None;
    }
    let end = i128::from(i64::from_le_bytes(buf));
    let left = end - monotonic_ns();
    (left > 0).then(|| Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX)))
}

fn flock_error(e: Errno) -> BackendError {
    BackendError::new(BackendErrorKind::Other, format!("flock: {e}"))
}

impl State {
    /// Ends `hold` (already taken out of the table) and wakes a local waiter. The file
    /// is removed while it still names the locked inode (the removal is the release),
    /// then closed, which drops the kernel lock. A hot name's file (released again within
    /// [`HOT`]) is kept instead: unlocked, then closed; the lease thread removes it once
    /// it has been unused for [`IDLE`]. Creating and removing a file per hold costs the
    /// file system's journal 20-50x what opening a kept one does.
    ///
    /// Returns whether the file was still the hold's (not removed or replaced).
    fn end(&self, name: &LockName, hold: Hold) -> bool {
        let file = file_name(name);
        let now = Instant::now();
        let hot = self
            .recent
            .lock()
            .insert(name.clone(), now)
            .is_some_and(|last| now.duration_since(last) < HOT);
        let linked = match self.dir.identity_of(&file) {
            Ok(Some(id)) if id == hold.identity => {
                // The close (and the removal, for a name that is not hot) come back as
                // events: the local waiter is woken below, directly.
                self.registry.expect_own(name, if hot { 1 } else { 2 });
                if hot {
                    let _ = flock(&hold.file, FlockOperation::Unlock);
                    self.kept.lock().insert(name.clone(), now);
                    self.wake_reaper_by(now + IDLE);
                } else if let Err(e) = self.dir.remove(&file) {
                    log::warn!("dlm-file: {e}");
                }
                true
            }
            Ok(_) => false,
            Err(e) => {
                log::warn!("dlm-file: {e}");
                false
            }
        };
        drop(hold);
        self.registry.notify(name);
        linked
    }

    /// Makes the lease thread look by `at`, if it runs and plans to look later: `false`
    /// when it does not run.
    fn wake_reaper_by(&self, at: Instant) -> bool {
        let mut wake = self.reaper_wake.lock();
        let Some(kick) = wake.kick.clone() else {
            return false;
        };
        if wake.next.is_none_or(|next| at < next) {
            wake.next = Some(at);
            let _ = kick.try_send(());
        }
        true
    }

    /// Whether another backend (another process) holds `name`: one attempt at a shared
    /// lock of its file, given back at once; `Some(lease left)` when that is refused.
    /// (`/proc/locks` would not take the lock even for a moment, but a read of it that
    /// spans several system calls can miss an entry while other locks come and go.) The
    /// probe's file is open for writing, so its close is an event: a waiter refused in the
    /// moment the probe held the lock is woken by it.
    fn held_elsewhere(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
        let Some((fd, _)) = self.dir.open_file_with_id(&file_name(name), false)? else {
            return Ok(None);
        };
        match flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                let _ = flock(&fd, FlockOperation::Unlock);
                Ok(None)
            }
            Err(Errno::WOULDBLOCK) => Ok(Some(read_left(&fd).unwrap_or(Duration::ZERO))),
            Err(e) => Err(flock_error(e)),
        }
    }

    /// Removes the kept file of `name` if nobody holds it: locks it (one attempt), checks
    /// that the path still names it, removes it, closes it. An acquirer that opened it
    /// meanwhile finds its path gone after locking and makes a new one.
    fn sweep(&self, name: &LockName) {
        if self.holds.lock().contains_key(name) {
            return;
        }
        let file = file_name(name);
        let Ok(Some(fd)) = self.dir.open_file(&file, false) else {
            return;
        };
        if flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err() {
            return; // held: its holder's release decides
        }
        if let (Ok(id), Ok(Some(at))) = (dir::identity(&fd), self.dir.identity_of(&file))
            && id == at
            && let Err(e) = self.dir.remove(&file)
        {
            log::warn!("dlm-file: {e}");
        }
    }

    /// Removes every kept file now (the backend is going away).
    fn sweep_all(&self) {
        let names: Vec<LockName> = self.kept.lock().drain().map(|(n, _)| n).collect();
        for name in names {
            self.sweep(&name);
        }
    }

    /// Ends the holds whose lease has run out and removes the kept files unused for
    /// [`IDLE`]; when to look next.
    fn reap(&self) -> Option<Instant> {
        let now = Instant::now();
        let expired: Vec<(LockName, Hold)> = {
            let mut holds = self.holds.lock();
            let names: Vec<LockName> = holds
                .iter()
                .filter(|(_, h)| h.until <= now)
                .map(|(n, _)| n.clone())
                .collect();
            names
                .into_iter()
                .filter_map(|n| holds.remove(&n).map(|h| (n, h)))
                .collect()
        };
        for (name, hold) in expired {
            log::debug!(
                "dlm-file: lock {:?}: its lease ran out unrenewed",
                name.as_str()
            );
            self.end(&name, hold);
        }
        let idle: Vec<LockName> = {
            let mut kept = self.kept.lock();
            let due: Vec<LockName> = kept
                .iter()
                .filter(|(_, at)| now.duration_since(**at) >= IDLE)
                .map(|(n, _)| n.clone())
                .collect();
            for n in &due {
                kept.remove(n);
            }
            due
        };
        for name in idle {
            self.sweep(&name);
        }
        let recent = {
            let mut recent = self.recent.lock();
            recent.retain(|_, at| now.duration_since(*at) < HOT);
            recent.values().min().map(|at| *at + HOT)
        };
        let kept = self.kept.lock().values().min().map(|at| *at + IDLE);
        let lease = self.holds.lock().values().map(|h| h.until).min();
        [recent, kept, lease].into_iter().flatten().min()
    }

    /// Whether `hold`'s file is still the one at its path (not removed or replaced).
    fn still_linked(&self, name: &LockName, hold: &Hold) -> Result<bool, BackendError> {
        Ok(self.dir.identity_of(&file_name(name))? == Some(hold.identity))
    }

    /// One attempt at the kernel lock of `name`: the file locked and still at its path,
    /// or `None` (another process holds it: how long its lease has left, when known).
    fn lock_file(&self, name: &LockName) -> Result<Attempt, BackendError> {
        let file = file_name(name);
        // A file removed by its holder's release between our open and our lock is a dead
        // inode: lock the new one. Each pass follows a release: a few are plenty.
        for _ in 0..8 {
            let cached = self.probes.lock().remove(name);
            let (fd, id) = match cached {
                Some(probe) => probe,
                None => self
                    .dir
                    .open_file_with_id(&file, true)?
                    .expect("opened with create"),
            };
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) => {
                    if self.dir.identity_of(&file)? != Some(id) {
                        continue; // an old file, held by a release under way
                    }
                    let left = read_left(&fd);
                    if self.registry.has_waiters(name) {
                        // Kept for the next attempt: closing it would wake other
                        // processes' waiters for nothing.
                        self.probes.lock().insert(name.clone(), (fd, id));
                    } else {
                        self.registry.expect_own(name, 1);
                    }
                    return Ok(Err(left));
                }
                Err(Errno::INTR) => continue,
                Err(e) => return Err(flock_error(e)),
            }
            if self.dir.identity_of(&file)? == Some(id) {
                return Ok(Ok((fd, id)));
            }
            // Locked a file that its holder removed as it released: try the new one.
        }
        Ok(Err(None))
    }
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
        FileBackendBuilder {
            path: dir.as_ref().to_owned(),
            group_shared: false,
            allow_network_fs: false,
            fencing: true,
        }
    }

    /// The directory the locks are in.
    pub fn dir(&self) -> &Path {
        &self.inner.state.dir.path
    }

    /// The process that holds `name`'s kernel lock now, if any, from `/proc/locks`: for
    /// messages and diagnostics (a read of `/proc/locks` that spans several system calls
    /// can miss an entry while other locks come and go; whether a lock is held is asked
    /// of the lock itself).
    ///
    /// # Errors
    /// A bad name; `/proc/locks` unreadable; the lock file unusable.
    pub fn holder_pid(&self, name: &str) -> Result<Option<u32>, Error> {
        let name = LockName::new(name)?;
        dir::check_name(&name)?;
        Ok(self.holder_pid_of(&name)?)
    }

    fn holder_pid_of(&self, name: &LockName) -> Result<Option<u32>, BackendError> {
        let state = &self.inner.state;
        let Some(id) = state.dir.identity_of(&file_name(name))? else {
            return Ok(None);
        };
        holders::flock_holder(id.0, id.1).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Other,
                format!("cannot read /proc/locks: {e}"),
            )
        })
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

    fn lease(&self, hold: &Hold) -> Lease {
        let lease = Lease::new(hold.until);
        match hold.token {
            Some(t) => lease.with_fence(t),
            None => lease,
        }
    }

    fn acquire(
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
        {
            let mut listener = self.inner.listener.lock();
            if listener.is_none() {
                match Listener::start(&state.dir.fd, state.registry.clone()) {
                    Ok(l) => *listener = Some(l),
                    Err(e) => {
                        log::warn!("dlm-file: cannot watch the directory ({e}); waiters poll");
                        return None;
                    }
                }
            }
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
}

/// The thread that ends the holds whose lease ran out unrenewed; stopped and joined on
/// drop.
struct Reaper {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    fn start(state: Arc<State>) -> std::io::Result<Reaper> {
        let (kick, kicked) = crossbeam_channel::bounded(1);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        state.reaper_wake.lock().kick = Some(kick);
        let thread = std::thread::Builder::new()
            .name("dlm-file-leases".into())
            .spawn(move || reap(&state, &kicked, &stopped))?;
        Ok(Reaper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

fn reap(state: &State, kicked: &Receiver<()>, stopped: &Receiver<()>) {
    loop {
        let earliest = state.reap();
        // (A kick sent meanwhile for something sooner is in the channel: looked at at once.)
        state.reaper_wake.lock().next = earliest;
        let wait = earliest.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        crossbeam_channel::select! {
            recv(stopped) -> _ => return,
            recv(kicked) -> _ => {}
            default(wait) => {}
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ends_are_read_back_across_files() {
        let tmp = tempfile::tempdir().unwrap();
        let backend = FileBackend::new(tmp.path().join("d")).unwrap();
        let dir = &backend.inner.state.dir;
        let fd = dir.open_file("m.x", true).unwrap().unwrap();
        write_until(&fd, Instant::now() + Duration::from_secs(10));
        let other = dir.open_file("m.x", false).unwrap().unwrap();
        let left = read_left(&other).unwrap();
        assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
        write_until(&fd, Instant::now());
        assert_eq!(read_left(&other), None);
    }
}

/// The README's examples, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
