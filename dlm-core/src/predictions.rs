//! Whether the next hold of a lock will read its fencing token, predicted from the last
//! one (see [`TokenDraw::Predicted`](crate::TokenDraw::Predicted)).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::backend::LockName;

/// How many lock names a client's prediction table tells apart (one bit each).
const PREDICTION_BITS: usize = 4096;

/// Whether the last hold of a lock read its fencing token, per lock name of one client:
/// a table of bits indexed by a hash of the name. Kept by the client, not in the lock's
/// [`LockShared`](crate::hold::LockShared): that goes with the last handle of the lock, and a program that calls
/// `client.get_lock(name)?.lock()?` for each use (a common style) would never have a
/// prediction. Bounded (512 bytes) whatever the number of names; two names that share a
/// bit share a prediction, which costs at most a misprediction (an unused draw, or one
/// more request), never a guarantee.
///
/// A name with no hold recorded yet (its `seen` bit clear) is predicted from the client's
/// last recorded hold of any name: a program that takes a lock per entity (`order-123`)
/// and reads every token pays for its tokens in the acquisition from its first hold of
/// each name, and one that never reads them never draws one.
pub(crate) struct Predictions {
    bits: Box<[AtomicU64]>,
    /// Whether a hold of a name of the slot was recorded.
    seen: Box<[AtomicU64]>,
    /// How the client's last recorded hold of any name ended: read its token or not.
    last_read: AtomicBool,
    hasher: RandomState,
}

/// A lock name's place in [`Predictions`]: a word and a bit.
#[derive(Clone, Copy)]
pub(crate) struct PredictionSlot {
    word: usize,
    mask: u64,
}

impl Predictions {
    pub(crate) fn new() -> Self {
        Predictions {
            bits: (0..PREDICTION_BITS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            seen: (0..PREDICTION_BITS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            last_read: AtomicBool::new(false),
            hasher: RandomState::new(),
        }
    }

    pub(crate) fn slot(&self, name: &LockName) -> PredictionSlot {
        let bit = (self.hasher.hash_one(name) % PREDICTION_BITS as u64) as usize;
        PredictionSlot {
            word: bit / 64,
            mask: 1 << (bit % 64),
        }
    }

    /// Whether the next hold of the slot's names will read its token: as the last hold
    /// of them did, or, with none recorded, as the client's last hold of any name did.
    pub(crate) fn read_last_time(&self, slot: PredictionSlot) -> bool {
        if self.seen[slot.word].load(Ordering::Relaxed) & slot.mask == 0 {
            return self.last_read.load(Ordering::Relaxed);
        }
        self.bits[slot.word].load(Ordering::Relaxed) & slot.mask != 0
    }

    /// Records how a hold ended: it read its token (draw with the next acquisition), or
    /// its token was drawn with the acquisition and never read (draw on read next time).
    /// A hold that neither read nor drew changes nothing for its name once it has a
    /// prediction, and tells the client-wide one that tokens go unread.
    pub(crate) fn record(&self, slot: PredictionSlot, read: bool, drew_at_acquisition: bool) {
        if self.last_read.load(Ordering::Relaxed) != read {
            self.last_read.store(read, Ordering::Relaxed);
        }
        let seen = &self.seen[slot.word];
        if seen.load(Ordering::Relaxed) & slot.mask == 0 {
            seen.fetch_or(slot.mask, Ordering::Relaxed);
        }
        let word = &self.bits[slot.word];
        let set = word.load(Ordering::Relaxed) & slot.mask != 0;
        if read && !set {
            word.fetch_or(slot.mask, Ordering::Relaxed);
        } else if !read && drew_at_acquisition && set {
            word.fetch_and(!slot.mask, Ordering::Relaxed);
        }
    }
}
