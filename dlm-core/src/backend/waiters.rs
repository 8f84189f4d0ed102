//! A registry of waiters for one lock name that backends use to implement
//! [`LockBackend::watch`](crate::backend::LockBackend::watch).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Sender, TrySendError};
use parking_lot::Mutex;

use super::watch::{Unsubscribe, Watch};

/// Waiters of one lock name, woken one at a time in FIFO order.
///
/// A release wakes ONE waiter ([`notify_one`](WaitList::notify_one)): the others stay
/// asleep instead of all retrying at once. A waiter that gives up with an unused wake-up
/// hands it to the next waiter, so a wake-up is not lost when its receiver timed out or was
/// interrupted. Cloning shares the list.
#[derive(Clone, Default)]
pub struct WaitList {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    waiters: VecDeque<Waiter>,
}

struct Waiter {
    id: u64,
    tx: Sender<()>,
    /// Set while the waiter makes the attempt a wake-up was for.
    trying: Arc<AtomicBool>,
}

impl Inner {
    fn notify_one(&mut self) -> bool {
        for i in 0..self.waiters.len() {
            match self.waiters[i].tx.try_send(()) {
                Ok(()) => {
                    // The hand-over is under way from now until the waiter's attempt is
                    // over: set here, not when the waiter takes the wake-up from its
                    // channel, or `wake_pending` would be false in between and a
                    // newcomer could barge past it.
                    self.waiters[i].trying.store(true, Ordering::Release);
                    // Rotate the woken waiter to the back: the next release wakes another.
                    if let Some(w) = self.waiters.remove(i) {
                        self.waiters.push_back(w);
                    }
                    return true;
                }
                // Already holds an unconsumed wake-up: it will retry anyway.
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {}
            }
        }
        false
    }
}

impl WaitList {
    /// An empty list.
    pub fn new() -> Self {
        WaitList::default()
    }

    /// Registers a waiter; dropping the returned [`Watch`] unregisters it.
    pub fn subscribe(&self) -> Watch {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let trying = Arc::new(AtomicBool::new(false));
        let mut inner = self.inner.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.waiters.push_back(Waiter {
            id,
            tx,
            trying: trying.clone(),
        });
        drop(inner);
        Watch::with_unsubscribe(
            rx,
            Box::new(Subscription {
                list: self.clone(),
                id,
                trying,
            }),
        )
    }

    /// Wakes the longest-waiting waiter that has no wake-up pending. Returns `false` if
    /// there was none.
    pub fn notify_one(&self) -> bool {
        self.inner.lock().notify_one()
    }

    /// Whether a hand-over is under way: a waiter has been woken and has not yet made the
    /// attempt it was woken for (the wake-up is still in its channel, or the waiter is
    /// trying, see [`Watch::trying`]). A newcomer should let that waiter try first (see
    /// [`LockBackend::wake_pending`](crate::backend::LockBackend::wake_pending)).
    pub fn wake_pending(&self) -> bool {
        self.inner
            .lock()
            .waiters
            .iter()
            .any(|w| !w.tx.is_empty() || w.trying.load(Ordering::Acquire))
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        for w in self.inner.lock().waiters.iter() {
            let _ = w.tx.try_send(());
        }
    }

    /// Unregisters every waiter and closes their channels: their receivers report
    /// disconnection, which tells the front to poll instead (the hints are gone).
    pub fn close(&self) {
        self.inner.lock().waiters.clear();
    }

    /// How many waiters are registered.
    pub fn len(&self) -> usize {
        self.inner.lock().waiters.len()
    }

    /// `true` when no waiter is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for WaitList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitList")
            .field("waiters", &self.len())
            .finish()
    }
}

struct Subscription {
    list: WaitList,
    id: u64,
    trying: Arc<AtomicBool>,
}

impl Unsubscribe for Subscription {
    fn trying(&self, on: bool) {
        self.trying.store(on, Ordering::Release);
    }

    fn unsubscribe(self: Box<Self>, pending_wake: bool) {
        let mut inner = self.list.inner.lock();
        inner.waiters.retain(|w| w.id != self.id);
        if pending_wake {
            inner.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_one_waiter_at_a_time_in_fifo_order() {
        let list = WaitList::new();
        let a = list.subscribe();
        let b = list.subscribe();
        assert!(list.notify_one());
        assert!(a.receiver().try_recv().is_ok());
        assert!(b.receiver().try_recv().is_err());
        assert!(list.notify_one());
        assert!(b.receiver().try_recv().is_ok());
    }

    #[test]
    fn skips_waiters_that_already_have_a_wake_up() {
        let list = WaitList::new();
        let a = list.subscribe();
        let b = list.subscribe();
        list.notify_one();
        list.notify_one();
        assert_eq!(a.receiver().len(), 1);
        assert_eq!(b.receiver().len(), 1);
        assert!(!list.notify_one(), "both are already woken");
    }

    #[test]
    fn an_unused_wake_up_is_passed_on_when_the_waiter_leaves() {
        let list = WaitList::new();
        let a = list.subscribe();
        let b = list.subscribe();
        list.notify_one();
        drop(a);
        assert_eq!(list.len(), 1);
        assert!(b.receiver().try_recv().is_ok());
    }

    #[test]
    fn a_consumed_wake_up_is_not_passed_on() {
        let list = WaitList::new();
        let a = list.subscribe();
        let b = list.subscribe();
        list.notify_one();
        a.consume();
        drop(a);
        assert!(b.receiver().try_recv().is_err());
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn a_wake_is_pending_until_the_woken_waiter_picks_it_up() {
        let list = WaitList::new();
        assert!(!list.wake_pending());
        let a = list.subscribe();
        assert!(!list.wake_pending(), "waiting is not a pending wake-up");
        list.notify_one();
        assert!(list.wake_pending());
        a.receiver().try_recv().unwrap();
        assert!(
            list.wake_pending(),
            "taken from the channel, before the waiter says it is trying"
        );
        a.trying(true);
        assert!(list.wake_pending(), "taken, not yet tried");
        a.trying(false);
        assert!(!list.wake_pending());
    }

    #[test]
    fn close_disconnects_every_waiter() {
        let list = WaitList::new();
        let a = list.subscribe();
        list.close();
        assert_eq!(
            a.receiver().try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        );
        assert!(list.is_empty());
    }

    #[test]
    fn notify_all_wakes_everyone() {
        let list = WaitList::new();
        let w: Vec<_> = (0..4).map(|_| list.subscribe()).collect();
        list.notify_all();
        assert!(w.iter().all(|w| w.receiver().try_recv().is_ok()));
    }
}
