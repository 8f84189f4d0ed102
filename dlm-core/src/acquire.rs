//! The wait loop, one for every backend: attempt, subscribe to release hints, sleep
//! until a hint, the holder's lease end, a backoff, the deadline or an interrupt; and
//! the local side of an acquisition (re-entry, installing the hold).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};

use crate::backend::{Acquire, Claim, Lease, OwnerToken, Watch};
use crate::error::{Deadlock, Error, InvalidArgument, Result};
use crate::guard::LockGuard;
use crate::interrupt::Interrupt;
use crate::observe::Outcome;
use crate::shared::{Holding, LockShared, thread_no};
use crate::watchdog::{KeepAlive, Registration};

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
}

impl Acquisition<'_> {
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
        let shared = self.shared;
        let client = &shared.client;
        let metrics = &shared.metrics;
        // Each attempt has an owner token of its own: a request of a failed attempt that
        // reaches a server late (a lost reply, or a backend's undo of a partial
        // acquisition, such as Redlock's, still in flight) can then only ever touch that
        // attempt's key, never the key of a later attempt that won.
        let mut token = client.token_for_current_thread();
        let never = crossbeam_channel::never();
        let interrupt_rx: &Receiver<()> = interrupt.map_or(&never, Interrupt::receiver);
        let mut watch: Option<Watch> = None;
        let mut subscribed = false;
        let mut attempt: u32 = 0;
        let mut failing_since: Option<Instant> = None;
        let ttl = self.lease.unwrap_or(client.watchdog.config().timeout);
        // The fencing token is drawn with the acquisition when it will probably be read.
        let fenced = shared.draw_at_acquisition();
        // The next attempt follows a wake-up of ours.
        let mut woken = false;
        // A real attempt was made (every call makes at least one).
        let mut attempted = false;
        let mut force = false;
        loop {
            // No barging past a hand-over in progress: an attempt that does not follow a
            // wake-up of ours holds back while a waiter of this process has been woken for
            // this lock and has not finished its attempt (typically woken by our own
            // thread's release a moment ago). It waits for its own turn (hints come in
            // FIFO order) or its backoff instead, so local waiters are served in turn.
            // `try_lock`, and the last look before a deadline, always attempt.
            let (our_turn, forced) = (std::mem::take(&mut woken), std::mem::take(&mut force));
            let hold_back =
                !our_turn && !forced && !matches!(wait, Wait::No) && shared.wake_pending();
            if hold_back && !subscribed {
                subscribed = true;
                watch = shared.watch();
            }
            let outcome = if hold_back && watch.is_some() {
                Ok(Acquire::Held { retry_after: None })
            } else {
                attempted = true;
                shared.try_acquire(&token, ttl, fenced)
            };
            if let Some(w) = &watch {
                w.trying(false);
            }
            let (retry_after, error) = match outcome {
                Ok(Acquire::Acquired(lease)) => {
                    if let Some(w) = &watch {
                        w.consume();
                    }
                    if interrupt.is_some_and(Interrupt::is_interrupted) {
                        self.abandon(&token);
                        return Err(Error::Interrupted);
                    }
                    return Ok(Some(self.install(token, lease, started, fenced)));
                }
                Ok(Acquire::Held { retry_after }) => {
                    failing_since = None;
                    token = client.token_for_current_thread();
                    (retry_after, None)
                }
                Err(e) => {
                    metrics.error(&e);
                    // The attempt may have landed: its key, if any, is released (best
                    // effort; a late release can only touch this attempt's key).
                    self.abandon(&token);
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if !e.is_transient() || since.elapsed() >= client.retry.error_timeout_value() {
                        return Err(e.into());
                    }
                    log::debug!(
                        "lock {:?}: transient backend error, retrying: {e}",
                        shared.name
                    );
                    token = client.token_for_current_thread();
                    (None, Some(e))
                }
            };
            let now = Instant::now();
            let deadline = match wait {
                Wait::No => None,
                Wait::Until(d) if now >= d => None,
                Wait::Until(d) => Some(Some(d)),
                Wait::Forever => Some(None),
            };
            let Some(deadline) = deadline else {
                if !attempted {
                    // Held back until the end: look once before giving up.
                    force = true;
                    continue;
                }
                // Out of time: report the last failure if the last attempt failed (its
                // key, if it landed, was released above).
                return match error {
                    Some(e) => Err(e.into()),
                    None => Ok(None),
                };
            };
            // Subscribe after the first contended attempt, then look once more before
            // sleeping: a release between that attempt and the subscription is seen by the
            // second attempt, one after it by the subscription. No wake-up is lost, and an
            // uncontended acquisition pays nothing for the subscription.
            if !subscribed {
                subscribed = true;
                watch = shared.watch();
                if watch.is_some() && error.is_none() {
                    continue;
                }
            }
            let delay = match (&watch, retry_after) {
                // Woken by the release hint; otherwise look when the holder's lease ends.
                (Some(_), Some(remaining)) if error.is_none() => {
                    remaining + Duration::from_micros(rand::random_range(500..=2_000))
                }
                _ => client.retry.delay(attempt, retry_after),
            };
            attempt = attempt.saturating_add(1);
            let wake_at = match (now.checked_add(delay), deadline) {
                (Some(t), Some(d)) => t.min(d),
                (Some(t), None) => t,
                (None, Some(d)) => d,
                (None, None) => now + Duration::from_secs(3600),
            };
            let hint_rx = watch.as_ref().map_or(&never, Watch::receiver);
            select! {
                recv(interrupt_rx) -> _ => return Err(Error::Interrupted),
                recv(hint_rx) -> hint => {
                    if let (Ok(()), Some(w)) = (&hint, &watch) {
                        // Our turn: newcomers of this process hold back until we tried.
                        w.trying(true);
                        woken = true;
                        metrics.woken();
                    }
                    if hint.is_err() {
                        // The subscription died: poll from now on.
                        log::debug!("lock {:?}: release hints lost, polling", shared.name);
                        watch = None;
                    }
                }
                recv(crossbeam_channel::at(wake_at)) -> _ => {}
            }
        }
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
            // expired. Its guards will see they are stale.
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

    /// Best effort: undoes an acquisition that may have landed (an attempt that failed
    /// after the request was sent, or one that won after an interrupt).
    fn abandon(&self, token: &OwnerToken) {
        let released = self.shared.release_at_backend(token);
        if let Err(e) = self.shared.metrics.check(released) {
            log::debug!(
                "lock {:?}: clean-up after a failed acquisition failed: {e}",
                self.shared.name
            );
        }
    }
}
