//! What `dlm` takes: the lock NAME (the mutex), a permit of the semaphore NAME
//! (`--permits N`), or a read or write hold of the read-write lock NAME (`--shared`,
//! `--exclusive`). [`Resource`] makes the acquisition pluggable: the run and hold code
//! needs a [`Held`] guard, however it was acquired.

use std::time::Duration;

use dlm_core::backend::Claim;
use dlm_core::{
    BackendErrorKind, DistributedLock, Election, Error, Holder, Holders, Interrupt, Lock,
    LockClient, LockGuard, LockName, ReadWriteLock, Semaphore, WriteGuard,
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
    /// The lead of the election NAME, publishing the client's label.
    Lead,
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
            Kind::Lead => "--elect",
        }
    }
}

/// A handle on the resource `dlm` takes, built without I/O.
#[derive(Clone)]
pub(crate) struct Resource {
    handle: Handle,
    kind: Kind,
    client: LockClient,
}

#[derive(Clone)]
enum Handle {
    Lock(DistributedLock),
    Semaphore(Semaphore),
    Rw(ReadWriteLock),
    Election(Election),
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
                let what = match kind {
                    Kind::Permits(_) => "semaphores",
                    Kind::Lead => "elections",
                    _ => "read-write locks",
                };
                if kind == Kind::Lead {
                    return Failure::usage(format!(
                        "--elect: {} keeps no elections; they need one Redis server (with fencing), --sentinel, --cluster, --etcd or --postgres",
                        conn.describe
                    ));
                }
                log::info!("{e}");
                return Failure::usage(format!(
                    "{}: {} keeps no {what}; they need one Redis server, --sentinel, --cluster, --etcd or --postgres",
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
            Kind::Lead => Handle::Election(client.get_election(name.as_str()).map_err(refused)?),
        };
        Ok(Resource {
            handle,
            kind,
            client: client.clone(),
        })
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Before dlm exits: waits (at most the library's default release wait, 5 s) for the
    /// releases that failed transiently and are being sent again, so that the lock is free
    /// for others now rather than at the end of its lease. (The client itself does not
    /// wait on drop: `lock_for` sets its wait to zero, so dlm waits once.)
    pub(crate) fn flush_releases(&self) {
        let left = self
            .client
            .flush_releases(dlm_core::RetryPolicy::new().release_wait_value());
        if left > 0 {
            log::warn!("{left} release(s) could not be sent; they end with their leases");
        }
    }

    /// One attempt: the hold, or `None` when it is taken.
    pub(crate) fn try_once(&self) -> dlm_core::Result<Option<Held>> {
        match (&self.handle, self.kind) {
            (Handle::Lock(l), _) => l.try_lock(),
            (Handle::Semaphore(s), _) => s.try_acquire(),
            (Handle::Rw(rw), Kind::Exclusive) => Ok(rw.try_write()?.map(WriteGuard::into_guard)),
            (Handle::Rw(rw), _) => rw.try_read(),
            (Handle::Election(e), _) => Ok(e
                .try_campaign(self.value())?
                .map(dlm_core::Leadership::into_guard)),
        }
    }

    /// What a campaign publishes: the client's label.
    fn value(&self) -> &str {
        self.client.label().unwrap_or("dlm")
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
            (Handle::Election(e), _, Some(w)) => Ok(e
                .try_campaign_interruptibly(self.value(), w, interrupt)?
                .map(dlm_core::Leadership::into_guard)),
            (Handle::Election(e), _, None) => e
                .campaign_interruptibly(self.value(), interrupt)
                .map(|l| Some(l.into_guard())),
        }
    }

    /// Who holds it now (asks the backend): the lock's holder (its label is not kept), a
    /// semaphore's permits and the count it is held with, a read-write lock's readers or
    /// writer; no holders when it is free.
    pub(crate) fn inspect(&self) -> dlm_core::Result<Holders> {
        match &self.handle {
            Handle::Lock(l) => Ok(Holders::new(
                None,
                l.remaining_lease()?
                    .map(|r| Holder::new(Claim::Exclusive, r, None))
                    .into_iter()
                    .collect(),
            )),
            Handle::Semaphore(s) => s.inspect(),
            Handle::Rw(rw) => rw.inspect(),
            Handle::Election(e) => Ok(Holders::new(
                Some(1),
                e.leader()?
                    .map(|l| {
                        Holder::new(
                            Claim::Permit { permits: 1 },
                            l.remaining(),
                            l.value().map(str::to_owned),
                        )
                    })
                    .into_iter()
                    .collect(),
            )),
        }
    }

    /// Releases it whoever holds it (every permit, every read and write hold and a
    /// waiting writer's mark): whether anything was held.
    pub(crate) fn force_unlock(&self) -> dlm_core::Result<bool> {
        match &self.handle {
            Handle::Lock(l) => l.force_unlock(),
            Handle::Semaphore(s) => s.force_unlock(),
            Handle::Rw(rw) => rw.force_unlock(),
            Handle::Election(_) => Err(Error::InvalidArgument(dlm_core::InvalidArgument::new(
                "kind",
                "an election is cleared as the semaphore of 1 permit (dlm unlock --force --permits)",
            ))),
        }
    }

    /// What holds it, for the line shown while waiting: `holders` from
    /// [`Resource::inspect`], asked `ago`.
    pub(crate) fn holders_text(&self, holders: &Holders, ago: Duration) -> String {
        let secs = holders.longest().saturating_sub(ago).as_secs();
        let n = holders.holders.len();
        match self.kind {
            Kind::Lock => format!("held by another owner, lease ends in {secs}s"),
            Kind::Permits(asked) => match holders.permits {
                Some(count) if count != asked => format!(
                    "{n} of {count} permits taken: it is held with {count} permits, not {asked}"
                ),
                _ => format!("{n} of {asked} permits taken"),
            },
            Kind::Lead => format!("led by another candidate, lease ends in {secs}s"),
            Kind::Shared | Kind::Exclusive | Kind::Rw => format!(
                "{n} holder{}, the longest lease ends in {secs}s",
                if n == 1 { "" } else { "s" }
            ),
        }
    }
}
