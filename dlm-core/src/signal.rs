//! The two ends of a lost-lock signal: the hold keeps a [`Signal`] and ends it with a
//! verdict (lost or released); each watcher has an [`Ending`] that wakes when it does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

const UNSET: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// The hold's end of a signal: dropped (or [`end`](Signal::end)ed) when the hold ends.
pub(crate) struct Signal {
    _alive: Sender<()>,
    ending: Ending,
}

impl Signal {
    pub(crate) fn new() -> Signal {
        let (alive, ended) = crossbeam_channel::bounded(0);
        Signal {
            _alive: alive,
            ending: Ending {
                ended,
                how: Arc::new(AtomicU8::new(UNSET)),
            },
        }
    }

    /// A signal that has already ended, as `lost` says.
    pub(crate) fn ended(lost: bool) -> Ending {
        let signal = Signal::new();
        let ending = signal.watcher();
        signal.end(lost);
        ending
    }

    /// A watcher's end of this signal.
    pub(crate) fn watcher(&self) -> Ending {
        self.ending.clone()
    }

    /// Records how the hold ended and wakes every waiter (the sender goes with `self`).
    pub(crate) fn end(self, lost: bool) {
        self.ending
            .how
            .store(if lost { LOST } else { RELEASED }, Ordering::Release);
    }
}

impl Drop for Signal {
    /// A hold dropped without a verdict (it expired and was replaced, or its lock state
    /// went away) was lost.
    fn drop(&mut self) {
        let _ = self
            .ending
            .how
            .compare_exchange(UNSET, LOST, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A watcher's end of a [`Signal`].
#[derive(Clone)]
pub(crate) struct Ending {
    ended: Receiver<()>,
    how: Arc<AtomicU8>,
}

impl Ending {
    /// How the hold ended: `Some(true)` lost, `Some(false)` released, `None` not yet.
    pub(crate) fn verdict(&self) -> Option<bool> {
        match self.how.load(Ordering::Acquire) {
            LOST => Some(true),
            RELEASED => Some(false),
            _ => None,
        }
    }

    /// The channel that disconnects when the hold ends (no message ever comes).
    pub(crate) fn receiver(&self) -> &Receiver<()> {
        &self.ended
    }

    /// Sleeps until the hold ends or `until`, whichever comes first.
    pub(crate) fn wait_until(&self, until: Instant) {
        // A message never comes: the channel disconnects when the signal ends.
        let _ = self.ended.recv_deadline(until);
    }
}
