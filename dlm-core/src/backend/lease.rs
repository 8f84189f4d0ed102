//! What an acquisition grants: a lease and, where the backend issues them, a fencing
//! token.

use std::fmt;
use std::time::Instant;

/// A fencing token: a number that grows with every acquisition of one lock name.
///
/// Hand it to the resource the lock protects; the resource rejects any token lower than
/// the highest it has seen, which keeps out a holder whose lease ran out while it was
/// paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw token value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What one successful acquisition (or extension) grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    valid_until: Instant,
    fence: Option<FencingToken>,
}

impl Lease {
    /// A lease that is valid until `valid_until`: a monotonic instant that the backend has
    /// already reduced by the time the request took and by any clock drift allowance.
    pub fn new(valid_until: Instant) -> Self {
        Lease {
            valid_until,
            fence: None,
        }
    }

    /// The same lease carrying a fencing token: for a backend whose tokens cost nothing
    /// to hand out with every acquisition (otherwise the front asks for one with
    /// [`LockBackend::fence`](crate::backend::LockBackend::fence) when it is read).
    pub fn with_fence(mut self, fence: FencingToken) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Until when the holder may assume the lock is its own.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The fencing token handed out with this acquisition, if the backend does so.
    pub fn fence(&self) -> Option<FencingToken> {
        self.fence
    }
}
