//! Release-hint subscriptions.

use std::fmt;
use std::time::Duration;

use super::owner::OwnerToken;
use super::waiters::Handover;

/// What a [`Watch`] does when it is dropped; implemented by backends that keep a
/// registry of waiters.
pub trait Unsubscribe: Send + 'static {
    /// Removes the waiter. `pending_wake` is `true` when a wake-up had been delivered to
    /// it but not consumed: the registry should hand it to another waiter.
    fn unsubscribe(self: Box<Self>, pending_wake: bool);

    /// The front took a wake-up and is making the attempt it was for (`true`), or that
    /// attempt is over (`false`). A registry that answers
    /// [`LockBackend::wake_pending`](crate::backend::LockBackend::wake_pending) counts a trying waiter as a hand-over under way.
    fn trying(&self, on: bool) {
        let _ = on;
    }

    /// The waiter is going to sleep and would take the lock over as `owner` for `ttl`
    /// (see [`Watch::offer`]). A registry that hands locks over keeps it (a
    /// [`WaitList`](crate::backend::WaitList) does); the default ignores it.
    fn offer(&self, owner: OwnerToken, ttl: Duration, fenced: bool) {
        let _ = (owner, ttl, fenced);
    }

    /// The waiter is awake: withdraws its offer, waiting for a hand-over under way, and
    /// says how it ended (see [`Watch::withdraw`]). The default: [`Handover::None`].
    fn withdraw(&self) -> Handover {
        Handover::None
    }
}

/// A subscription to release hints for one lock name, returned by
/// [`LockBackend::watch`](crate::backend::LockBackend::watch). Unsubscribes when dropped.
pub struct Watch {
    receiver: crossbeam_channel::Receiver<()>,
    guard: Option<Box<dyn Unsubscribe>>,
}

impl Watch {
    /// A watch over `receiver`, with nothing to undo on drop.
    pub fn new(receiver: crossbeam_channel::Receiver<()>) -> Self {
        Watch {
            receiver,
            guard: None,
        }
    }

    /// A watch over `receiver` that calls `guard` when dropped.
    pub fn with_unsubscribe(
        receiver: crossbeam_channel::Receiver<()>,
        guard: Box<dyn Unsubscribe>,
    ) -> Self {
        Watch {
            receiver,
            guard: Some(guard),
        }
    }

    /// The channel a hint arrives on. A hint means "probably released: try again"; a
    /// disconnected channel means the subscription died (fall back to polling).
    pub fn receiver(&self) -> &crossbeam_channel::Receiver<()> {
        &self.receiver
    }

    /// Drops any delivered hint: the waiter used it (it won the lock), so it must not be
    /// passed on to another waiter when the watch is dropped.
    pub fn consume(&self) {
        while self.receiver.try_recv().is_ok() {}
    }

    /// Tells the registry that this waiter took a wake-up and is making the attempt it was
    /// for (`true`), or that the attempt is over (`false`); see
    /// [`LockBackend::wake_pending`](crate::backend::LockBackend::wake_pending).
    pub fn trying(&self, on: bool) {
        if let Some(guard) = &self.guard {
            guard.trying(on);
        }
    }
}

impl Watch {
    /// Offers to take the mutex over while asleep: a release made in this process may
    /// hand the lock to `owner` (the token of the waiter's next attempt) for `ttl`, in the
    /// same request, instead of letting it go free (see
    /// [`WaitList::successor`](crate::backend::WaitList::successor)). Made before each
    /// sleep; every wake-up must [`withdraw`](Watch::withdraw) it before anything else.
    pub fn offer(&self, owner: OwnerToken, ttl: Duration, fenced: bool) {
        if let Some(guard) = &self.guard {
            guard.offer(owner, ttl, fenced);
        }
    }

    /// Withdraws the offer and says whether a release handed the lock over to it
    /// ([`Handover::Granted`]: the waiter holds the lock as the offered token). While a
    /// release is handing the lock over to it, waits for that to be settled (one bounded
    /// request of the releasing thread).
    pub fn withdraw(&self) -> Handover {
        self.guard.as_ref().map_or(Handover::None, |g| g.withdraw())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let pending = !self.receiver.is_empty();
            guard.unsubscribe(pending);
        }
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("pending", &self.receiver.len())
            .finish_non_exhaustive()
    }
}
