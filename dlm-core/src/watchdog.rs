//! Lease renewal (Redisson's lock watchdog): one thread per client renews every lock
//! acquired without an explicit lease, every `timeout / 3`.
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

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};

use crate::backend::{Lease, LockBackend};
use crate::lock::LockShared;

/// Held by every client handle, lock handle and guard; the watchdog stops when the last
/// one is dropped.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    _stop: Sender<()>,
}

impl KeepAlive {
    pub(crate) fn new() -> (Arc<KeepAlive>, Receiver<()>) {
        let (tx, rx) = crossbeam_channel::bounded(0);
        (Arc::new(KeepAlive { _stop: tx }), rx)
    }
}

/// A hold to renew.
pub(crate) struct Registration {
    pub(crate) lock: Weak<LockShared>,
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

/// Starts the renewal thread; it runs until `stop` disconnects.
pub(crate) fn spawn(
    backend: Arc<dyn LockBackend>,
    config: Config,
    stop: Receiver<()>,
) -> std::io::Result<Sender<Registration>> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("dlm-watchdog".into())
        .spawn(move || run(&*backend, config, &rx, &stop))?;
    Ok(tx)
}

fn run(
    backend: &dyn LockBackend,
    config: Config,
    jobs: &Receiver<Registration>,
    stop: &Receiver<()>,
) {
    let mut entries: Vec<Entry> = Vec::new();
    loop {
        let next = entries.iter().map(|e| e.due).min();
        let timer = next.map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        select! {
            recv(stop) -> _ => return,
            recv(jobs) -> job => match job {
                Ok(reg) => {
                    let due = reg.acquired + config.period();
                    entries.push(Entry { reg, due });
                }
                Err(_) => return,
            },
            recv(timer) -> _ => {}
        }
        let now = Instant::now();
        entries.retain_mut(|e| e.due > now || renew(backend, config, e));
    }
}

/// Renews one due hold. Returns whether to keep renewing it.
fn renew(backend: &dyn LockBackend, config: Config, entry: &mut Entry) -> bool {
    let Some(lock) = entry.reg.lock.upgrade() else {
        return false;
    };
    let generation = entry.reg.generation;
    let token = {
        let state = lock.state.lock();
        match state.holding.as_ref() {
            Some(h) if h.generation == generation && !h.lost => h.token,
            _ => return false, // released, or already lost
        }
    };
    if config
        .max_hold
        .is_some_and(|max| entry.reg.acquired.elapsed() >= max)
    {
        log::info!(
            "lock {:?}: maximum hold time reached; no more renewals, the lease runs out",
            lock.name
        );
        return false;
    }
    // No state lock across the request: the holder can release meanwhile; the result is
    // applied only if the hold is still the same.
    let result = backend.extend(&lock.name, &token, config.timeout);
    let now = Instant::now();
    let mut state = lock.state.lock();
    let Some(holding) = state
        .holding
        .as_mut()
        .filter(|h| h.generation == generation && !h.lost)
    else {
        return false;
    };
    match result {
        Ok(Some(lease)) => {
            let renewed = Lease::new(lease.valid_until());
            holding.lease = match holding.lease.fence() {
                Some(fence) => renewed.with_fence(fence),
                None => renewed,
            };
            entry.due = now + config.period();
            true
        }
        Ok(None) => {
            log::warn!("lock {:?}: lost (renewal found it gone)", lock.name);
            holding.mark_lost();
            false
        }
        Err(e) if now < holding.lease.valid_until() => {
            log::warn!("lock {:?}: renewal failed, retrying: {e}", lock.name);
            let left = holding.lease.valid_until() - now;
            entry.due = now
                + (config.period() / 4)
                    .min(left / 2)
                    .max(Duration::from_millis(1));
            true
        }
        Err(e) => {
            log::warn!(
                "lock {:?}: lost (renewal failed until the lease ran out): {e}",
                lock.name
            );
            holding.mark_lost();
            false
        }
    }
}
