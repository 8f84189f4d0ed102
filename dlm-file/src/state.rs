//! The backend's state shared with its threads: this process's holds, the files kept
//! for hot names, the lease thread that ends unrenewed holds and removes idle files, and
//! the kernel-lock attempt at the heart of an acquisition.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dlm_core::backend::{BackendError, BackendErrorKind, FencingToken, LockName, OwnerToken};
use parking_lot::Mutex;
use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, pread, pwrite};
use rustix::time::{ClockId, clock_gettime};

use crate::dir::{self, Attempted, Dir, MUTEX_PREFIX};
use crate::group::{GroupHold, HoldKey, Mark};
use crate::hints::{GroupHints, Registry};
use crate::tokens::Tokens;

/// A name released again within this long of its last release by this backend is hot:
/// its file is kept at the release (the next hold opens it instead of creating it).
pub(crate) const HOT: Duration = Duration::from_secs(1);

/// How long a kept file stays unused before the backend removes it.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// What the backend's threads share with it.
pub(crate) struct State {
    pub(crate) dir: Dir,
    /// This process's holds, by name.
    pub(crate) holds: Mutex<HashMap<LockName, Hold>>,
    /// Lock files kept open between the attempts of this process's waiters: an attempt
    /// that closed its file would send every other process's waiters an event.
    pub(crate) probes: Arc<Mutex<HashMap<LockName, dir::OpenFile>>>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tokens: Tokens,
    pub(crate) fencing: bool,
    /// When this backend last released each name (within [`HOT`]).
    pub(crate) recent: Mutex<HashMap<LockName, Instant>>,
    /// The files kept at a release (hot names), with when: removed once [`IDLE`].
    pub(crate) kept: Mutex<HashMap<LockName, Instant>>,
    /// How to wake the lease thread, once it runs, and when it will look next.
    pub(crate) reaper_wake: Mutex<ReaperWake>,
    /// This process's semaphore permits and read and write holds.
    pub(crate) groups: Mutex<HashMap<HoldKey, GroupHold>>,
    /// The marks of this process's writers that wait for readers to leave.
    pub(crate) marks: Mutex<HashMap<LockName, Mark>>,
    /// The waiters and observers of this process's group resources.
    pub(crate) group_hints: Arc<GroupHints>,
}

/// The lease thread's wake-up: its channel, and when it plans to look next (a kick is
/// sent only for something due before that, so a busy backend does not wake it at every
/// hold).
#[derive(Default)]
pub(crate) struct ReaperWake {
    pub(crate) kick: Option<Sender<()>>,
    pub(crate) next: Option<Instant>,
}

/// One hold of this process: the locked file, kept open while held.
pub(crate) struct Hold {
    pub(crate) owner: OwnerToken,
    pub(crate) file: OwnedFd,
    /// The locked file's device and inode: the path must still name it.
    pub(crate) identity: (u64, u64),
    pub(crate) until: Instant,
    pub(crate) token: Option<FencingToken>,
}

/// One attempt at a kernel lock: the locked file and its device and inode, or (held by
/// another process) how long that holder's lease has left, when known.
pub(crate) type Attempt = Result<(OwnedFd, (u64, u64)), Option<Duration>>;

pub(crate) fn file_name(name: &LockName) -> String {
    format!("{MUTEX_PREFIX}{}", name.as_str())
}

pub(crate) fn monotonic_ns() -> i128 {
    let t = clock_gettime(ClockId::Monotonic);
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// Writes the hold's lease end into its file (the monotonic clock, in ns, which every
/// process of the machine shares), for other processes' inspections and waits.
pub(crate) fn write_until(file: &OwnedFd, until: Instant) {
    if let Err(e) = pwrite(file, &until_bytes(until), 0) {
        log::debug!("dlm-file: cannot write a lease end: {e}");
    }
}

/// `until` as every process of the machine reads it: the monotonic clock, in ns.
pub(crate) fn until_bytes(until: Instant) -> [u8; 8] {
    // `Instant` is the monotonic clock on Linux: an instant's ns are those of a moment
    // read once, plus the time between them (no clock read per hold).
    static BASE: OnceLock<(Instant, i128)> = OnceLock::new();
    let (at, ns) = *BASE.get_or_init(|| {
        let _ = monotonic_ns(); // (the first read may set the vDSO up)
        let before = monotonic_ns();
        let at = Instant::now();
        (at, (before + monotonic_ns()) / 2)
    });
    let nanos = |d: Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX / 4);
    let end = match until.checked_duration_since(at) {
        Some(after) => ns + nanos(after),
        None => ns - nanos(at.duration_since(until)),
    };
    i64::try_from(end).unwrap_or(i64::MAX).to_le_bytes()
}

/// The lease end another process wrote into `file`: how long is left (zero when past or
/// unknown).
pub(crate) fn read_left(file: &OwnedFd) -> Option<Duration> {
    let mut buf = [0u8; 8];
    let n = pread(file, &mut buf, 0).ok()?;
    if n != 8 {
        return None;
    }
    let end = i128::from(i64::from_le_bytes(buf));
    let left = end - monotonic_ns();
    (left > 0).then(|| Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX)))
}

pub(crate) fn flock_error(e: Errno) -> BackendError {
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
    pub(crate) fn end(&self, name: &LockName, hold: Hold) -> bool {
        let now = Instant::now();
        let hot = self
            .recent
            .lock()
            .insert(name.clone(), now)
            .is_some_and(|last| now.duration_since(last) < HOT);
        // A hot name's file stays: whether it is still the hold's needs no look-up of its
        // path (a file removed, or replaced by a rename, has no link left). A removal
        // must know that the path names the locked file.
        let at = if hot {
            Ok(rustix::fs::fstat(&hold.file)
                .ok()
                .filter(|st| st.st_nlink > 0)
                .map(|st| (st.st_dev, st.st_ino)))
        } else {
            self.dir.identity_of(&file_name(name))
        };
        let linked = match at {
            Ok(Some(id)) if id == hold.identity => {
                // The close (and the removal, for a name that is not hot) come back as
                // events: the local waiter is woken below, directly.
                self.registry.expect_own(name, if hot { 1 } else { 2 });
                if hot {
                    let _ = flock(&hold.file, FlockOperation::Unlock);
                    self.kept.lock().insert(name.clone(), now);
                    self.wake_reaper_by(now + IDLE);
                } else if let Err(e) = self.dir.remove(&file_name(name)) {
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
    pub(crate) fn wake_reaper_by(&self, at: Instant) -> bool {
        let mut wake = self.reaper_wake.lock();
        let ReaperWake { kick, next } = &mut *wake;
        let Some(kick) = kick else {
            return false;
        };
        if next.is_none_or(|n| at < n) {
            *next = Some(at);
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
    pub(crate) fn held_elsewhere(&self, name: &LockName) -> Result<Option<Duration>, BackendError> {
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
    pub(crate) fn sweep(&self, name: &LockName) {
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

    /// Removes every kept file now, and ends this process's writers' marks (the backend
    /// is going away).
    pub(crate) fn sweep_all(&self) {
        let names: Vec<LockName> = self.kept.lock().drain().map(|(n, _)| n).collect();
        for name in names {
            self.sweep(&name);
        }
        let marks: Vec<(LockName, Mark)> = self.marks.lock().drain().collect();
        for (name, mark) in marks {
            self.end_mark(&name, mark);
        }
    }

    /// Ends the holds whose lease has run out and removes the kept files unused for
    /// [`IDLE`]; when to look next.
    pub(crate) fn reap(&self) -> Option<Instant> {
        let now = Instant::now();
        let expired: Vec<(LockName, Hold)> = self
            .holds
            .lock()
            .extract_if(|_, h| h.until <= now)
            .collect();
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
        let groups = self.reap_groups(now);
        [recent, kept, lease, groups].into_iter().flatten().min()
    }

    /// Whether `hold`'s file is still the one at its path (not removed or replaced).
    pub(crate) fn still_linked(&self, name: &LockName, hold: &Hold) -> Result<bool, BackendError> {
        Ok(self.dir.identity_of(&file_name(name))? == Some(hold.identity))
    }

    /// One attempt at the kernel lock of `name`: the file locked and still at its path,
    /// or `None` (another process holds it: how long its lease has left, when known).
    pub(crate) fn lock_file(&self, name: &LockName) -> Result<Attempt, BackendError> {
        let file = file_name(name);
        // A file removed by its holder's release between our open and our lock is a dead
        // inode: lock the new one. Each pass follows a release: a few are plenty.
        for _ in 0..8 {
            let cached = self.probes.lock().remove(name);
            let op = FlockOperation::NonBlockingLockExclusive;
            let attempt = match cached {
                Some((fd, _)) => self.dir.lock_opened(&file, fd, op)?,
                None => self
                    .dir
                    .lock(&file, op, true, true)?
                    .expect("opened with create"),
            };
            match attempt {
                Attempted::Locked(locked) => return Ok(Ok(locked)),
                // Locked (or refused by) a file that its holder removed as it released:
                // try the new one.
                Attempted::Unlinked => {}
                Attempted::Refused((fd, id)) => {
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
            }
        }
        Ok(Err(None))
    }
}

/// The thread that ends the holds whose lease ran out unrenewed; stopped and joined on
/// drop.
pub(crate) struct Reaper {
    pub(crate) stop: Option<Sender<()>>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl Reaper {
    pub(crate) fn start(state: Arc<State>) -> std::io::Result<Reaper> {
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

pub(crate) fn reap(state: &State, kicked: &Receiver<()>, stopped: &Receiver<()>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ends_are_read_back_across_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::for_tests(&tmp.path().join("d"));
        let fd = dir.open_file("m.x", true).unwrap().unwrap();
        write_until(&fd, Instant::now() + Duration::from_secs(10));
        let other = dir.open_file("m.x", false).unwrap().unwrap();
        let left = read_left(&other).unwrap();
        assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
        write_until(&fd, Instant::now());
        assert_eq!(read_left(&other), None);
    }
}
