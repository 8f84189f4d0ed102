//! Lease renewal (Redisson's lock watchdog): one thread per client renews every lock
//! acquired without an explicit lease, every `timeout / 3`.
//!
//! Holds are kept in a schedule shared with the thread. An acquisition adds its hold
//! (a [`Ticket`]) and the end of the hold removes it, so the schedule holds only live
//! holds. The thread is woken only when a new hold comes due before the time it already
//! sleeps until: a stream of short holds wakes it about once per renewal period, not once
//! per acquisition.
//!
//! The thread holds only `Weak` references to locks, and runs while the client is in use:
//! it stops when the last `LockClient`, `DistributedLock` and `LockGuard` of the client
//! are dropped (a dropped `KeepAlive` closes its stop channel), so the thread count returns
//! to its baseline. A renewal ends with the hold (unlock or drop), after the client's
//! maximum hold time, or when the lock is found lost (which is signalled to the guard).
//!
//! A guard that is never dropped (`std::mem::forget`, a reference cycle) cannot be told
//! apart from one that is still in use: it is renewed until the maximum hold time (set
//! one if that matters) or until the process ends, after which the lock expires within
//! one timeout.
//!
//! Lock order: a lock's state, then the schedule. The thread never waits for a lock's
//! state while it holds the schedule, and holds no lock's state across a request.
//!
//! The thread sees a lock only through [`Renewable`], which the lock's shared state
//! implements: this module knows the backend contract and nothing above it.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};
use parking_lot::Mutex;

use crate::backend::{Claim, Lease, LockBackend, LockName, OwnerToken, Renewal};
use crate::error::{BackendError, BackendErrorKind};
use crate::observe::Metrics;

/// A lock as the renewal thread sees it (implemented by the lock's shared state).
pub(crate) trait Renewable: Send + Sync {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// The kind of hold (every kind is renewed in the round's one
    /// [`LockBackend::extend_many`]).
    fn claim(&self) -> Claim;

    /// The clock the lock's leases are measured on ([`LockBackend::now`]).
    fn now(&self) -> Instant;

    /// What a renewal of hold `generation` sends, if that hold is current and not lost.
    fn start_renewal(&self, generation: u64) -> Option<Started>;

    /// Runs `f` under the lock's state mutex on hold `generation`, if it is still current
    /// and not lost. Returns whether its owner ended hold `generation` (released it, or
    /// downgraded it): that request, not the renewal's outcome, decides what the store
    /// keeps.
    fn with_hold(&self, generation: u64, f: &mut dyn FnMut(&mut dyn RenewedHold)) -> bool;

    /// Where the lock's renewals, losses and errors are counted.
    fn metrics(&self) -> &Metrics;

    /// Releases `token` at the backend, in the background while that fails: a renewal of
    /// it may have been applied after its hold was given up, and the store must not keep
    /// a hold that nobody owns (`until`: when that renewal's lease ends).
    fn give_up(&self, token: &OwnerToken, until: Instant);
}

/// A hold, under its lock's state mutex, as a renewal's outcome changes it.
pub(crate) trait RenewedHold {
    /// The hold's lease as this process knows it.
    fn lease(&self) -> Lease;

    /// Records the lease a renewal got; `started` is what the renewal was sent with.
    /// `false`, and the hold marked lost, when the hold's lease had already run out at
    /// `now` (a hold never comes back to life).
    fn renewed(&mut self, started: Started, lease: Lease, now: Instant) -> bool;

    /// Records that the lock is gone (and signals it).
    fn mark_lost(&mut self);
}

/// A renewal under way: the token it sends, and how many renewals its hold had recorded
/// when it was sent (see [`RenewedHold::renewed`]).
#[derive(Clone, Copy)]
pub(crate) struct Started {
    pub(crate) token: OwnerToken,
    pub(crate) renewals: u64,
}

/// A hold to renew.
pub(crate) struct Registration {
    pub(crate) lock: Weak<dyn Renewable>,
    pub(crate) generation: u64,
    pub(crate) acquired: Instant,
}

struct Entry {
    reg: Registration,
    due: Instant,
}

/// Settings of the renewal thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    pub(crate) timeout: Duration,
    pub(crate) max_hold: Option<Duration>,
}

impl Config {
    fn period(&self) -> Duration {
        self.timeout / 3
    }
}

/// The holds to renew, shared by the client and its renewal thread.
pub(crate) struct Watchdog {
    backend: Arc<dyn LockBackend>,
    config: Config,
    /// Disconnects when the last user-facing handle is gone: the thread stops.
    stop: Receiver<()>,
    schedule: Mutex<Schedule>,
}

#[derive(Default)]
struct Schedule {
    /// Live holds by ticket number (numbers are never reused).
    entries: BTreeMap<u64, Entry>,
    next_ticket: u64,
    /// Wakes the thread; `None` until the first hold starts it.
    wake: Option<Sender<()>>,
    /// When the thread looks next on its own; `None`: not until woken.
    wake_at: Option<Instant>,
    /// Times the thread was woken by a new hold (for tests).
    wakes: u64,
    /// Times the thread chose when to look next (for tests).
    plans: u64,
}

/// A hold's place in the schedule: dropping it (the hold ended, under the lock's state
/// mutex) takes the hold out.
pub(crate) struct Ticket {
    watchdog: Arc<Watchdog>,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.watchdog.schedule.lock().entries.remove(&self.number);
    }
}

impl Watchdog {
    pub(crate) fn new(backend: Arc<dyn LockBackend>, config: Config, stop: Receiver<()>) -> Self {
        Watchdog {
            backend,
            config,
            stop,
            schedule: Mutex::new(Schedule::default()),
        }
    }

    pub(crate) fn config(&self) -> Config {
        self.config
    }

    /// Schedules the renewal of a fresh hold, starting the thread if needed. Called with
    /// the lock's state mutex held; the ticket goes into the hold. `None` when the thread
    /// cannot be started (logged): the lease is then not renewed.
    pub(crate) fn register(self: &Arc<Self>, reg: Registration) -> Option<Ticket> {
        let due = reg.acquired + self.config.period();
        let mut s = self.schedule.lock();
        if s.wake.is_none() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let me = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("dlm-watchdog".into())
                .spawn(move || run(&me, &rx));
            if let Err(e) = spawned {
                log::error!(
                    "cannot start the lock watchdog thread; leases will not be renewed: {e}"
                );
                return None;
            }
            s.wake = Some(tx);
        }
        let number = s.next_ticket;
        s.next_ticket += 1;
        s.entries.insert(number, Entry { reg, due });
        if s.wake_at.is_none_or(|at| due < at) {
            s.wake_at = Some(due);
            s.wakes += 1;
            if let Some(wake) = &s.wake {
                // Full: a wake-up is already pending.
                let _ = wake.try_send(());
            }
        }
        drop(s);
        Some(Ticket {
            watchdog: self.clone(),
            number,
        })
    }

    /// How many holds are scheduled, and how many times a new hold woke the thread.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, u64) {
        let s = self.schedule.lock();
        (s.entries.len(), s.wakes)
    }

    /// How many times the thread chose when to look next.
    #[cfg(test)]
    pub(crate) fn plans(&self) -> u64 {
        self.schedule.lock().plans
    }

    /// Pretends the thread sleeps until `at`.
    #[cfg(test)]
    pub(crate) fn set_wake_at(&self, at: Instant) {
        self.schedule.lock().wake_at = Some(at);
    }

    /// Puts a renewed hold back, due again at `entry.due`. Called by the thread itself
    /// (which plans its next look from the entries before it sleeps), with the lock's
    /// state mutex held and the hold still current, so its ticket has not been dropped.
    fn reschedule(&self, number: u64, entry: Entry) {
        self.schedule.lock().entries.insert(number, entry);
    }
}

/// The renewal thread. It holds the watchdog weakly: the client's handles own it.
fn run(watchdog: &Weak<Watchdog>, wake: &Receiver<()>) {
    loop {
        let Some(w) = watchdog.upgrade() else { return };
        let next = {
            let mut s = w.schedule.lock();
            // A time set by a new hold stands even if that hold has ended meanwhile: the
            // holds after it come due later and need not wake the thread again.
            let now = Instant::now();
            let promised = s.wake_at.filter(|at| *at > now);
            s.wake_at = s.entries.values().map(|e| e.due).chain(promised).min();
            s.plans += 1;
            s.wake_at
        };
        let timer = next.map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        let stop = w.stop.clone();
        drop(w);
        select! {
            recv(stop) -> _ => return,
            recv(wake) -> msg => if msg.is_err() { return },
            recv(timer) -> _ => {}
        }
        let Some(w) = watchdog.upgrade() else { return };
        // Holds due within the next eighth of a period are renewed now with the due ones
        // (a little early): a round costs about the same for one hold or a thousand.
        let horizon = Instant::now() + w.config.period() / 8;
        let due: Vec<(u64, Entry)> = {
            let mut s = w.schedule.lock();
            let numbers: Vec<u64> = s
                .entries
                .iter()
                .filter(|(_, e)| e.due <= horizon)
                .map(|(n, _)| *n)
                .collect();
            numbers
                .into_iter()
                .filter_map(|n| s.entries.remove(&n).map(|e| (n, e)))
                .collect()
        };
        if !due.is_empty() {
            renew_round(&w, due);
        }
    }
}

/// A due hold that is still held, with what its renewal needs.
struct Due {
    number: u64,
    entry: Entry,
    lock: Arc<dyn Renewable>,
    started: Started,
}

/// Renews the due holds, every kind together, in one batch ([`LockBackend::extend_many`]:
/// one request per server, however many holds), applies each result as the backend
/// reports it (judged at that moment, not at the round's end), and schedules the next
/// renewal of each hold that goes on.
fn renew_round(w: &Watchdog, due: Vec<(u64, Entry)>) {
    let config = w.config;
    let live: Vec<Due> = due
        .into_iter()
        .filter_map(|(number, entry)| {
            let lock = entry.reg.lock.upgrade()?;
            // `None`: released, or already lost.
            let started = lock.start_renewal(entry.reg.generation)?;
            if config
                .max_hold
                .is_some_and(|max| entry.reg.acquired.elapsed() >= max)
            {
                log::info!(
                    "lock {:?}: maximum hold time reached; no more renewals, the lease runs out",
                    lock.name()
                );
                return None;
            }
            Some(Due {
                number,
                entry,
                lock,
                started,
            })
        })
        .collect();
    if live.is_empty() {
        return;
    }
    let locks: Vec<Arc<dyn Renewable>> = live.iter().map(|d| d.lock.clone()).collect();
    let tokens: Vec<OwnerToken> = live.iter().map(|d| d.started.token).collect();
    let renewals: Vec<Renewal<'_>> = locks
        .iter()
        .zip(&tokens)
        .map(|(lock, token)| Renewal::new(lock.name(), lock.claim(), token, config.timeout))
        .collect();
    let mut slots: Vec<Option<Due>> = live.into_iter().map(Some).collect();
    let mut answered = 0usize;
    // No state lock across the requests: holders can release meanwhile; each result is
    // applied only if its hold is still the same.
    let started = Instant::now();
    // A panicking backend must not end the renewals for good.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.backend.extend_many(&renewals, &mut |i, result| {
            if let Some(due) = slots.get_mut(i).and_then(Option::take) {
                answered += 1;
                apply(w, due, result);
            }
        });
    }));
    let took = started.elapsed();
    let left = slots.iter().filter(|s| s.is_some()).count();
    if left > 0 {
        let why = if outcome.is_err() {
            log::error!("lock renewal panicked; the renewals it did not answer count as failed");
            "panicked"
        } else {
            log::error!(
                "the backend answered {answered} of {} renewals; the others count as failed",
                renewals.len()
            );
            "no answer"
        };
        for due in slots.iter_mut().filter_map(Option::take) {
            apply(w, due, Err(BackendError::new(BackendErrorKind::Other, why)));
        }
    }
    if took > config.period() / 4 {
        log::warn!(
            "renewing {} lock(s) took {took:?}, more than a quarter of the renewal period ({:?})",
            renewals.len(),
            config.period()
        );
    } else {
        log::debug!("renewed {} lock(s) in {took:?}", renewals.len());
    }
}

/// Applies one renewal's result to its hold, now (as the backend reports it), and, unless
/// the hold is over, schedules the next renewal.
fn apply(w: &Watchdog, due: Due, result: Result<Option<Lease>, BackendError>) {
    let period = w.config.period();
    let Due {
        number,
        entry,
        lock,
        started,
    } = due;
    let generation = entry.reg.generation;
    let metrics = lock.metrics();
    if let Err(e) = &result {
        metrics.error(e);
    }
    // A renewal that arrives after its hold was given up (its lease ran out here) may have
    // renewed the hold at the store: released, so that nobody waits for a hold nobody owns.
    let mut give_up: Option<Instant> = None;
    let mut entry = Some(entry);
    let mut result = Some(result);
    let ended_by_owner = lock.with_hold(generation, &mut |hold| {
        let (Some(mut entry), Some(result)) = (entry.take(), result.take()) else {
            return;
        };
        // Counted for holds still current (a renewal that crossed the release is not).
        metrics.renewal(matches!(result, Ok(Some(_))));
        let now = lock.now();
        match result {
            Ok(Some(lease)) => {
                if !hold.renewed(started, lease, now) {
                    log::warn!(
                        "lock {:?}: lost (its lease had run out when the renewal came back)",
                        lock.name()
                    );
                    metrics.lost();
                    give_up = Some(lease.valid_until());
                    return;
                }
                entry.due = Instant::now() + period;
            }
            Ok(None) => {
                log::warn!("lock {:?}: lost (renewal found it gone)", lock.name());
                hold.mark_lost();
                metrics.lost();
                return;
            }
            Err(e) if now < hold.lease().valid_until() => {
                log::warn!("lock {:?}: renewal failed, retrying: {e}", lock.name());
                let left = hold.lease().valid_until().saturating_duration_since(now);
                entry.due =
                    Instant::now() + (period / 4).min(left / 2).max(Duration::from_millis(1));
            }
            Err(e) => {
                log::warn!(
                    "lock {:?}: lost (renewal failed until the lease ran out): {e}",
                    lock.name()
                );
                hold.mark_lost();
                metrics.lost();
                // The failed request may have renewed it at the store all the same.
                if e.may_have_applied() {
                    give_up = Some(now + w.config.timeout);
                }
                return;
            }
        }
        // Still under the state mutex with the hold current: its ticket is alive.
        w.reschedule(number, entry);
    });
    // The hold was over before its renewal came back (found lost, or dropped as expired
    // when its thread re-acquired): what the renewal may have written at the store is
    // nobody's. A release of the hold's own token touches nothing else (tokens are never
    // reused). A hold its owner ended (released or downgraded) is not released here: its
    // owner's request deletes a renewal applied before it, and a renewal applied after it
    // finds nothing (renewals never re-create a hold). Releasing it here too would race
    // the owner's release, which would then find nothing and report the hold lost.
    if let (Some(result), false) = (result, ended_by_owner) {
        give_up = match result {
            Ok(Some(lease)) => Some(lease.valid_until()),
            Err(e) if e.may_have_applied() => Some(lock.now() + w.config.timeout),
            _ => None,
        };
    }
    if let Some(until) = give_up {
        lock.give_up(&started.token, until);
    }
}
