//! Sentinel's master watcher: a thread that asks the sentinels where the master is every
//! [`WATCH_EVERY`], and says when the master changed (see [`Watcher`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::discovery::Discovery;
use crate::conn::Timeouts;

/// How often a [`Watcher`] asks the sentinels where the master is.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Asks the sentinels where the master is every [`WATCH_EVERY`], so that a client learns
/// of a failover within about that much of the sentinels' announcement even when none of
/// its requests fails (a planned failover leaves the old master answering, as a master,
/// until Sentinel demotes it: about 11 s at Sentinel's default timings), and calls
/// `moved` with the generation it left after each change of master. One thread, stopped
/// and joined on drop.
pub(crate) struct Watcher {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `discovery`; `None` when the thread cannot be started (the client
    /// then learns of a failover when a request fails).
    pub(crate) fn start(
        discovery: &Arc<Discovery>,
        t: Timeouts,
        moved: impl Fn(u64) + Send + 'static,
    ) -> Option<Watcher> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let weak = Arc::downgrade(discovery);
        let spawned = std::thread::Builder::new()
            .name("dlm-redis-sentinel".into())
            .spawn(move || {
                let mut seen = weak.upgrade().map_or(0, |d| d.current_generation());
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(WATCH_EVERY)
                {
                    let Some(d) = weak.upgrade() else { return };
                    if let Err(e) = d.lookup(t) {
                        log::debug!("redis sentinel: watching the master: {e}");
                    }
                    let now = d.current_generation();
                    drop(d);
                    if now != seen {
                        moved(seen);
                        seen = now;
                    }
                }
            });
        match spawned {
            Ok(thread) => Some(Watcher {
                stop: Some(stop),
                thread: Some(thread),
            }),
            Err(e) => {
                log::warn!("redis sentinel: cannot start the master's watcher: {e}");
                None
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watcher")
    }
}
