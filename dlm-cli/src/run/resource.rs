//! What `dlm` takes: the lock NAME (the mutex), a permit of the semaphore NAME
//! (`--permits N`), or a read or write hold of the read-write lock NAME (`--shared`,
//! `--exclusive`). [`Resource`] makes the acquisition pluggable: the run and hold code
//! needs a [`Held`] guard, however it was acquired.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::{Claim, LockBackend};
use dlm_core::{
    BackendErrorKind, DistributedLock, Error, Interrupt, Lock, LockClient, LockGuard, LockName,
    ReadWriteLock, Semaphore, WriteGuard,
};

use crate::backend::Connection;
use crate::exit::Failure;

/// Which of a name's three resources: `--permits`, `--shared`, `--exclusive` or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The mutex (plain `dlm run NAME`).
    Lock,
    /// One of N permits of the semaphore NAME.
    Permits(u32),
    /// A read hold of the read-write lock NAME.
    Shared,
    /// The write hold of the read-write lock NAME (not the mutex NAME).
    Exclusive,
    /// The read-write lock NAME as a whole (`dlm status --shared`: readers and writer).
    Rw,
}

impl Kind {
    /// The flag that chose it, for messages.
    fn flag(self) -> &'static str {
        match self {
            Kind::Lock => "the lock",
            Kind::Permits(_) => "--permits",
            Kind::Shared => "--shared",
            Kind::Exclusive => "--exclusive",
            Kind::Rw => "--rw",
        }
    }

    /// The backend's name for it, as [`LockBackend::inspect_group`] takes it.
    fn claim(self) -> Claim {
        match self {
            Kind::Lock => Claim::Exclusive,
            Kind::Permits(permits) => Claim::Permit { permits },
            Kind::Shared | Kind::Rw => Claim::Read,
            Kind::Exclusive => Claim::Write,
        }
    }
}

/// A handle on the resource `dlm` takes, built without I/O.
#[derive(Clone)]
pub(crate) struct Resource {
    handle: Handle,
    backend: Arc<dyn LockBackend>,
    name: LockName,
    kind: Kind,
}

#[derive(Clone)]
enum Handle {
    Lock(DistributedLock),
    Semaphore(Semaphore),
    Rw(ReadWriteLock),
}

/// A hold, however it was acquired: the mutex's, a permit, a read hold, or a write hold
/// taken as a plain [`LockGuard`] ([`WriteGuard::into_guard`]): fencing token, lost
/// signal, `is_held` and `unlock` are the same for all.
pub(crate) type Held = LockGuard;

impl Resource {
    /// `kind` of `name` on `client` (no I/O). A backend that keeps no such resource
    /// (Redlock) is refused here, as a usage error that names it.
    pub(crate) fn new(
        conn: &Connection,
        client: &LockClient,
        name: &LockName,
        kind: Kind,
    ) -> Result<Resource, Failure> {
        let refused = |e: Error| {
            if e.backend_kind() == Some(BackendErrorKind::Unsupported) {
                let what = if matches!(kind, Kind::Permits(_)) {
                    "semaphores"
                } else {
                    "read-write locks"
                };
                log::info!("{e}");
                return Failure::usage(format!(
                    "{}: {} keeps no {what}; they need one Redis server, --sentinel, --cluster or --etcd",
                    kind.flag(),
                    conn.describe
                ));
            }
            Failure::from_lock_error("bad lock name", &e)
        };
        let handle = match kind {
            Kind::Lock => Handle::Lock(client.get_lock(name.as_str()).map_err(refused)?),
            Kind::Permits(n) => {
                Handle::Semaphore(client.get_semaphore(name.as_str(), n).map_err(refused)?)
            }
            Kind::Shared | Kind::Exclusive | Kind::Rw => {
                Handle::Rw(client.get_rw_lock(name.as_str()).map_err(refused)?)
            }
        };
        Ok(Resource {
            handle,
            backend: client.backend().clone(),
            name: name.clone(),
            kind,
        })
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// One attempt: the hold, or `None` when it is taken.
    pub(crate) fn try_once(&self) -> dlm_core::Result<Option<Held>> {
        match (&self.handle, self.kind) {
            (Handle::Lock(l), _) => l.try_lock(),
            (Handle::Semaphore(s), _) => s.try_acquire(),
            (Handle::Rw(rw), Kind::Exclusive) => Ok(rw.try_write()?.map(WriteGuard::into_guard)),
            (Handle::Rw(rw), _) => rw.try_read(),
        }
    }

    /// Waits for the hold, at most `wait` (`None`: as long as it takes); `interrupt` ends
    /// the wait with [`Error::Interrupted`]. `None` when the wait ran out.
    pub(crate) fn wait_for(
        &self,
        wait: Option<Duration>,
        interrupt: &Interrupt,
    ) -> dlm_core::Result<Option<Held>> {
        match (&self.handle, self.kind, wait) {
            (Handle::Lock(l), _, Some(w)) => l.try_lock_interruptibly(w, interrupt),
            (Handle::Lock(l), _, None) => l.lock_interruptibly(interrupt).map(Some),
            (Handle::Semaphore(s), _, Some(w)) => s.try_acquire_interruptibly(w, interrupt),
            (Handle::Semaphore(s), _, None) => s.acquire_interruptibly(interrupt).map(Some),
            (Handle::Rw(rw), Kind::Exclusive, Some(w)) => Ok(rw
                .try_write_interruptibly(w, interrupt)?
                .map(WriteGuard::into_guard)),
            (Handle::Rw(rw), Kind::Exclusive, None) => rw
                .write_interruptibly(interrupt)
                .map(WriteGuard::into_guard)
                .map(Some),
            (Handle::Rw(rw), _, Some(w)) => rw.try_read_interruptibly(w, interrupt),
            (Handle::Rw(rw), _, None) => rw.read_interruptibly(interrupt).map(Some),
        }
    }

    /// Who holds it now: the number of holders and the longest remaining lease among
    /// them, `None` when free (asks the backend).
    pub(crate) fn inspect(&self) -> dlm_core::Result<Option<(u32, Duration)>> {
        match &self.handle {
            Handle::Lock(l) => Ok(l.remaining_lease()?.map(|r| (1, r))),
            _ => Ok(self.backend.inspect_group(&self.name, self.kind.claim())?),
        }
    }

    /// What holds it, for the line shown while waiting: `holders` and `lease` from
    /// [`Resource::inspect`].
    pub(crate) fn holders_text(&self, holders: u32, lease: Duration) -> String {
        let secs = lease.as_secs();
        match self.kind {
            Kind::Lock => format!("held by another owner, lease ends in {secs}s"),
            Kind::Permits(n) => format!("{holders} of {n} permits taken"),
            Kind::Shared | Kind::Exclusive | Kind::Rw => format!(
                "{holders} holder{}, the longest lease ends in {secs}s",
                if holders == 1 { "" } else { "s" }
            ),
        }
    }
}
