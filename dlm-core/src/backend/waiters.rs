//! A registry of waiters for one lock name that backends use to implement
//! [`LockBackend::watch`](crate::backend::LockBackend::watch).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};
use parking_lot::{Condvar, Mutex};

use super::lease::Lease;
use super::owner::OwnerToken;
use super::watch::{Unsubscribe, Watch};

/// How many releases in a row may hand a name over to a waiter of this process
/// ([`WaitList::successor`]) before one lets it go free: then waiters elsewhere (other
/// processes, which the hand-over skips) get their chance at it.
pub const MAX_HANDOVERS_IN_A_ROW: u32 = 4;

/// Waiters of one lock name, woken one at a time in FIFO order.
///
/// A release wakes ONE waiter ([`notify_one`](WaitList::notify_one)): the others stay
/// asleep instead of all retrying at once. A waiter that gives up with an unused wake-up
/// hands it to the next waiter, so a wake-up is not lost when its receiver timed out or was
/// interrupted. Cloning shares the list.
///
/// It also hands a lock over: a waiter asleep for the mutex offers the owner token of its
/// next attempt ([`Watch::offer`]), and a release made in this process may, in the same
/// request, give the lock to that token instead of letting it go free
/// ([`successor`](WaitList::successor)); the waiter wakes up holding it, without a
/// request of its own.
#[derive(Clone, Default)]
pub struct WaitList {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    list: Mutex<Inner>,
    /// Signalled when a hand-over under way is settled (granted or not).
    settled: Condvar,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    waiters: VecDeque<Waiter>,
    /// Hand-overs granted in a row (see [`MAX_HANDOVERS_IN_A_ROW`]).
    handed_in_a_row: u32,
    /// The last [`WaitList::successor`] found an offer and let the lock go free anyway.
    yielded: bool,
}

struct Waiter {
    id: u64,
    tx: Sender<()>,
    /// Set while the waiter makes the attempt a wake-up was for.
    trying: Arc<AtomicBool>,
    offer: Offer,
}

/// Where a waiter stands in a hand-over.
#[derive(Clone, Copy)]
enum Offer {
    /// It makes its own attempts.
    None,
    /// Asleep, it will take the lock as `owner` for `ttl` (its token drawn with it when
    /// `fenced`).
    Open {
        owner: OwnerToken,
        ttl: Duration,
        fenced: bool,
    },
    /// A release is handing the lock to it now.
    Claimed,
    /// The release settled it.
    Settled(Handover),
}

/// How a hand-over to a waiter ended ([`Watch::withdraw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handover {
    /// Nothing was handed over: the waiter makes its own attempts.
    None,
    /// The store holds the lock for the waiter's offered token, on this lease.
    Granted(Lease),
    /// The release failed and may have handed the lock over: the waiter's offered token
    /// may hold it. Undo it, as for an acquisition that failed that way.
    Unknown,
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

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.list.lock()
    }

    /// Registers a waiter; dropping the returned [`Watch`] unregisters it.
    pub fn subscribe(&self) -> Watch {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let trying = Arc::new(AtomicBool::new(false));
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.waiters.push_back(Waiter {
            id,
            tx,
            trying: trying.clone(),
            offer: Offer::None,
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
        self.lock().notify_one()
    }

    /// For a release of the mutex made in this process: the longest-waiting waiter that
    /// offered to take the lock over ([`Watch::offer`]), claimed for a hand-over. The
    /// release then gives the lock to [`Successor::owner`] in the same atomic step that
    /// checks the releasing owner (the lock never goes free, and every rule of an
    /// acquisition holds for the successor: a lease, a larger fencing token), and
    /// settles: [`Successor::grant`] with the lease it set, [`Successor::decline`] when it
    /// handed nothing over (the releasing owner did not hold the lock), or drops the
    /// successor when it does not know (a failed request: the waiter undoes its token, as
    /// for a failed acquisition). Until then the waiter cannot leave: its
    /// [`Watch::withdraw`] waits for the outcome.
    ///
    /// `None` when no waiter offered, or after [`MAX_HANDOVERS_IN_A_ROW`] hand-overs in a
    /// row (this release lets the lock go free, for waiters elsewhere): release as usual.
    pub fn successor(&self) -> Option<Successor> {
        let mut inner = self.lock();
        let found = inner.waiters.iter_mut().find_map(|w| match w.offer {
            Offer::Open { owner, ttl, fenced } => {
                w.offer = Offer::Claimed;
                Some((w.id, owner, ttl, fenced))
            }
            _ => None,
        });
        inner.yielded = false;
        let Some((id, owner, ttl, fenced)) = found else {
            inner.handed_in_a_row = 0;
            return None;
        };
        if inner.handed_in_a_row >= MAX_HANDOVERS_IN_A_ROW {
            inner.handed_in_a_row = 0;
            inner.yielded = true;
            if let Some(w) = inner.waiters.iter_mut().find(|w| w.id == id) {
                w.offer = Offer::Open { owner, ttl, fenced };
            }
            return None;
        }
        Some(Successor {
            list: self.clone(),
            id,
            owner,
            ttl,
            fenced,
            settled: false,
        })
    }

    /// Whether the last [`successor`](WaitList::successor) found a waiter to hand the lock
    /// to and returned `None` all the same, after [`MAX_HANDOVERS_IN_A_ROW`] hand-overs:
    /// that release lets the lock go free for waiters elsewhere, and a backend that can
    /// should let them try first (dlm-redis holds its own waiters back until the release's
    /// message has reached them through the server, as it reaches other processes).
    pub fn yielded(&self) -> bool {
        self.lock().yielded
    }

    /// Settles waiter `id`'s hand-over, and wakes it.
    fn settle(&self, id: u64, outcome: Handover) {
        let mut inner = self.lock();
        if matches!(outcome, Handover::Granted(_)) {
            // Counted when granted: a release that handed nothing over (it did not hold
            // the lock: an undo, a release sent again) does not use up the run.
            inner.handed_in_a_row += 1;
        }
        if let Some(w) = inner.waiters.iter_mut().find(|w| w.id == id) {
            w.offer = Offer::Settled(outcome);
            if w.tx.try_send(()).is_ok() {
                w.trying.store(true, Ordering::Release);
            }
        }
        drop(inner);
        self.inner.settled.notify_all();
    }

    /// See [`Watch::offer`].
    fn offer(&self, id: u64, owner: OwnerToken, ttl: Duration, fenced: bool) {
        let mut inner = self.lock();
        if let Some(w) = inner.waiters.iter_mut().find(|w| w.id == id)
            && matches!(w.offer, Offer::None)
        {
            w.offer = Offer::Open { owner, ttl, fenced };
        }
    }

    /// See [`Watch::withdraw`].
    fn withdraw(&self, id: u64) -> Handover {
        let mut inner = self.lock();
        loop {
            let Some(w) = inner.waiters.iter_mut().find(|w| w.id == id) else {
                return Handover::None;
            };
            match std::mem::replace(&mut w.offer, Offer::None) {
                Offer::Claimed => {
                    w.offer = Offer::Claimed;
                    self.inner.settled.wait(&mut inner);
                }
                Offer::Settled(outcome) => return outcome,
                Offer::None | Offer::Open { .. } => return Handover::None,
            }
        }
    }

    /// Whether a hand-over is under way: a waiter has been woken and has not yet made the
    /// attempt it was woken for (the wake-up is still in its channel, or the waiter is
    /// trying, see [`Watch::trying`]). A newcomer should let that waiter try first (see
    /// [`LockBackend::wake_pending`](crate::backend::LockBackend::wake_pending)).
    pub fn wake_pending(&self) -> bool {
        self.lock().waiters.iter().any(|w| {
            !w.tx.is_empty()
                || w.trying.load(Ordering::Acquire)
                || matches!(
                    w.offer,
                    Offer::Claimed | Offer::Settled(Handover::Granted(_))
                )
        })
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        for w in self.lock().waiters.iter() {
            let _ = w.tx.try_send(());
        }
    }

    /// Unregisters every waiter and closes their channels: their receivers report
    /// disconnection, which tells the front to poll instead (the hints are gone).
    pub fn close(&self) {
        let mut inner = self.lock();
        // A waiter being handed the lock stays until it is settled: its release is under
        // way and settles it (its channel then disconnects when it is dropped).
        inner
            .waiters
            .retain(|w| matches!(w.offer, Offer::Claimed | Offer::Settled(_)));
        for w in &mut inner.waiters {
            let (tx, _) = crossbeam_channel::bounded(1);
            w.tx = tx;
        }
    }

    /// How many waiters are registered.
    pub fn len(&self) -> usize {
        self.lock().waiters.len()
    }

    /// How many waiters are asleep with an offer to take the lock over (see
    /// [`Watch::offer`]): those a release made now could hand it to.
    pub fn offers(&self) -> usize {
        self.lock()
            .waiters
            .iter()
            .filter(|w| matches!(w.offer, Offer::Open { .. }))
            .count()
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

/// A waiter claimed for a hand-over by [`WaitList::successor`]: what its acquisition asks
/// for, and the settlement owed to it. Dropped without [`grant`](Successor::grant) or
/// [`decline`](Successor::decline), the hand-over counts as failed after it may have been
/// applied ([`Handover::Unknown`]).
#[must_use = "a successor must be granted or declined"]
pub struct Successor {
    list: WaitList,
    id: u64,
    owner: OwnerToken,
    ttl: Duration,
    fenced: bool,
    settled: bool,
}

impl Successor {
    /// The owner token to give the lock to.
    pub fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    /// The lease it asks for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether its fencing token is to be drawn with the hand-over (it will probably be
    /// read), as [`try_acquire_fenced`](crate::backend::LockBackend::try_acquire_fenced)
    /// would.
    pub fn fenced(&self) -> bool {
        self.fenced
    }

    /// The store now holds the lock for [`owner`](Successor::owner) on `lease` (reduced,
    /// as an acquisition's, by the time the request took and the drift allowance): the
    /// waiter wakes up holding it.
    pub fn grant(self, lease: Lease) {
        self.settle(Handover::Granted(lease));
    }

    /// Nothing was handed over (the store wrote nothing for the successor): the waiter is
    /// woken to make its own attempts.
    pub fn decline(self) {
        self.settle(Handover::None);
    }

    fn settle(mut self, outcome: Handover) {
        self.settled = true;
        self.list.settle(self.id, outcome);
    }
}

impl Drop for Successor {
    fn drop(&mut self) {
        if !self.settled {
            self.list.settle(self.id, Handover::Unknown);
        }
    }
}

impl fmt::Debug for Successor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Successor")
            .field("owner", &self.owner)
            .field("ttl", &self.ttl)
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
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

    fn offer(&self, owner: OwnerToken, ttl: Duration, fenced: bool) {
        self.list.offer(self.id, owner, ttl, fenced);
    }

    fn withdraw(&self) -> Handover {
        self.list.withdraw(self.id)
    }

    fn unsubscribe(self: Box<Self>, pending_wake: bool) {
        // The front withdraws before it leaves; a hand-over still under way is waited for.
        if self.list.withdraw(self.id) != Handover::None {
            log::error!(
                "a lock was handed over to a waiter that left without withdrawing: its lease ends it"
            );
        }
        let mut inner = self.list.lock();
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

    fn token(n: u64) -> OwnerToken {
        OwnerToken::random_for_tests(n)
    }

    fn lease() -> Lease {
        Lease::new(std::time::Instant::now() + Duration::from_secs(10))
    }

    #[test]
    fn a_release_hands_over_to_the_longest_waiting_offer_only() {
        let list = WaitList::new();
        let a = list.subscribe();
        let b = list.subscribe();
        assert!(list.successor().is_none(), "nobody offered");
        let (ta, tb) = (token(1), token(2));
        b.offer(tb, Duration::from_secs(5), true);
        a.offer(ta, Duration::from_secs(3), false);
        let next = list.successor().expect("a waiter offered");
        assert_eq!(next.owner(), &ta, "the longest waiting first");
        assert_eq!(next.ttl(), Duration::from_secs(3));
        assert!(!next.fenced());
        assert!(
            list.wake_pending(),
            "a hand-over under way is a wake-up pending"
        );
        let granted = lease();
        next.grant(granted);
        assert!(a.receiver().try_recv().is_ok(), "the successor is woken");
        assert!(list.wake_pending(), "granted, not yet taken");
        assert_eq!(a.withdraw(), Handover::Granted(granted));
        assert_eq!(a.withdraw(), Handover::None, "taken once");
        let next = list.successor().expect("b still offers");
        assert_eq!(next.owner(), &tb);
        assert!(next.fenced());
        next.decline();
        assert!(
            b.receiver().try_recv().is_ok(),
            "woken to make its own attempt"
        );
        assert_eq!(b.withdraw(), Handover::None);
    }

    #[test]
    fn a_hand_over_that_failed_is_unknown_to_its_waiter() {
        let list = WaitList::new();
        let a = list.subscribe();
        a.offer(token(1), Duration::from_secs(3), false);
        drop(list.successor().expect("offered"));
        assert_eq!(a.withdraw(), Handover::Unknown);
    }

    #[test]
    fn a_waiter_being_handed_the_lock_waits_for_the_outcome() {
        let list = WaitList::new();
        let a = list.subscribe();
        a.offer(token(1), Duration::from_secs(3), false);
        let next = list.successor().expect("offered");
        let (started_tx, started_rx) = crossbeam_channel::bounded(1);
        let waiter = std::thread::spawn(move || {
            started_tx.send(()).unwrap();
            a.withdraw()
        });
        started_rx.recv().unwrap();
        let granted = lease();
        // Whether the waiter is already blocked or not, it returns the grant: it cannot
        // leave with the hand-over unsettled.
        next.grant(granted);
        assert_eq!(waiter.join().unwrap(), Handover::Granted(granted));
    }

    #[test]
    fn an_awake_waiter_is_not_handed_over_to() {
        let list = WaitList::new();
        let a = list.subscribe();
        a.offer(token(1), Duration::from_secs(3), false);
        assert_eq!(a.withdraw(), Handover::None);
        assert!(
            list.successor().is_none(),
            "withdrawn: it makes its own attempt"
        );
    }

    #[test]
    fn every_so_many_releases_let_the_lock_go_free() {
        let list = WaitList::new();
        let a = list.subscribe();
        let mut handed = 0;
        for _ in 0..=MAX_HANDOVERS_IN_A_ROW {
            a.offer(token(1), Duration::from_secs(3), false);
            match list.successor() {
                Some(next) => {
                    handed += 1;
                    next.grant(lease());
                    assert!(matches!(a.withdraw(), Handover::Granted(_)));
                    a.consume();
                }
                None => break,
            }
        }
        assert_eq!(handed, MAX_HANDOVERS_IN_A_ROW);
        assert!(
            list.yielded(),
            "a waiter offered: that release let it go all the same"
        );
        assert!(
            list.successor().is_some(),
            "the offer stayed open, and the count starts again"
        );
        assert!(!list.yielded());
    }

    #[test]
    fn only_granted_hand_overs_count_toward_the_run() {
        let list = WaitList::new();
        let a = list.subscribe();
        for _ in 0..3 * MAX_HANDOVERS_IN_A_ROW {
            // A release that did not hold the lock (an undo, a release sent again).
            a.offer(token(1), Duration::from_secs(3), false);
            list.successor().expect("offered").decline();
            assert_eq!(a.withdraw(), Handover::None);
            a.consume();
        }
        a.offer(token(1), Duration::from_secs(3), false);
        assert!(list.successor().is_some(), "nothing was handed over yet");
        assert!(!list.yielded());
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
