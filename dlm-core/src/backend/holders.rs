//! Who holds a semaphore or a read-write lock: what
//! [`LockBackend::inspect_group`](super::LockBackend::inspect_group) answers.

use std::time::Duration;

use super::{Claim, FencingToken};

/// The holders of a semaphore or a read-write lock, as the store has them now.
///
/// ```
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// let client = LockClient::builder(MemoryBackend::new())
///     .label("worker-7")
///     .build()?;
/// let jobs = client.get_semaphore("exports", 3)?;
/// let _permit = jobs.acquire()?;
/// let holders = jobs.inspect()?;
/// assert_eq!(holders.permits, Some(3));                 // the count it is held with
/// assert_eq!(holders.holders.len(), 1);
/// assert_eq!(holders.holders[0].label.as_deref(), Some("worker-7"));
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holders {
    /// A semaphore's permit count while a permit is held: the count its holders hold it
    /// with, which an acquisition with another count is refused against. `None` for a
    /// read-write lock, or a semaphore that nobody holds.
    pub permits: Option<u32>,
    /// Every live hold, in no particular order.
    pub holders: Vec<Holder>,
}

impl Holders {
    /// The holders `holders` of a resource held with `permits` permits (a semaphore) or
    /// `None` (a read-write lock, or a free semaphore).
    pub fn new(permits: Option<u32>, holders: Vec<Holder>) -> Self {
        Holders { permits, holders }
    }

    /// Whether nobody holds it.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }

    /// The longest remaining lease among the holders (zero when free): when the resource
    /// is free at the latest if nobody renews.
    pub fn longest(&self) -> Duration {
        self.holders
            .iter()
            .map(|h| h.remaining)
            .max()
            .unwrap_or_default()
    }
}

/// One hold of a semaphore or a read-write lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The kind of hold: [`Claim::Permit`], [`Claim::Read`] or [`Claim::Write`].
    pub claim: Claim,
    /// Its remaining lease, as the store has it (the store's clock).
    pub remaining: Duration,
    /// Who holds it: the label its client gave (host and process by default), if any;
    /// an election's leader: the value it published.
    pub label: Option<String>,
    /// Its fencing token, where the store drew one and reports it (an election's term).
    pub token: Option<FencingToken>,
}

impl Holder {
    /// A hold of kind `claim` with `remaining` lease, labelled `label`.
    pub fn new(claim: Claim, remaining: Duration, label: Option<String>) -> Self {
        Holder {
            claim,
            remaining,
            label,
            token: None,
        }
    }

    /// The same hold, with its fencing token.
    pub fn with_token(mut self, token: Option<FencingToken>) -> Self {
        self.token = token;
        self
    }
}
