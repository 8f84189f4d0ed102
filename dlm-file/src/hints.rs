//! Release hints: an inotify watch of the directory, read by one thread per backend.
//!
//! A holder's lock file is open for writing while it holds it, so its end shows as an
//! event whatever the cause: a release removes the file (`IN_DELETE`), a process that dies
//! closes it (`IN_CLOSE_WRITE`, sent by the kernel as it closes the dead process's files).
//! Each event wakes one waiter of this process for that name (the front's turns order
//! them); releases made by this process wake their local waiter directly, without waiting
//! for the event.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dlm_core::backend::{LockName, Unsubscribe, WaitList, Watch};
use parking_lot::Mutex;
use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use crate::dir::MUTEX_PREFIX;

/// How long after an event for a name an attempt that still finds it held looks again
/// soon ([`Hints::recently_hinted`]): a dying process's file is reported closed a moment
/// before the kernel drops its lock.
pub(crate) const SETTLE: Duration = Duration::from_millis(10);

/// How soon such an attempt looks again.
pub(crate) const SETTLE_LOOK_AGAIN: Duration = Duration::from_millis(2);

/// How long this process's own change of a lock file may take to come back as an
/// event; an event later than that is taken as another process's.
const OWN_ECHO: Duration = Duration::from_millis(50);

/// The waiters of this process, per name, and when each name last had an event.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    lists: Mutex<HashMap<LockName, (WaitList, Option<Instant>)>>,
    /// Events this process's own changes will send (a release's removal and close, a
    /// probe's close), per name, with the time of the last: the listener lets that many
    /// events of the name pass without waking anyone (the release woke its waiter
    /// directly).
    own: Mutex<HashMap<LockName, (u32, Instant)>>,
}

impl Registry {
    /// Wakes one local waiter of `name` (a release by this process).
    pub(crate) fn notify(&self, name: &LockName) {
        let lists = self.lists.lock();
        if lists.is_empty() {
            return; // (no hashing of the name when nobody here waits)
        }
        if let Some((list, _)) = lists.get(name) {
            list.notify_one();
        }
    }

    /// This process is about to make `events` events for `name` (see `own`), if anyone
    /// of this process waits for it.
    pub(crate) fn expect_own(&self, name: &LockName, events: u32) {
        if events == 0 || !self.has_waiters(name) {
            return;
        }
        let mut own = self.own.lock();
        let entry = own.entry(name.clone()).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= OWN_ECHO {
            entry.0 = 0;
        }
        *entry = (entry.0 + events, Instant::now());
    }

    /// An event of the directory for `name`: one of this process's own changes coming
    /// back (passed over: the change woke its waiter directly), or another process's,
    /// which wakes one local waiter. Each foreign event is delivered once even when the
    /// events interleave, since exactly as many are passed over as this process made; an
    /// own event that never comes is forgotten after [`OWN_ECHO`].
    fn event(&self, name: &LockName) {
        {
            let mut own = self.own.lock();
            if let Some(entry) = own.get_mut(name) {
                let fresh = entry.1.elapsed() < OWN_ECHO;
                if fresh && entry.0 > 0 {
                    entry.0 -= 1;
                    if entry.0 == 0 {
                        own.remove(name);
                    }
                    return;
                }
                own.remove(name);
            }
        }
        if let Some((list, at)) = self.lists.lock().get_mut(name) {
            *at = Some(Instant::now());
            list.notify_one();
        }
    }

    fn notify_all(&self) {
        for (list, _) in self.lists.lock().values() {
            list.notify_all();
        }
    }

    /// Whether a woken waiter of `name` has not made its attempt yet.
    pub(crate) fn wake_pending(&self, name: &LockName) -> bool {
        let lists = self.lists.lock();
        !lists.is_empty() && lists.get(name).is_some_and(|(list, _)| list.wake_pending())
    }

    /// Whether `name` had an event within [`SETTLE`].
    pub(crate) fn recently_hinted(&self, name: &LockName) -> bool {
        self.lists
            .lock()
            .get(name)
            .and_then(|(_, at)| *at)
            .is_some_and(|at| at.elapsed() < SETTLE)
    }

    /// Whether this process has waiters for `name`.
    pub(crate) fn has_waiters(&self, name: &LockName) -> bool {
        let lists = self.lists.lock();
        !lists.is_empty() && lists.get(name).is_some_and(|(list, _)| !list.is_empty())
    }

    /// A subscription to `name`'s hints; `on_last` runs when the last waiter of the
    /// name leaves.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        name: &LockName,
        on_last: Box<dyn Fn(&LockName) + Send + Sync>,
    ) -> Watch {
        let inner = self
            .lists
            .lock()
            .entry(name.clone())
            .or_insert_with(|| (WaitList::new(), None))
            .0
            .subscribe();
        let receiver = inner.receiver().clone();
        Watch::with_unsubscribe(
            receiver,
            Box::new(Subscription {
                inner: Some(inner),
                registry: self.clone(),
                name: name.clone(),
                on_last,
            }),
        )
    }
}

/// Which group resource a file of the directory belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GroupKind {
    /// A semaphore: `s.NAME` (its permit count) and its slots `p.NAME.I`.
    Semaphore,
    /// A read-write lock: `r.NAME` (read and write holds), `x.NAME` (its writer),
    /// `w.NAME` (a waiting writer's mark) and the readers' records `q.NAME.I`.
    ReadWrite,
}

/// A group resource: its kind and name.
pub(crate) type GroupKey = (GroupKind, LockName);

/// The group resource a file of the directory is part of, from its name.
pub(crate) fn group_of(file: &str) -> Option<GroupKey> {
    let (prefix, rest) = file.split_at_checked(2)?;
    let slot = |rest: &str| rest.rsplit_once('.').map(|(name, _)| name.to_owned());
    let (kind, name) = match prefix {
        "s." => (GroupKind::Semaphore, rest.to_owned()),
        "p." => (GroupKind::Semaphore, slot(rest)?),
        "r." | "w." | "x." => (GroupKind::ReadWrite, rest.to_owned()),
        "q." => (GroupKind::ReadWrite, slot(rest)?),
        _ => return None,
    };
    Some((kind, LockName::new(&name).ok()?))
}

/// The waiters and the observers of this process's group resources (semaphores and
/// read-write locks). Every event of a resource's files wakes all of them: several
/// waiters may get in at once (permits, readers), and an observer sees every change. An
/// event this process made itself wakes its waiters once more, which costs them an
/// attempt and nothing else.
#[derive(Debug, Default)]
pub(crate) struct GroupHints {
    lists: Mutex<HashMap<GroupKey, (WaitList, WaitList)>>,
    /// When each resource with waiters here last had an event of another process.
    events: Mutex<HashMap<GroupKey, Instant>>,
}

impl GroupHints {
    /// Wakes every waiter and observer of `key`.
    pub(crate) fn notify(&self, key: &GroupKey) {
        if let Some((waiters, observers)) = self.lists.lock().get(key) {
            waiters.notify_all();
            observers.notify_all();
        }
    }

    /// An event of the directory for `key`: wakes its waiters and observers, and
    /// remembers when (see [`recently_hinted`](GroupHints::recently_hinted)).
    fn event(&self, key: &GroupKey) {
        let lists = self.lists.lock();
        if let Some((waiters, observers)) = lists.get(key) {
            self.events.lock().insert(key.clone(), Instant::now());
            waiters.notify_all();
            observers.notify_all();
        }
    }

    /// Whether `key` had an event within [`SETTLE`]: a dying holder's file is reported
    /// closed a moment before the kernel drops all of its locks, so an attempt refused
    /// then looks again soon instead of at the dead holder's lease end.
    pub(crate) fn recently_hinted(&self, key: &GroupKey) -> bool {
        let mut events = self.events.lock();
        match events.get(key) {
            Some(at) if at.elapsed() < SETTLE => true,
            Some(_) => {
                events.remove(key);
                false
            }
            None => false,
        }
    }

    fn notify_all(&self) {
        for (waiters, observers) in self.lists.lock().values() {
            waiters.notify_all();
            observers.notify_all();
        }
    }

    /// A subscription to `key`'s hints, as a waiter or (`observer`) as an observer.
    pub(crate) fn subscribe(self: &Arc<Self>, key: GroupKey, observer: bool) -> Watch {
        let inner = {
            let mut lists = self.lists.lock();
            let (waiters, observers) = lists
                .entry(key.clone())
                .or_insert_with(|| (WaitList::new(), WaitList::new()));
            if observer {
                observers.subscribe()
            } else {
                waiters.subscribe()
            }
        };
        let receiver = inner.receiver().clone();
        Watch::with_unsubscribe(
            receiver,
            Box::new(GroupSubscription {
                inner: Some(inner),
                hints: self.clone(),
                key,
            }),
        )
    }
}

struct GroupSubscription {
    inner: Option<Watch>,
    hints: Arc<GroupHints>,
    key: GroupKey,
}

impl Unsubscribe for GroupSubscription {
    fn trying(&self, on: bool) {
        if let Some(w) = &self.inner {
            w.trying(on);
        }
    }

    fn unsubscribe(mut self: Box<Self>, _pending_wake: bool) {
        drop(self.inner.take());
        let mut lists = self.hints.lists.lock();
        if lists
            .get(&self.key)
            .is_some_and(|(w, o)| w.is_empty() && o.is_empty())
        {
            lists.remove(&self.key);
        }
    }
}

struct Subscription {
    inner: Option<Watch>,
    registry: Arc<Registry>,
    name: LockName,
    on_last: Box<dyn Fn(&LockName) + Send + Sync>,
}

impl Unsubscribe for Subscription {
    fn trying(&self, on: bool) {
        if let Some(w) = &self.inner {
            w.trying(on);
        }
    }

    fn unsubscribe(mut self: Box<Self>, _pending_wake: bool) {
        // The list's own subscription passes an unused wake-up on when dropped.
        drop(self.inner.take());
        let last = {
            let mut lists = self.registry.lists.lock();
            let empty = lists.get(&self.name).is_some_and(|(l, _)| l.is_empty());
            if empty {
                lists.remove(&self.name);
            }
            empty
        };
        if last {
            (self.on_last)(&self.name);
        }
    }
}

/// The thread that reads the directory's inotify events; stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Listener {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Watches the directory open as `dir` (through `/proc/self/fd`, so a directory
    /// renamed or replaced at its path meanwhile changes nothing).
    pub(crate) fn start(
        dir: &OwnedFd,
        registry: Arc<Registry>,
        groups: Arc<GroupHints>,
    ) -> std::io::Result<Listener> {
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        inotify::add_watch(
            &inotify,
            path.as_str(),
            WatchFlags::CLOSE_WRITE | WatchFlags::DELETE | WatchFlags::MOVED_FROM,
        )?;
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let stop_reader = rustix::io::dup(&stop)?;
        let thread = std::thread::Builder::new()
            .name("dlm-file-hints".into())
            .spawn(move || listen(&inotify, &stop_reader, &registry, &groups))?;
        Ok(Listener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn listen(inotify: &OwnedFd, stop: &OwnedFd, registry: &Registry, groups: &GroupHints) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
    loop {
        let mut fds = [
            PollFd::new(inotify, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => {
                log::warn!("dlm-file: release hints stopped ({e}); waiters poll");
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let mut reader = inotify::Reader::new(inotify.as_fd(), &mut buf);
        loop {
            match reader.next() {
                Ok(event) => {
                    if event.events().contains(ReadFlags::QUEUE_OVERFLOW) {
                        registry.notify_all();
                        groups.notify_all();
                        continue;
                    }
                    let Some(file) = event.file_name().and_then(|f| f.to_str().ok()) else {
                        continue;
                    };
                    if let Some(name) = file
                        .strip_prefix(MUTEX_PREFIX)
                        .and_then(|n| LockName::new(n).ok())
                    {
                        registry.event(&name);
                    } else if let Some(key) = group_of(file) {
                        groups.event(&key);
                    }
                }
                Err(Errno::WOULDBLOCK | Errno::INTR) => break,
                Err(e) => {
                    log::warn!("dlm-file: reading release hints failed ({e}); waiters poll");
                    return;
                }
            }
        }
    }
}
