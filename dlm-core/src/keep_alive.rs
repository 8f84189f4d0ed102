//! What keeps a client going while any of its handles or guards lives: the renewal
//! thread runs, and when the last one goes, the releases still being sent again are
//! awaited.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::release::Releaser;

/// Held by every client handle, lock handle and guard; when the last one is dropped, the
/// watchdog stops and the releases still being sent again are awaited (at most `wait`).
pub(crate) struct KeepAlive {
    stop: Option<Sender<()>>,
    releaser: Arc<Releaser>,
    wait: Duration,
}

impl KeepAlive {
    pub(crate) fn new(releaser: Arc<Releaser>, wait: Duration) -> (Arc<KeepAlive>, Receiver<()>) {
        let (tx, rx) = crossbeam_channel::bounded(0);
        let keep_alive = KeepAlive {
            stop: Some(tx),
            releaser,
            wait,
        };
        (Arc::new(keep_alive), rx)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        // The renewal thread stops first: nothing of this client is held any more.
        drop(self.stop.take());
        let left = self.releaser.wait(self.wait);
        if left > 0 {
            self.releaser.close();
        }
    }
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive").finish_non_exhaustive()
    }
}
