//! The holds of a semaphore or a read-write lock: a group of holders of one name, each with
//! its own expiry, and the rule that admits a new one.

use std::time::{Duration, Instant};

use std::sync::Arc;

use dlm_core::backend::{
    Acquire, BackendError, BackendErrorKind, Claim, FencingToken, Holder, Holders, OwnerToken,
    WaitList, writer_mark,
};

/// Which of a name's group resources: its semaphore or its read-write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GroupKind {
    Semaphore,
    ReadWrite,
}

impl GroupKind {
    /// The resource `claim` is a hold of, if it is a group one.
    pub(crate) fn of(claim: Claim) -> Option<GroupKind> {
        match claim {
            Claim::Permit { .. } => Some(GroupKind::Semaphore),
            Claim::Read | Claim::Write => Some(GroupKind::ReadWrite),
            _ => None,
        }
    }
}

/// One holder of a group.
pub(crate) struct Member {
    pub(crate) owner: OwnerToken,
    /// A write hold (read-write lock only).
    pub(crate) write: bool,
    pub(crate) expires_at: Instant,
    pub(crate) fence: Option<FencingToken>,
    /// Who holds it, as its client says.
    pub(crate) label: Option<Arc<str>>,
}

/// The holders of a semaphore or a read-write lock.
#[derive(Default)]
pub(crate) struct Group {
    /// The semaphore's permit count while anyone holds a permit (0: not fixed).
    permits: u32,
    pub(crate) members: Vec<Member>,
    /// Until when new readers are refused because a writer waits (read-write lock).
    writer_waits_until: Option<Instant>,
    pub(crate) waiters: WaitList,
    /// Observers' channels by their ids (capacity 1: a hint pending is enough), removed
    /// when their watch is dropped.
    pub(crate) observers: Vec<(u64, crossbeam_channel::Sender<()>)>,
}

impl Group {
    /// Drops the holds and the writer's mark that have expired.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.members.retain(|m| now < m.expires_at);
        if self.writer_waits_until.is_some_and(|t| now >= t) {
            self.writer_waits_until = None;
        }
        if self.members.is_empty() {
            self.permits = 0;
        }
    }

    pub(crate) fn is_idle(&mut self, now: Instant) -> bool {
        self.expire(now);
        self.members.is_empty()
            && self.writer_waits_until.is_none()
            && self.waiters.is_empty()
            && self.observers.is_empty()
    }

    /// Hints every observer that the holders changed; forgets those that are gone.
    pub(crate) fn tell_observers(&mut self) {
        for (_, o) in &self.observers {
            let _ = o.try_send(()); // full: a hint is pending already
        }
    }

    /// Sets `owner`'s label; whether it holds.
    pub(crate) fn relabel(&mut self, owner: &OwnerToken, label: Option<&str>) -> bool {
        let Some(m) = self.member(owner) else {
            return false;
        };
        m.label = label.map(Arc::from);
        self.tell_observers();
        true
    }

    pub(crate) fn member(&mut self, owner: &OwnerToken) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.owner == *owner)
    }

    /// One attempt of `owner` at a hold of kind `claim` for `ttl` (expired holds already
    /// dropped). `draw` issues the hold's fencing token when it is granted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_admit(
        &mut self,
        name: &dlm_core::backend::LockName,
        claim: Claim,
        owner: &OwnerToken,
        now: Instant,
        ttl: Duration,
        label: Option<&str>,
        draw: impl FnOnce() -> Option<FencingToken>,
    ) -> Result<Result<Option<FencingToken>, Duration>, BackendError> {
        if let Claim::Permit { permits } = claim
            && self.permits != 0
            && self.permits != permits
        {
            return Err(BackendError::new(
                BackendErrorKind::Conflict,
                format!(
                    "the semaphore {name} is held with {} permits, not {permits}",
                    self.permits
                ),
            ));
        }
        let write = claim == Claim::Write;
        if let Some(m) = self.member(owner) {
            // Ours already (a retry after a lost reply): refreshed.
            m.expires_at = now + ttl;
            return Ok(Ok(m.fence));
        }
        let wait = |members: &[Member], only_writers: bool| {
            members
                .iter()
                .filter(|m| !only_writers || m.write)
                .map(|m| m.expires_at - now)
                .min()
        };
        let refused = match claim {
            Claim::Permit { permits } => {
                (self.members.len() >= permits as usize).then(|| wait(&self.members, false))
            }
            Claim::Read => {
                if let Some(w) = wait(&self.members, true) {
                    Some(Some(w))
                } else {
                    self.writer_waits_until.map(|t| Some(t - now))
                }
            }
            _ => {
                let busy = !self.members.is_empty();
                if busy {
                    // Others inside: new readers wait behind this writer from now on,
                    // while it comes back before its mark ends.
                    let mark = writer_mark(ttl);
                    self.writer_waits_until = Some(now + mark);
                    let soonest = wait(&self.members, false).unwrap_or(mark);
                    Some(Some(soonest.min(mark / 3)))
                } else {
                    None
                }
            }
        };
        if let Some(retry_after) = refused {
            return Ok(Err(retry_after.unwrap_or(ttl)));
        }
        if let Claim::Permit { permits } = claim {
            self.permits = permits;
        }
        if write {
            self.writer_waits_until = None;
        }
        let fence = draw();
        self.members.push(Member {
            owner: *owner,
            write,
            expires_at: now + ttl,
            fence,
            label: label.map(Arc::from),
        });
        self.tell_observers();
        Ok(Ok(fence))
    }

    /// Ends `owner`'s hold; whether it held one. Wakes every waiter: several may get in
    /// (permits, readers).
    pub(crate) fn release(&mut self, owner: &OwnerToken) -> bool {
        let before = self.members.len();
        self.members.retain(|m| m.owner != *owner);
        let released = self.members.len() < before;
        if released {
            if self.members.is_empty() {
                self.permits = 0;
            }
            self.waiters.notify_all();
            self.tell_observers();
        }
        released
    }

    /// Ends every hold and the writer's mark; whether anything was held.
    pub(crate) fn clear(&mut self) -> bool {
        let held = !self.members.is_empty();
        self.members.clear();
        self.permits = 0;
        self.writer_waits_until = None;
        self.waiters.notify_all();
        self.tell_observers();
        held
    }

    /// `writer`'s write hold turned into `reader`'s read hold for `ttl`.
    pub(crate) fn downgrade(
        &mut self,
        writer: &OwnerToken,
        reader: &OwnerToken,
        expires_at: Instant,
    ) -> Option<Option<FencingToken>> {
        let m = self
            .members
            .iter_mut()
            .find(|m| m.owner == *writer && m.write)?;
        m.owner = *reader;
        m.write = false;
        m.expires_at = expires_at;
        let fence = m.fence;
        self.waiters.notify_all();
        self.tell_observers();
        Some(fence)
    }

    /// Who holds it: each holder, and the permit count while a permit is held.
    pub(crate) fn inspect(&self, kind: GroupKind, now: Instant) -> Holders {
        let holders = self
            .members
            .iter()
            .map(|m| {
                let claim = match kind {
                    GroupKind::Semaphore => Claim::Permit {
                        permits: self.permits,
                    },
                    GroupKind::ReadWrite if m.write => Claim::Write,
                    GroupKind::ReadWrite => Claim::Read,
                };
                Holder::new(
                    claim,
                    m.expires_at - now,
                    m.label.as_deref().map(str::to_owned),
                )
                .with_token(m.fence)
            })
            .collect();
        Holders::new((self.permits != 0).then_some(self.permits), holders)
    }
}

/// `Acquire` from [`Group::try_admit`]'s answer.
pub(crate) fn outcome(
    admitted: Result<Option<FencingToken>, Duration>,
    lease: impl FnOnce(Option<FencingToken>) -> dlm_core::backend::Lease,
) -> Acquire {
    match admitted {
        Ok(fence) => Acquire::Acquired(lease(fence)),
        Err(retry_after) => Acquire::Held {
            retry_after: Some(retry_after),
        },
    }
}
