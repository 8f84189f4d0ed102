//! The contract between the generic front and a backend.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{BackendError, InvalidArgument};

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// A validated lock name: 1 to [`MAX_NAME_LEN`] bytes of UTF-8 without control characters.
///
/// Cheap to clone. Backends receive names only in this form, so they never see an empty,
/// over-long or control-character name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`InvalidArgument`] (argument `"name"`) when it is empty, longer than
    /// [`MAX_NAME_LEN`] bytes, or contains a control character (NUL, newline, ...).
    pub fn new(name: &str) -> Result<Self, InvalidArgument> {
        if name.is_empty() {
            return Err(InvalidArgument::new("name", "must not be empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(InvalidArgument::new(
                "name",
                format!("is {} bytes, at most {MAX_NAME_LEN} allowed", name.len()),
            ));
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(InvalidArgument::new(
                "name",
                format!("contains the control character {c:?}"),
            ));
        }
        Ok(LockName(name.into()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifies who holds a lock: 128 random bits drawn from the OS CSPRNG once per
/// [`LockClient`](crate::LockClient), the holding thread, and a sequence number: every
/// acquisition that reaches the backend has a token of its own (re-entry is counted by the
/// front and never reaches the backend).
///
/// It is a secret: whoever knows it can release or extend the lock. `Debug` redacts it;
/// only backends see it, through [`OwnerToken::encode`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken {
    client: [u8; 16],
    thread: u64,
    seq: u64,
}

impl OwnerToken {
    pub(crate) fn new(client: [u8; 16], thread: u64, seq: u64) -> Self {
        OwnerToken {
            client,
            thread,
            seq,
        }
    }

    /// A token for tests of backends: random client bits, the given thread number.
    pub fn random_for_tests(thread: u64) -> Self {
        OwnerToken::new(crate::client::random_client_id(), thread, 0)
    }

    /// The token as the string a backend stores: 32 hex digits, `:`, the thread number,
    /// `:`, the sequence number. Never log it.
    pub fn encode(&self) -> String {
        self.encoded().as_str().to_owned()
    }

    /// [`encode`](OwnerToken::encode) without allocating: the same text in a buffer on the
    /// stack (backends write it into every request).
    pub fn encoded(&self) -> EncodedOwnerToken {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = EncodedOwnerToken {
            buf: [0; ENCODED_MAX],
            len: 0,
        };
        for (i, b) in self.client.iter().enumerate() {
            out.buf[2 * i] = HEX[usize::from(b >> 4)];
            out.buf[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        let mut len = 32;
        for n in [self.thread, self.seq] {
            out.buf[len] = b':';
            len += 1;
            let mut digits = itoa::Buffer::new();
            let d = digits.format(n).as_bytes();
            out.buf[len..len + d.len()].copy_from_slice(d);
            len += d.len();
        }
        out.len = len;
        out
    }
}

/// 32 hex digits, two colons, two 20-digit numbers at most.
const ENCODED_MAX: usize = 32 + 2 * (1 + 20);

/// An [`OwnerToken`] encoded for a backend (see [`OwnerToken::encoded`]). A secret like the
/// token: `Debug` redacts it.
#[derive(Clone, Copy)]
pub struct EncodedOwnerToken {
    buf: [u8; ENCODED_MAX],
    len: usize,
}

impl EncodedOwnerToken {
    /// The encoded token.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The encoded token as text (ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("hex digits, colons and decimal digits")
    }
}

impl fmt::Debug for EncodedOwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncodedOwnerToken(<redacted>)")
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_is_hex_then_thread_then_sequence() {
        let t = OwnerToken::new([0xab; 16], 7, 1234567890123);
        assert_eq!(t.encode(), format!("{}:7:1234567890123", "ab".repeat(16)));
        assert_eq!(
            OwnerToken::new([0; 16], 0, u64::MAX).encode(),
            format!("{}:0:{}", "00".repeat(16), u64::MAX)
        );
        assert_eq!(format!("{t:?}"), "OwnerToken(<redacted>)");
        assert_eq!(t.encoded().as_bytes(), t.encode().as_bytes());
        assert_eq!(
            format!("{:?}", t.encoded()),
            "EncodedOwnerToken(<redacted>)"
        );
    }
}

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

    /// The same lease carrying a fencing token.
    pub fn with_fence(mut self, fence: FencingToken) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Until when the holder may assume the lock is its own.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The fencing token of this acquisition, if the backend issues them.
    pub fn fence(&self) -> Option<FencingToken> {
        self.fence
    }
}

/// The outcome of one acquisition attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The lock is ours.
    Acquired(Lease),
    /// Someone else holds it.
    Held {
        /// The holder's remaining lease, when known: the lock cannot become free by
        /// expiry before then, so a waiter need not look again sooner (unless woken).
        retry_after: Option<Duration>,
    },
}

/// What a [`Watch`] does when it is dropped; implemented by backends that keep a
/// registry of waiters.
pub trait Unsubscribe: Send + 'static {
    /// Removes the waiter. `pending_wake` is `true` when a wake-up had been delivered to
    /// it but not consumed: the registry should hand it to another waiter.
    fn unsubscribe(self: Box<Self>, pending_wake: bool);

    /// The front took a wake-up and is making the attempt it was for (`true`), or that
    /// attempt is over (`false`). A registry that answers
    /// [`LockBackend::wake_pending`] counts a trying waiter as a hand-over under way.
    fn trying(&self, on: bool) {
        let _ = on;
    }
}

/// A subscription to release hints for one lock name, returned by
/// [`LockBackend::watch`]. Unsubscribes when dropped.
pub struct Watch {
    receiver: crossbeam_channel::Receiver<()>,
    guard: Option<Box<dyn Unsubscribe>>,
}

impl Watch {
    /// A watch over `receiver`, with nothing to undo on drop.
    pub fn new(receiver: crossbeam_channel::Receiver<()>) -> Self {
        Watch {
            receiver,
            guard: None,
        }
    }

    /// A watch over `receiver` that calls `guard` when dropped.
    pub fn with_unsubscribe(
        receiver: crossbeam_channel::Receiver<()>,
        guard: Box<dyn Unsubscribe>,
    ) -> Self {
        Watch {
            receiver,
            guard: Some(guard),
        }
    }

    /// The channel a hint arrives on. A hint means "probably released: try again"; a
    /// disconnected channel means the subscription died (fall back to polling).
    pub fn receiver(&self) -> &crossbeam_channel::Receiver<()> {
        &self.receiver
    }

    /// Drops any delivered hint: the waiter used it (it won the lock), so it must not be
    /// passed on to another waiter when the watch is dropped.
    pub fn consume(&self) {
        while self.receiver.try_recv().is_ok() {}
    }

    /// Tells the registry that this waiter took a wake-up and is making the attempt it was
    /// for (`true`), or that the attempt is over (`false`); see
    /// [`LockBackend::wake_pending`].
    pub fn trying(&self, on: bool) {
        if let Some(guard) = &self.guard {
            guard.trying(on);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let pending = !self.receiver.is_empty();
            guard.unsubscribe(pending);
        }
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("pending", &self.receiver.len())
            .finish_non_exhaustive()
    }
}

/// One hold to renew, for [`LockBackend::extend_many`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Renewal<'a> {
    /// The lock's name.
    pub name: &'a LockName,
    /// The holder's token.
    pub owner: &'a OwnerToken,
    /// The lease to set from now.
    pub ttl: Duration,
}

impl<'a> Renewal<'a> {
    /// A renewal of `name`, held by `owner`, for `ttl`.
    pub fn new(name: &'a LockName, owner: &'a OwnerToken, ttl: Duration) -> Self {
        Renewal { name, owner, ttl }
    }
}

/// A lock store: one bounded attempt per call, never sleeping, never retrying.
///
/// The generic front ([`LockClient`](crate::LockClient)) implements waiting, deadlines,
/// interrupts, re-entrancy and guards once, on top of these calls. Implement this trait to
/// plug in a new store:
///
/// 1. Keep per name: the owner token of the holder and its expiry. If you issue fencing
///    tokens, every acquisition of a name must get a larger token than every earlier
///    acquisition of it, even after your store loses state (dlm-memory: one counter per
///    store; dlm-redis: stream IDs, which restart from the server's clock).
/// 2. [`try_acquire`](LockBackend::try_acquire) takes the name if it is free (or already
///    held by the same token, which refreshes the lease), with an expiry: no acquire path
///    may leave a name held without one.
/// 3. [`extend`](LockBackend::extend) and [`release`](LockBackend::release) act only when
///    the token still holds the name, and never re-create a missing entry.
/// 4. Return within your I/O deadline; map failures to [`BackendError`] kinds so the front
///    knows what to retry.
/// 5. Run the conformance suite of `dlm-testkit` against it.
///
/// For a walk-through, see the `dlm-testkit` crate's `guide` module: the contract in
/// detail, a complete backend (a map behind a mutex) and the conformance suite run
/// against it.
///
/// Contention is not an error: it is [`Acquire::Held`]. Calling a backend directly (the
/// front does this; users rarely need to):
///
/// ```
/// use std::time::Duration;
/// use dlm_core::{Acquire, LockBackend, LockName, OwnerToken};
/// use dlm_memory::MemoryBackend;
///
/// let backend = MemoryBackend::new();
/// let name = LockName::new("report")?;
/// let (me, other) = (OwnerToken::random_for_tests(1), OwnerToken::random_for_tests(2));
/// let ttl = Duration::from_secs(10);
/// let Acquire::Acquired(lease) = backend.try_acquire(&name, &me, ttl)? else {
///     panic!("a free lock");
/// };
/// assert!(lease.fence().is_some());
/// assert!(matches!(
///     backend.try_acquire(&name, &other, ttl)?,
///     Acquire::Held { retry_after: Some(_) }   // when the holder's lease ends, at most
/// ));
/// assert!(!backend.release(&name, &other)?);   // not its lock
/// assert!(backend.release(&name, &me)?);
/// assert_eq!(backend.inspect(&name)?, None);    // free
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// One bounded attempt to take `name` for `owner` for `ttl`.
    ///
    /// Idempotent for the same owner: if `owner` already holds `name`, the lease is
    /// refreshed to `ttl` and `Acquired` is returned again (a retry after a lost reply must
    /// never block its own sender). The returned lease's `valid_until` is already reduced by
    /// the time the call took and by the backend's drift allowance.
    fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire, BackendError>;

    /// Resets the expiry of `name` to `ttl` if `owner` still holds it. `Ok(None)`: it is
    /// no longer ours. Never re-creates a missing entry. The returned lease keeps the
    /// fencing token of the acquisition.
    fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<Lease>, BackendError>;

    /// Renews several holds at once: the watchdog's renewal round. One result per
    /// renewal, in order, each what [`extend`](LockBackend::extend) would return for it.
    ///
    /// The default calls `extend` for each in turn. A backend that talks to servers
    /// should batch them (one round trip per server, whatever the number of holds), so
    /// that a client holding many locks does not lose them to one slow server: the
    /// renewals of one round must all be done well within a third of the lease.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Vec<Result<Option<Lease>, BackendError>> {
        renewals
            .iter()
            .map(|r| self.extend(r.name, r.owner, r.ttl))
            .collect()
    }

    /// Releases `name` if `owner` holds it. `Ok(false)`: it was not ours (any more).
    fn release(&self, name: &LockName, owner: &OwnerToken) -> Result<bool, BackendError>;

    /// Releases `name` whoever holds it (administration). `Ok(false)`: it was free.
    fn force_release(&self, name: &LockName) -> Result<bool, BackendError>;

    /// The remaining lease of whoever holds `name`, or `None` if it is free.
    fn inspect(&self, name: &LockName) -> Result<Option<Duration>, BackendError>;

    /// Optional and cheap (no I/O on the caller's thread beyond registering): a
    /// subscription that receives a hint when `name` was probably released. The front
    /// subscribes after its first attempt finds the lock held, then attempts once more
    /// (a release in between is seen by that attempt, a later one by the subscription),
    /// and still bounds every wait by the holder's remaining lease, so a lost hint
    /// costs a bounded delay, never a hang. The default returns `None` (the front
    /// polls).
    fn watch(&self, name: &LockName) -> Option<Watch> {
        let _ = name;
        None
    }

    /// Optional and cheap (no I/O): whether a release hint for `name` has been delivered
    /// to a waiter of this process that has not woken up to use it yet. The front then
    /// lets that waiter try first instead of racing it: a thread that releases and at
    /// once asks again does not barge past the hand-over it just started, so local
    /// waiters are served in turn. The default (`false`) never holds anyone back.
    fn wake_pending(&self, name: &LockName) -> bool {
        let _ = name;
        false
    }

    /// The clock this backend's leases are measured on: the front compares every
    /// [`Lease::valid_until`] it got from this backend with it (whether a guard
    /// [`is_held`](crate::LockGuard::is_held), a re-entry, the watchdog's verdict on a
    /// failed renewal). The default is [`Instant::now`]; override it only for a test
    /// double with a virtual clock (`dlm_memory::ManualClock`), so that its guards see
    /// the leases its store sees. It must never go back. Timeouts of waits are real time
    /// whatever this returns.
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// What a [`LockClient`](crate::LockClient) runs on: any [`LockBackend`] by value (it is
/// put behind an [`Arc`]), or an `Arc` of one, to share one backend (and its
/// connections) between clients. Implemented for those; not meant to be implemented
/// elsewhere.
///
/// ```
/// use std::sync::Arc;
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// // By value: the client owns the backend.
/// let alone = LockClient::new(MemoryBackend::new());
/// // Shared: two clients (two owners) over one store.
/// let shared = Arc::new(MemoryBackend::new());
/// let a = LockClient::new(shared.clone());
/// let b = LockClient::builder(shared).reentrant(false).build()?;
/// # let _ = (alone, a, b);
/// # Ok::<(), dlm_core::Error>(())
/// ```
pub trait IntoBackend: sealed::Sealed {
    /// The backend, shared.
    fn into_backend(self) -> Arc<dyn LockBackend>;
}

mod sealed {
    pub trait Sealed {}
}

impl<B: LockBackend> sealed::Sealed for B {}
impl<B: LockBackend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        Arc::new(self)
    }
}

impl<B: LockBackend> sealed::Sealed for Arc<B> {}
impl<B: LockBackend> IntoBackend for Arc<B> {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        self
    }
}

impl sealed::Sealed for Arc<dyn LockBackend> {}
impl IntoBackend for Arc<dyn LockBackend> {
    fn into_backend(self) -> Arc<dyn LockBackend> {
        self
    }
}
