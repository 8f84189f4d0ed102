//! What the handles of the primitives held by several threads at once (a semaphore, a
//! read-write lock) share: a name, a lease, and the calling thread's hold state, looked up
//! per call (each thread's permit or read hold is a hold of its own).

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Acquisition, Wait};
use crate::backend::{BackendError, BackendErrorKind, Claim, Holders, LockName};
use crate::error::Result;
use crate::guard::LockGuard;
use crate::hold::HoldKey;
use crate::hold::LockShared;
use crate::interrupt::Interrupt;
use crate::keep_alive::KeepAlive;
use crate::registry::Registry;
use crate::settings::ClientShared;

/// A name as a semaphore or read-write lock of one client.
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) client: Arc<ClientShared>,
    /// The client's hold states (per thread, for these kinds).
    registry: Arc<Registry>,
    pub(crate) name: LockName,
    /// A fixed lease; `None`: watchdog-renewed.
    pub(crate) lease: Option<Duration>,
    pub(crate) keep_alive: Arc<KeepAlive>,
}

impl Handle {
    /// A handle of `claim`'s kind, if the backend keeps such holds (no I/O).
    pub(crate) fn new(
        client: Arc<ClientShared>,
        registry: Arc<Registry>,
        name: LockName,
        claim: Claim,
        keep_alive: Arc<KeepAlive>,
    ) -> Result<Self> {
        if !client.backend.supports(claim) {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                format!(
                    "the {} backend keeps no {} ({claim} holds)",
                    client.backend.kind(),
                    match claim {
                        Claim::Permit { .. } => "semaphores",
                        _ => "read-write locks",
                    }
                ),
            )
            .into());
        }
        client.backend.check_claim(claim)?;
        Ok(Handle {
            lease: client.lease,
            client,
            registry,
            name,
            keep_alive,
        })
    }

    /// The calling thread's hold state of `claim` on this name.
    pub(crate) fn state(&self, claim: Claim) -> Arc<LockShared> {
        self.registry
            .hold_state(&self.client, HoldKey::new(self.name.clone(), claim))
    }

    /// The calling thread's hold state of `claim` on this name, if any handle or guard
    /// keeps one.
    pub(crate) fn existing_state(&self, claim: Claim) -> Option<Arc<LockShared>> {
        self.registry
            .existing_state(&HoldKey::new(self.name.clone(), claim))
    }

    /// One acquisition of `claim` by the calling thread.
    pub(crate) fn acquire(
        &self,
        claim: Claim,
        wait: Wait,
        interrupt: Option<&Interrupt>,
    ) -> Result<Option<LockGuard>> {
        let shared = self.state(claim);
        self.acquisition(&shared).run(wait, interrupt)
    }

    /// An acquisition through this handle on `shared`.
    pub(crate) fn acquisition<'a>(&'a self, shared: &'a Arc<LockShared>) -> Acquisition<'a> {
        Acquisition {
            shared,
            lease: self.lease,
            keep_alive: &self.keep_alive,
            campaign: None,
        }
    }

    /// Who holds it now (asks the backend).
    pub(crate) fn inspect(&self, claim: Claim) -> Result<Holders> {
        Ok(self.client.backend.inspect_group(&self.name, claim)?)
    }

    /// `lease` checked against the client's limits.
    pub(crate) fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.lease = Some(self.client.check_lease(lease)?);
        Ok(self)
    }
}

/// `f` run on the guard, then the guard released as the closure helpers of
/// [`Lock`](crate::Lock) do.
pub(crate) fn run_then_release<R>(guard: LockGuard, f: impl FnOnce(&LockGuard) -> R) -> Result<R> {
    let result = f(&guard); // a panic drops the guard, which releases
    crate::lock::release_after_work(guard)?;
    Ok(result)
}
