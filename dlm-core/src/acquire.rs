//! The wait loop, one for every backend: attempt, subscribe to release hints, sleep
//! until a hint, the holder's lease end, a backoff, the deadline or an interrupt; and
//! the local side of an acquisition (re-entry, installing the hold).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};

use crate::backend::{Acquire, BackendError, Claim, Handover, Lease, OwnerToken, Watch};
use crate::error::{Deadlock, Error, InvalidArgument, Result};
use crate::guard::LockGuard;
use crate::hold::{Holding, LockShared};
use crate::interrupt::Interrupt;
use crate::keep_alive::KeepAlive;
use crate::observe::Outcome;
use crate::settings::thread_no;
use crate::watchdog::Registration;

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// One attempt.
    No,
    /// Until this instant.
    Until(Instant),
    Forever,
}

impl Wait {
    pub(crate) fn from_timeout(timeout: Duration) -> Wait {
        if timeout.is_zero() {
            return Wait::No;
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => Wait::Until(deadline),
            None => Wait::Forever,
        }
    }
}

/// One acquisition through a lock handle: its lock, the lease it asks for (`None`:
/// watchdog-renewed) and the client's keep-alive, for the guard.
pub(crate) struct Acquisition<'a> {
    pub(crate) shared: &'a Arc<LockShared>,
    pub(crate) lease: Option<Duration>,
    pub(crate) keep_alive: &'a Arc<KeepAlive>,
    /// The label to keep with the hold instead of the client's (an election's value), and
    /// the token drawn with the grant whatever the client's `TokenDraw` (its term).
    pub(crate) campaign: Option<&'a str>,
}

impl Acquisition<'_> {
    /// The lease this acquisition asks for.
    fn ttl(&self) -> Duration {
        self.lease
            .unwrap_or(self.shared.client.watchdog.config().timeout)
    }

    pub(crate) fn run(
        &self,
        wait: Wait,
        interrupt: Option<&Interrupt>,
    ) -> Result<Option<LockGuard>> {
        let metrics = &self.shared.metrics;
        if interrupt.is_some_and(Interrupt::is_interrupted) {
            metrics.not_acquired(Outcome::Interrupted);
            return Err(Error::Interrupted);
        }
        // Permits and reads are looked up whatever the client's re-entrancy: a second
        // permit is refused, a second read counted on the first (a thread's read holds of
        // a name share one backend hold).
        let shared_kind = matches!(self.shared.claim, Claim::Permit { .. } | Claim::Read);
        if (self.shared.client.reentrant || shared_kind)
            && let Some(guard) = self.reenter()?
        {
            return Ok(Some(guard));
        }
        let started = metrics.clock();
        let result = self.wait_loop(wait, interrupt, started);
        match &result {
            Ok(Some(_)) => {} // counted by `install`
            Ok(None) => metrics.not_acquired(Outcome::TimedOut),
            Err(Error::Interrupted) => metrics.not_acquired(Outcome::Interrupted),
            Err(_) => metrics.not_acquired(Outcome::Failed),
        }
        result
    }

    /// Attempts until the lock is acquired, the wait is over, an interrupt or an error.
    fn wait_loop(
        &self,
        wait: Wait,
        interrupt: Option<&Interrupt>,
        started: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        let never = crossbeam_channel::never();
        let interrupt_rx: &Receiver<()> = interrupt.map_or(&never, Interrupt::receiver);
        let mut w = Waiting::new(self, wait);
        loop {
            let (retry_after, error) = match w.attempt() {
                Ok(Acquire::Acquired(lease)) => {
                    if let Some(watch) = &w.watch {
                        watch.consume();
                    }
                    if interrupt.is_some_and(Interrupt::is_interrupted) {
                        self.shared
                            .undo(&w.token, self.shared.client.backend.now() + w.ttl);
                        return Err(Error::Interrupted);
                    }
                    return Ok(Some(self.install(w.token, lease, started, w.fenced)));
                }
                Ok(Acquire::Held { retry_after }) => {
                    w.held();
                    (retry_after, None)
                }
                Err(e) => (None, Some(w.failed(e)?)),
            };
            let Some(deadline) = w.deadline() else {
                if !w.attempted {
                    // Held back until the end: look once before giving up.
                    w.turn = Turn::Forced;
                    continue;
                }
                // Out of time: report the last failure if the last attempt failed (its
                // key, if it landed, was released).
                return match error {
                    Some(e) => Err(e.into()),
                    None => Ok(None),
                };
            };
            // Subscribe after the first contended attempt, then look once more before
            // sleeping: a release between that attempt and the subscription is seen by the
            // second attempt, one after it by the subscription. No wake-up is lost, and an
            // uncontended acquisition pays nothing for the subscription.
            if !w.subscribed && w.subscribe() && error.is_none() {
                continue;
            }
            let wake_at = w.next_look(retry_after, error.is_some(), deadline);
            // Asleep, the mutex's waiter offers its next attempt's token: a release made
            // in this process may hand the lock over to it in the same request.
            let offered = self.shared.claim == Claim::Exclusive && error.is_none();
            if offered && let Some(watch) = &w.watch {
                watch.offer(w.token, w.ttl, w.fenced);
            }
            let hint_rx = w.watch.as_ref().map_or(&never, Watch::receiver);
            let woken = select! {
                recv(interrupt_rx) -> _ => Woken::Interrupted,
                recv(hint_rx) -> hint => Woken::Hint(hint.is_ok()),
                recv(crossbeam_channel::at(wake_at)) -> _ => Woken::Timer,
            };
            // Withdrawn first, whatever woke us: a hand-over under way is waited for.
            if offered {
                match w.watch.as_ref().map_or(Handover::None, Watch::withdraw) {
                    Handover::Granted(lease) => {
                        return self.handed_over(&w, lease, interrupt, started);
                    }
                    Handover::Unknown => {
                        // The release failed and may have handed it to our token: undone,
                        // as a failed attempt's, and the next attempt has a token of its own.
                        self.shared
                            .undo(&w.token, self.shared.client.backend.now() + w.ttl);
                        w.held();
                    }
                    _ => {}
                }
            }
            match woken {
                Woken::Interrupted => return Err(Error::Interrupted),
                Woken::Hint(hint) => w.hinted(hint),
                // A hint that came with the timer (a release that settled our offer while
                // we were withdrawing it, say) is ours: taken now, so that our next
                // attempt does not hold back behind our own wake-up.
                Woken::Timer => {
                    if w.watch
                        .as_ref()
                        .is_some_and(|watch| watch.receiver().try_recv().is_ok())
                    {
                        w.hinted(true);
                    }
                }
            }
        }
    }

    /// A release of this process handed the lock to the waiter's offered token.
    fn handed_over(
        &self,
        w: &Waiting<'_>,
        lease: Lease,
        interrupt: Option<&Interrupt>,
        started: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        if let Some(watch) = &w.watch {
            watch.consume();
            watch.trying(false);
        }
        if interrupt.is_some_and(Interrupt::is_interrupted) {
            self.shared.undo(&w.token, lease.valid_until());
            return Err(Error::Interrupted);
        }
        self.shared.metrics.woken();
        Ok(Some(self.install(w.token, lease, started, w.fenced)))
    }

    /// The re-entrant fast path: a further hold of a lock the calling thread holds.
    pub(crate) fn reenter(&self) -> Result<Option<LockGuard>> {
        let mut state = self.shared.state.lock();
        let me = thread_no();
        let Some(h) = state.holding.as_mut().filter(|h| h.thread == me) else {
            return Ok(None);
        };
        if matches!(self.shared.claim, Claim::Permit { .. })
            && h.is_valid(self.shared.client.backend.now())
        {
            // A permit is not re-entrant: a thread that took every permit would wait for
            // itself.
            return Err(Error::WouldDeadlock(Deadlock::SecondPermit));
        }
        if !h.is_valid(self.shared.client.backend.now()) {
            // The earlier hold's lease is gone; its guards will report it. This
            // acquisition starts afresh.
            log::warn!(
                "lock {:?}: re-acquired by its holding thread after the lease was lost",
                self.shared.name
            );
            // (A renewal of it still under way is released when it comes back: see the
            // watchdog's `apply`.)
            let counted = h.lost;
            state.holding = None;
            drop(state);
            if !counted {
                self.shared.metrics.lost();
            }
            return Ok(None);
        }
        h.count = h
            .count
            .checked_add(1)
            .ok_or_else(|| InvalidArgument::new("hold count", "too many re-entrant holds"))?;
        let (generation, lease) = (h.generation, h.lease);
        drop(state);
        Ok(Some(LockGuard::new(
            self.shared.clone(),
            self.keep_alive.clone(),
            generation,
            lease,
        )))
    }

    pub(crate) fn install(
        &self,
        token: OwnerToken,
        lease: Lease,
        started: Option<Instant>,
        fenced: bool,
    ) -> LockGuard {
        let metrics = &self.shared.metrics;
        let at = metrics.clock();
        let mut state = self.shared.state.lock();
        state.next_generation += 1;
        let generation = state.next_generation;
        if let Some(earlier) = &state.holding {
            if !earlier.lost {
                metrics.lost();
            }
            // Another of our threads held it, but the backend granted it to us: that hold
            // expired. Its guards will see they are stale (a renewal of it still under way
            // is released when it comes back).
            log::warn!(
                "lock {:?}: taken over from an expired hold of this process",
                self.shared.name
            );
        }
        // Scheduled under the state mutex: the hold and its ticket appear together.
        let renewal = if self.lease.is_none() {
            let lock: Weak<LockShared> = Arc::downgrade(self.shared);
            self.shared.client.watchdog.register(Registration {
                lock,
                generation,
                acquired: at.unwrap_or_else(Instant::now),
            })
        } else {
            None
        };
        state.holding = Some(Holding {
            thread: thread_no(),
            count: 1,
            generation,
            token,
            lease,
            fence: lease.fence(),
            since: at,
            drew_at_acquisition: fenced,
            read: false,
            renewals: 0,
            lost: false,
            _renewal: renewal,
            signal: None,
        });
        drop(state);
        metrics.acquired(started, at);
        LockGuard::new(
            self.shared.clone(),
            self.keep_alive.clone(),
            generation,
            lease,
        )
    }
}

/// What ended a sleep of the wait loop.
enum Woken {
    Interrupted,
    /// A release hint (`true`), or the subscription died (`false`).
    Hint(bool),
    Timer,
}

/// Why the next attempt is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// A new acquisition, or a backoff timer: it holds back behind a hand-over in progress.
    Any,
    /// It follows a wake-up of ours: our turn.
    Woken,
    /// The last look before the deadline: it attempts whatever is pending.
    Forced,
}

/// The state of one wait: what the next attempt sends and how the attempts are paced.
struct Waiting<'a> {
    acq: &'a Acquisition<'a>,
    wait: Wait,
    /// The next attempt's owner token. Each attempt has one of its own: a request of a
    /// failed attempt that reaches a server late (a lost reply, a backend's undo of a
    /// partial acquisition still in flight) can then only ever touch that attempt's key,
    /// never the key of a later attempt that won.
    token: OwnerToken,
    /// The lease the attempts ask for.
    ttl: Duration,
    /// The fencing token is drawn with the acquisition (it will probably be read).
    fenced: bool,
    /// Release hints, once subscribed (none if the backend gives none, or they died).
    watch: Option<Watch>,
    subscribed: bool,
    /// Backoff steps taken.
    backoffs: u32,
    /// Since when attempts have failed in a row.
    failing_since: Option<Instant>,
    turn: Turn,
    /// A real attempt was made (every call makes at least one).
    attempted: bool,
}

impl<'a> Waiting<'a> {
    fn new(acq: &'a Acquisition<'a>, wait: Wait) -> Self {
        let shared = acq.shared;
        let client = &shared.client;
        Waiting {
            acq,
            wait,
            token: client.token_for_current_thread(),
            ttl: acq.ttl(),
            fenced: acq.campaign.is_some() || shared.draw_at_acquisition(),
            watch: None,
            subscribed: false,
            backoffs: 0,
            failing_since: None,
            turn: Turn::Any,
            attempted: false,
        }
    }

    /// One attempt, unless it holds back: no barging past a hand-over in progress. An
    /// attempt that does not follow a wake-up of ours holds back while a waiter of this
    /// process has been woken for this lock and has not finished its attempt (typically
    /// woken by our own thread's release a moment ago), and waits for its own turn (hints
    /// come in FIFO order) or its backoff instead, so local waiters are served in turn.
    /// `try_lock`, and the last look before a deadline, always attempt.
    fn attempt(&mut self) -> std::result::Result<Acquire, BackendError> {
        let shared = self.acq.shared;
        let turn = std::mem::replace(&mut self.turn, Turn::Any);
        let hold_back =
            turn == Turn::Any && !matches!(self.wait, Wait::No) && shared.wake_pending();
        if hold_back && !self.subscribed {
            self.subscribe();
        }
        let outcome = if hold_back && self.watch.is_some() {
            Ok(Acquire::Held { retry_after: None })
        } else {
            self.attempted = true;
            shared.try_acquire(&self.token, self.ttl, self.fenced, self.acq.campaign)
        };
        if let Some(w) = &self.watch {
            w.trying(false);
        }
        outcome
    }

    /// Someone else holds it: the next attempt gets a new token.
    fn held(&mut self) {
        self.failing_since = None;
        self.token = self.acq.shared.client.token_for_current_thread();
    }

    /// The attempt failed; if it may have landed, its hold is undone. The error back to
    /// retry it within the wait (transient, and within the error timeout), else as the
    /// call's error.
    fn failed(&mut self, e: BackendError) -> Result<BackendError> {
        let shared = self.acq.shared;
        shared.metrics.error(&e);
        if e.may_have_applied() {
            shared.undo(&self.token, shared.client.backend.now() + self.ttl);
        }
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if !e.is_transient() || since.elapsed() >= shared.client.retry.error_timeout_value() {
            return Err(e.into());
        }
        log::debug!(
            "lock {:?}: transient backend error, retrying: {e}",
            shared.name
        );
        self.token = shared.client.token_for_current_thread();
        Ok(e)
    }

    /// The wait's deadline (`Some(None)`: none), or `None` when it is over.
    fn deadline(&self) -> Option<Option<Instant>> {
        match self.wait {
            Wait::No => None,
            Wait::Until(d) if Instant::now() >= d => None,
            Wait::Until(d) => Some(Some(d)),
            Wait::Forever => Some(None),
        }
    }

    /// Subscribes to release hints; whether the backend gives them.
    fn subscribe(&mut self) -> bool {
        self.subscribed = true;
        self.watch = self.acq.shared.watch();
        self.watch.is_some()
    }

    /// When to look again: with a subscription and a known holder lease, when that lease
    /// ends (a release hint wakes us sooner); otherwise after a backoff, capped by the
    /// holder's lease; never past the deadline.
    fn next_look(
        &mut self,
        retry_after: Option<Duration>,
        failed: bool,
        deadline: Option<Instant>,
    ) -> Instant {
        let delay = match (&self.watch, retry_after) {
            (Some(_), Some(remaining)) if !failed => {
                remaining + Duration::from_micros(rand::random_range(500..=2_000))
            }
            _ => self
                .acq
                .shared
                .client
                .retry
                .delay(self.backoffs, retry_after),
        };
        self.backoffs = self.backoffs.saturating_add(1);
        let now = Instant::now();
        match (now.checked_add(delay), deadline) {
            (Some(t), Some(d)) => t.min(d),
            (Some(t), None) => t,
            (None, Some(d)) => d,
            (None, None) => now + Duration::from_secs(3600),
        }
    }

    /// A release hint came (`true`), or the subscription died (`false`: poll from now on).
    fn hinted(&mut self, hint: bool) {
        let shared = self.acq.shared;
        if !hint {
            log::debug!("lock {:?}: release hints lost, polling", shared.name);
            self.watch = None;
        } else if let Some(w) = &self.watch {
            // Our turn: newcomers of this process hold back until we tried.
            w.trying(true);
            self.turn = Turn::Woken;
            shared.metrics.woken();
        }
    }
}
