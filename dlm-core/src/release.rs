//! Releases, written once for every kind of hold: the release itself, and the undo of a
//! step that failed but may have written a hold.
//!
//! A hold is released by its owner token, which belongs to one acquisition (or one attempt
//! of it, or one downgrade) and to nothing else: a release that reaches the store late, or
//! twice, can only ever delete that hold. So:
//! - a release that fails transiently (the server unreachable, a timeout, an election) is
//!   sent again in the background until it succeeds or the hold's lease has ended, instead
//!   of leaving the name blocked for the rest of the lease;
//! - a step that failed after its request was sent (an acquisition or a downgrade whose
//!   reply was lost, a grant that too few replicas acknowledged, a renewal that came back
//!   after the hold was given up) may have written a hold that nobody owns: its token is
//!   released the same way.
//!
//! The requests sent again come from one thread per client ([`Releaser`]), started by the
//! first of them and ended when none is left. The client's last handle, when dropped,
//! waits for them within [`RetryPolicy::release_wait`](crate::RetryPolicy::release_wait)
//! (the `dlm` command waits for them before it exits); what is left then ends with its
//! lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::{BackendError, Claim, LockBackend, LockName, OwnerToken};
use crate::observe::Metrics;

/// The most releases one client keeps sending again (more are given up: they end with
/// their leases).
const MAX_PENDING: usize = 100_000;
/// The first pause before a release is sent again; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two sends of one release: a release failing during an
/// election is completed within about this long of the new leader.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Releases `owner`'s hold of kind `claim` of `name` at the backend: the mutex's call or
/// the groups' (the one place that chooses).
pub(crate) fn release_at(
    backend: &dyn LockBackend,
    name: &LockName,
    claim: Claim,
    owner: &OwnerToken,
) -> Result<bool, BackendError> {
    match claim {
        Claim::Exclusive => backend.release(name, owner),
        claim => backend.release_group(name, claim, owner),
    }
}

/// A release to send (again).
struct Pending {
    name: LockName,
    claim: Claim,
    owner: OwnerToken,
    /// The end of the hold's lease (the backend's clock): after it the store has let the
    /// hold go by itself.
    until: Instant,
    /// When to send it next (real time).
    next: Instant,
    tries: u32,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Queue {
    /// By when each is due (and a number that keeps equal times apart): the first is the
    /// next to send.
    pending: BTreeMap<(Instant, u64), Pending>,
    /// Numbers the entries of `pending`.
    seq: u64,
    /// Releases being sent by the thread now.
    in_flight: usize,
    /// The thread is running.
    running: bool,
    /// The client is gone and its wait is over: what is left is given up.
    closed: bool,
}

impl Queue {
    fn push(&mut self, p: Pending) {
        self.seq += 1;
        self.pending.insert((p.next, self.seq), p);
    }
}

/// The releases of one client that are sent again in the background.
pub(crate) struct Releaser {
    backend: Arc<dyn LockBackend>,
    queue: Mutex<Queue>,
    /// Signalled when the queue changes (new work, work done, closed).
    changed: Condvar,
}

impl Releaser {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Releaser {
            backend,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        }
    }

    /// Releases `owner`'s hold of kind `claim` of `name` now, and, if that fails
    /// transiently while the hold's lease (ending at `until` on the backend's clock) lasts,
    /// again in the background. Returns the first answer.
    pub(crate) fn release(
        self: &Arc<Self>,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        until: Instant,
        metrics: &Arc<Metrics>,
    ) -> Result<bool, BackendError> {
        let answer = metrics.check(release_at(&*self.backend, name, claim, owner));
        if let Err(e) = &answer
            && e.is_transient()
        {
            log::info!(
                "{} {name:?}: the release failed ({e}); sending it again in the background until the lease ends",
                claim.primitive()
            );
            self.queue(name, claim, owner, until, metrics, backoff(0));
        }
        answer
    }

    /// Releases `owner`'s hold in the background (the calling thread does not wait), as
    /// [`release`](Self::release) does after its first failure: for a thread that must not
    /// wait on the store, such as the renewal thread.
    pub(crate) fn release_later(
        self: &Arc<Self>,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        until: Instant,
        metrics: &Arc<Metrics>,
    ) {
        self.queue(name, claim, owner, until, metrics, Duration::ZERO);
    }

    /// Queues the release of `owner`'s hold for the background, first sent after `after`,
    /// then until it succeeds or `until` (the backend's clock) has passed.
    fn queue(
        self: &Arc<Self>,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        until: Instant,
        metrics: &Arc<Metrics>,
        after: Duration,
    ) {
        if self.backend.now() >= until {
            return;
        }
        let mut q = self.queue.lock();
        if q.closed {
            return;
        }
        if q.pending.len() >= MAX_PENDING {
            log::warn!(
                "{} {name:?}: too many releases to send again; this one is given up (it ends with its lease)",
                claim.primitive()
            );
            return;
        }
        let next = Instant::now() + after;
        q.push(Pending {
            name: name.clone(),
            claim,
            owner: *owner,
            until,
            next,
            tries: 0,
            metrics: metrics.clone(),
        });
        if !q.running {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("dlm-release".into())
                .spawn(move || me.run());
            match spawned {
                Ok(_) => q.running = true,
                Err(e) => {
                    log::error!(
                        "cannot start the release thread; the releases end with their leases: {e}"
                    );
                    q.pending.clear();
                }
            }
        }
        drop(q);
        self.changed.notify_all();
    }

    /// Waits at most `timeout` until no release is left to send; how many are left.
    pub(crate) fn wait(&self, timeout: Duration) -> usize {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = self.queue.lock();
        loop {
            let left = q.pending.len() + q.in_flight;
            if left == 0 {
                return 0;
            }
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut q, d).timed_out() {
                        return q.pending.len() + q.in_flight;
                    }
                }
                None => self.changed.wait(&mut q),
            }
        }
    }

    /// The client is gone: what is left is given up (it ends with its lease), and the
    /// thread ends after the request it is sending, if any.
    pub(crate) fn close(&self) {
        let mut q = self.queue.lock();
        q.closed = true;
        if !q.pending.is_empty() {
            log::warn!(
                "{} release(s) not sent by the time the client was dropped; they end with their leases",
                q.pending.len()
            );
            q.pending.clear();
        }
        drop(q);
        self.changed.notify_all();
    }

    /// The thread: sends the due releases until none is left.
    fn run(self: Arc<Self>) {
        loop {
            let mut job = {
                let mut q = self.queue.lock();
                loop {
                    if q.closed || q.pending.is_empty() {
                        q.pending.clear();
                        q.running = false;
                        drop(q);
                        self.changed.notify_all();
                        return;
                    }
                    let (&(next, seq), _) = q.pending.first_key_value().expect("not empty");
                    if next <= Instant::now() {
                        q.in_flight += 1;
                        break q.pending.remove(&(next, seq)).expect("just seen");
                    }
                    self.changed.wait_until(&mut q, next);
                }
            };
            // A panicking backend must not end the sending again for good (nor leave the
            // release counted as in flight, which would make every wait run out).
            let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                release_at(&*self.backend, &job.name, job.claim, &job.owner)
            }));
            let answer = job.metrics.check(sent.unwrap_or_else(|_| {
                Err(BackendError::new(
                    crate::backend::BackendErrorKind::Other,
                    "the backend panicked",
                ))
            }));
            let what = job.claim.primitive();
            let mut q = self.queue.lock();
            q.in_flight -= 1;
            match answer {
                Ok(released) => log::info!(
                    "{what} {:?}: released on being sent again ({})",
                    job.name,
                    if released {
                        "it was still there"
                    } else {
                        "it was gone"
                    }
                ),
                Err(e) if e.is_transient() && self.backend.now() < job.until && !q.closed => {
                    job.tries += 1;
                    job.next = Instant::now() + backoff(job.tries);
                    q.push(job);
                }
                Err(e) => log::warn!(
                    "{what} {:?}: the release sent again failed ({e}); it ends with its lease",
                    job.name
                ),
            }
            drop(q);
            self.changed.notify_all();
        }
    }
}

/// The pause before send number `tries + 1`: from 10 ms doubling to 500 ms, jittered
/// down by up to half.
fn backoff(tries: u32) -> Duration {
    let base = MIN_BACKOFF
        .saturating_mul(1 << tries.min(10))
        .min(MAX_BACKOFF);
    base.mul_f64(rand::random_range(0.5..=1.0))
}
