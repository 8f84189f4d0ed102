//! The client: hands out named locks and owns what they share.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{LockBackend, LockName, OwnerToken};
use crate::error::{InvalidArgument, Result};
use crate::lock::{DistributedLock, LockShared};
use crate::retry::RetryPolicy;

/// The lease a lock gets when none is configured: 30 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The longest lease accepted unless raised with [`LockClientBuilder::max_lease`]: 24 h.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// Hands out named locks over one backend; the entry point of the library.
///
/// A client is one lock owner (like one Redisson instance): it draws a 128-bit random id
/// from the OS at creation, and every lock it takes is owned by that id plus the holding
/// thread. Two clients are two owners even in one process. Cloning shares the client.
///
/// ```
/// use dlm_core::{Lock, LockClient};
/// use dlm_memory::MemoryBackend;
///
/// let client = LockClient::new(MemoryBackend::new());
/// let lock = client.get_lock("invoice-42")?;
/// let guard = lock.lock()?;
/// // ... the critical section ...
/// guard.unlock()?;
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) shared: Arc<ClientShared>,
}

pub(crate) struct ClientShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) id: [u8; 16],
    pub(crate) lease: Duration,
    pub(crate) max_lease: Duration,
    pub(crate) reentrant: bool,
    pub(crate) retry: RetryPolicy,
    seq: AtomicU64,
    registry: Mutex<HashMap<LockName, Weak<LockShared>>>,
}

impl ClientShared {
    /// The owner token the calling thread uses for its next acquisition.
    pub(crate) fn token_for_current_thread(&self) -> OwnerToken {
        let seq = if self.reentrant {
            0
        } else {
            self.seq.fetch_add(1, Ordering::Relaxed) + 1
        };
        OwnerToken::new(self.id, thread_no(), seq)
    }

    /// Forgets `lock` when its last handle is gone.
    pub(crate) fn unregister(&self, name: &LockName, lock: *const LockShared) {
        let mut registry = self.registry.lock();
        if registry.get(name).is_some_and(|w| w.as_ptr() == lock) {
            registry.remove(name);
        }
    }

    pub(crate) fn check_lease(&self, lease: Duration) -> Result<Duration, InvalidArgument> {
        if lease < Duration::from_millis(1) {
            return Err(InvalidArgument::new(
                "lease",
                format!("{lease:?} is below the minimum of 1 ms"),
            ));
        }
        if lease > self.max_lease {
            return Err(InvalidArgument::new(
                "lease",
                format!("{lease:?} exceeds the maximum of {:?}", self.max_lease),
            ));
        }
        if Instant::now().checked_add(lease).is_none() {
            return Err(InvalidArgument::new(
                "lease",
                format!("{lease:?} overflows the monotonic clock"),
            ));
        }
        Ok(lease)
    }
}

impl LockClient {
    /// A client over `backend` with the default settings.
    pub fn new(backend: impl LockBackend) -> Self {
        LockClient::builder(Arc::new(backend)).build()
    }

    /// A builder for a client over `backend` (which may be shared with other clients).
    pub fn builder(backend: Arc<dyn LockBackend>) -> LockClientBuilder {
        LockClientBuilder {
            backend,
            lease: DEFAULT_LEASE,
            max_lease: DEFAULT_MAX_LEASE,
            reentrant: true,
            retry: RetryPolicy::default(),
        }
    }

    /// The lock called `name`, with the client's default lease.
    ///
    /// All handles to one name from one client share their hold state, so re-entrancy and
    /// [`Lock::unlock`](crate::Lock::unlock) work across handles.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name that
    /// [`LockName::new`] rejects. No I/O happens here.
    pub fn get_lock(&self, name: &str) -> Result<DistributedLock> {
        let name = LockName::new(name)?;
        let mut registry = self.shared.registry.lock();
        let shared = match registry.get(&name).and_then(Weak::upgrade) {
            Some(shared) => shared,
            None => {
                let shared = Arc::new(LockShared::new(self.shared.clone(), name.clone()));
                registry.insert(name, Arc::downgrade(&shared));
                shared
            }
        };
        drop(registry);
        Ok(DistributedLock::new(shared, self.shared.lease))
    }

    /// The backend this client uses.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.shared.backend
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.shared.backend)
            .field("lease", &self.shared.lease)
            .field("reentrant", &self.shared.reentrant)
            .field("retry", &self.shared.retry)
            .finish_non_exhaustive()
    }
}

/// Configures a [`LockClient`]. Created by [`LockClient::builder`].
#[derive(Debug)]
#[must_use]
pub struct LockClientBuilder {
    backend: Arc<dyn LockBackend>,
    lease: Duration,
    max_lease: Duration,
    reentrant: bool,
    retry: RetryPolicy,
}

impl LockClientBuilder {
    /// The lease of locks whose handle sets none. Checked by [`build`](Self::try_build).
    /// Defaults to 30 s ([`DEFAULT_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest lease any lock of this client may ask for. Defaults to 24 h
    /// ([`DEFAULT_MAX_LEASE`]).
    pub fn max_lease(mut self, max: Duration) -> Self {
        self.max_lease = max;
        self
    }

    /// Whether the holding thread may acquire a lock again without blocking (hold
    /// counts, like Java's `ReentrantLock` and Redisson's `RLock`). When off, a second
    /// acquisition by the holding thread is contention like any other: `try_lock` returns
    /// `Ok(None)` and a blocking `lock` waits for the first hold to end (which, on one
    /// thread, it never does: it deadlocks like `std::sync::Mutex`). Defaults to `true`.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// How waits pace their attempts. Defaults to [`RetryPolicy::default`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease below 1 ms or
    /// above the maximum lease.
    pub fn try_build(self) -> Result<LockClient> {
        let shared = ClientShared {
            backend: self.backend,
            id: random_client_id(),
            lease: self.lease,
            max_lease: self.max_lease,
            reentrant: self.reentrant,
            retry: self.retry,
            seq: AtomicU64::new(0),
            registry: Mutex::new(HashMap::new()),
        };
        shared.check_lease(shared.lease)?;
        Ok(LockClient {
            shared: Arc::new(shared),
        })
    }

    /// Builds the client.
    ///
    /// # Panics
    /// When [`try_build`](Self::try_build) fails: the configured lease is invalid.
    pub fn build(self) -> LockClient {
        match self.try_build() {
            Ok(client) => client,
            Err(e) => panic!("invalid lock client configuration: {e}"),
        }
    }
}

/// 128 bits from the operating system's CSPRNG.
///
/// # Panics
/// If the operating system cannot provide random bytes.
pub(crate) fn random_client_id() -> [u8; 16] {
    use rand::TryRngCore;
    let mut id = [0u8; 16];
    rand::rngs::OsRng
        .try_fill_bytes(&mut id)
        .expect("the operating system's random number generator failed");
    id
}

/// A small number unique to the calling thread for the life of the process.
pub(crate) fn thread_no() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NO: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NO.with(|n| *n)
}
