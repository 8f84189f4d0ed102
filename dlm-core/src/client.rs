//! The client: hands out named locks and owns what they share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    Claim, IntoBackend, LockBackend, LockName, MAX_LABEL_LEN, check_label, random_client_id,
};
use crate::election::Election;
use crate::error::{InvalidArgument, Result};
use crate::handle::Handle;
use crate::lock::DistributedLock;
use crate::multi::MultiLock;
use crate::retry::RetryPolicy;
use crate::rwlock::ReadWriteLock;
use crate::semaphore::Semaphore;
use crate::token_draw::TokenDraw;

use crate::keep_alive::KeepAlive;
use crate::registry::Registry;
use crate::release::Releaser;
use crate::settings::{ClientShared, Settings, check_lease};
use crate::watchdog::{self, Watchdog};

/// The watchdog timeout: the lease of locks taken without an explicit lease, renewed
/// every third of it while held (Redisson's `lockWatchdogTimeout`): 30 s.
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest lease accepted unless raised with [`LockClientBuilder::max_lease`]: 24 h.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// Hands out named locks over one backend; the entry point of the library.
///
/// A client is one lock owner (like one Redisson instance): it draws a 128-bit random id
/// from the OS at creation, and every lock it takes is owned by that id plus the holding
/// thread. Two clients are two owners even in one process. Cloning shares the client.
///
/// When the last of its handles and guards is dropped, the client stops its renewal
/// thread and waits, at most [`RetryPolicy::release_wait`](crate::RetryPolicy::release_wait)
/// (5 s), for the releases it is sending again after transient failures (usually none:
/// the drop then returns at once).
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
    /// The hold states its handles and guards keep alive.
    registry: Arc<Registry>,
    keep_alive: Arc<KeepAlive>,
}

impl LockClient {
    /// A client over `backend` with the default settings: watchdog-renewed leases of
    /// 30 s, re-entrant, the default [`RetryPolicy`]. `backend` is a backend by value or
    /// an `Arc` of one (see [`IntoBackend`]). Use [`builder`](LockClient::builder) for
    /// other settings.
    pub fn new(backend: impl IntoBackend) -> Self {
        LockClient::from_parts(LockClientBuilder::new(backend.into_backend()))
    }

    /// A builder for a client over `backend`, a backend by value or an `Arc` of one
    /// (which may be shared with other clients).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlm_core::LockClient;
    /// use dlm_memory::MemoryBackend;
    ///
    /// let client = LockClient::builder(MemoryBackend::new())
    ///     .lease(Duration::from_secs(10))
    ///     .build()?;
    /// // A setting out of range is an error, not a panic:
    /// let bad = LockClient::builder(MemoryBackend::new()).lease(Duration::ZERO).build();
    /// assert!(bad.unwrap_err().is_invalid_argument());
    /// # let _ = client;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn builder(backend: impl IntoBackend) -> LockClientBuilder {
        LockClientBuilder::new(backend.into_backend())
    }

    /// A client from checked settings.
    fn from_parts(b: LockClientBuilder) -> LockClient {
        let backend = b.backend;
        let releaser = Arc::new(Releaser::new(backend.clone()));
        let (keep_alive, stop) = KeepAlive::new(releaser.clone(), b.retry.release_wait_value());
        let shared = ClientShared::new(Settings {
            backend: backend.clone(),
            id: random_client_id(),
            lease: b.lease,
            max_lease: b.max_lease,
            watchdog: Arc::new(Watchdog::new(
                backend,
                watchdog::Config {
                    timeout: b.watchdog_timeout,
                    max_hold: b.max_hold,
                },
                stop,
            )),
            reentrant: b.reentrant,
            retry: b.retry,
            metrics: b.metrics,
            metrics_lock_names: b.metrics_lock_names,
            token_draw: b.token_draw,
            label: b.label.map(Arc::from),
            releaser,
        });
        LockClient {
            shared: Arc::new(shared),
            registry: Arc::new(Registry::default()),
            keep_alive,
        }
    }

    /// The lock called `name`, with the client's default lease (by default: a
    /// watchdog-renewed lease).
    ///
    /// All handles to one name from one client share their hold state, so re-entrancy and
    /// [`Lock::unlock`](crate::Lock::unlock) work across handles.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name that
    /// [`LockName::new`] rejects. No I/O happens here.
    pub fn get_lock(&self, name: &str) -> Result<DistributedLock> {
        let name = self.name(name)?;
        let shared = self.registry.lock_state(&self.shared, name);
        Ok(DistributedLock::new(
            shared,
            self.shared.lease,
            self.keep_alive.clone(),
        ))
    }

    /// The locks called `names`, held together or not at all (see [`MultiLock`]), with
    /// the client's default lease. The order of `names` does not matter: they are taken
    /// in one canonical order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for no name at all, a
    /// name given twice, or a name that [`LockName::new`] rejects. No I/O happens here.
    pub fn get_multi_lock<I, S>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut locks = names
            .into_iter()
            .map(|name| self.get_lock(name.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        if locks.is_empty() {
            return Err(
                InvalidArgument::new("names", "a multi-lock needs at least one name").into(),
            );
        }
        locks.sort_by(|a, b| a.name().cmp(b.name()));
        if let Some(twice) = locks.windows(2).find(|w| w[0].name() == w[1].name()) {
            return Err(InvalidArgument::new(
                "names",
                format!("{:?} is named more than once", twice[0].name()),
            )
            .into());
        }
        Ok(MultiLock::new(locks))
    }

    /// The election called `name` (see [`Election`]): its campaigns are one-permit holds
    /// of the semaphore `name`, labelled with the value they publish.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad name; a
    /// [`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported) backend
    /// error when the backend keeps no elections. No I/O happens here.
    pub fn get_election(&self, name: &str) -> Result<Election> {
        Election::new(self, self.name(name)?)
    }

    /// `name` as a [`LockName`] this client's backend can keep (no I/O).
    fn name(&self, name: &str) -> Result<LockName> {
        let name = LockName::new(name)?;
        self.shared.backend.check_name(&name)?;
        Ok(name)
    }

    /// A handle of `claim` (a group kind) on `name`.
    pub(crate) fn group_handle(&self, name: LockName, claim: Claim) -> Result<Handle> {
        Handle::new(
            self.shared.clone(),
            self.registry.clone(),
            name,
            claim,
            self.keep_alive.clone(),
        )
    }

    /// The semaphore called `name` with `permits` permits: at most `permits` holders at
    /// once across every client of the store (see [`Semaphore`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad name or
    /// `permits` of 0; a [`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported)
    /// backend error when the backend keeps no semaphores. No I/O happens here.
    pub fn get_semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        let name = self.name(name)?;
        if permits == 0 {
            return Err(
                InvalidArgument::new("permits", "a semaphore needs at least 1 permit").into(),
            );
        }
        let handle = Handle::new(
            self.shared.clone(),
            self.registry.clone(),
            name,
            Claim::Permit { permits },
            self.keep_alive.clone(),
        )?;
        Ok(Semaphore::new(handle, permits))
    }

    /// The read-write lock called `name` (see [`ReadWriteLock`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad name; a
    /// [`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported) backend
    /// error when the backend keeps no read-write locks. No I/O happens here.
    pub fn get_rw_lock(&self, name: &str) -> Result<ReadWriteLock> {
        let name = self.name(name)?;
        let handle = Handle::new(
            self.shared.clone(),
            self.registry.clone(),
            name,
            Claim::Write,
            self.keep_alive.clone(),
        )?;
        Ok(ReadWriteLock::new(handle))
    }

    /// The backend this client uses.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.shared.backend
    }

    /// The label this client keeps with its holds (see [`LockClientBuilder::label`]).
    pub fn label(&self) -> Option<&str> {
        self.shared.label.as_deref()
    }

    /// Waits at most `timeout` for the releases this client is sending again in the
    /// background (each failed transiently and is sent until it succeeds or its hold's
    /// lease ends), and returns how many are still pending. Call it before a process exits
    /// without dropping its client (`std::process::exit`); the client's last handle waits
    /// for them on drop anyway, at most
    /// [`RetryPolicy::release_wait`](crate::RetryPolicy::release_wait).
    pub fn flush_releases(&self, timeout: Duration) -> usize {
        self.shared.releaser.wait(timeout)
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.shared.backend)
            .field("lease", &self.shared.lease)
            .field("watchdog", &self.shared.watchdog.config())
            .field("reentrant", &self.shared.reentrant)
            .field("retry", &self.shared.retry)
            .field("token_draw", &self.shared.token_draw)
            .field("label", &self.shared.label)
            .finish_non_exhaustive()
    }
}

/// Configures a [`LockClient`]. Created by [`LockClient::builder`].
#[derive(Debug)]
#[must_use]
pub struct LockClientBuilder {
    backend: Arc<dyn LockBackend>,
    lease: Option<Duration>,
    watchdog_timeout: Duration,
    max_hold: Option<Duration>,
    max_lease: Duration,
    reentrant: bool,
    retry: RetryPolicy,
    metrics: bool,
    metrics_lock_names: bool,
    token_draw: TokenDraw,
    label: Option<String>,
}

impl LockClientBuilder {
    fn new(backend: Arc<dyn LockBackend>) -> Self {
        LockClientBuilder {
            backend,
            lease: None,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            max_hold: None,
            max_lease: DEFAULT_MAX_LEASE,
            reentrant: true,
            retry: RetryPolicy::default(),
            metrics: true,
            metrics_lock_names: false,
            token_draw: TokenDraw::default(),
            label: Some(default_label().to_owned()),
        }
    }

    /// A fixed lease for locks whose handle sets none: they expire `lease` after their
    /// acquisition unless extended, and the watchdog leaves them alone. Without it (the
    /// default), locks are watchdog-renewed (see [`watchdog_timeout`](Self::watchdog_timeout)).
    /// Checked by [`build`](Self::build).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The lease of watchdog-renewed locks; one renewal thread per client extends each of
    /// them every third of it while it is held (Redisson's `lockWatchdogTimeout`). A process
    /// that crashes stops renewing, so its locks expire within this timeout. A guard that
    /// is never dropped (`std::mem::forget`) is renewed like a live one: bound that with
    /// [`max_hold`](Self::max_hold). Defaults to 30 s ([`DEFAULT_WATCHDOG_TIMEOUT`]).
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// The longest time a watchdog-renewed lock is renewed: after it, renewals stop and the
    /// lease runs out (a bound for holders that never let go). Defaults to no limit.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
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

    /// Whether the client reports metrics through the [`metrics`](https://docs.rs/metrics)
    /// facade (names, units and labels: [`metric_names`](crate::metric_names)). Defaults to
    /// `true`. The facade does nothing until the application installs a recorder, and the
    /// client registers its metrics with the recorder in place when it is built: install
    /// the recorder first. Off, the client registers nothing and reads no clock for wait
    /// and hold times (two clock reads per acquisition, which only an in-process backend
    /// would notice).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// Whether the client's metrics carry the lock's name as a label
    /// ([`metric_names::LOCK`](crate::metric_names::LOCK)). Defaults to `false`: lock
    /// names are unbounded, and each name becomes time series of its own, so turn this on
    /// only for a small, fixed set of names. A lock's metrics are registered when its
    /// first handle is made ([`LockClient::get_lock`]).
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_lock_names = on;
        self
    }

    /// When fencing tokens are drawn: with the acquisition when the last hold of the
    /// lock read its token (the default), always with it, or always on the first read
    /// (see [`TokenDraw`]).
    ///
    /// ```
    /// use dlm_core::{LockClient, TokenDraw};
    /// use dlm_memory::MemoryBackend;
    ///
    /// // A one-shot program that hands its token to the resource: no earlier hold to
    /// // predict from, so draw it with the acquisition.
    /// let client = LockClient::builder(MemoryBackend::new())
    ///     .token_draw(TokenDraw::AtAcquisition)
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn token_draw(mut self, when: TokenDraw) -> Self {
        self.token_draw = when;
        self
    }

    /// How the holds of this client are named for whoever inspects them (`dlm status`,
    /// [`Semaphore::inspect`](crate::Semaphore::inspect)): kept with each permit and
    /// read or write hold. 1 to [`MAX_LABEL_LEN`] bytes without control characters,
    /// checked by [`build`](Self::build). Defaults to `HOST:PID` (the machine's host name
    /// and this process's id); [`no_label`](Self::no_label) keeps none.
    ///
    /// ```
    /// use dlm_core::LockClient;
    /// use dlm_memory::MemoryBackend;
    ///
    /// let client = LockClient::builder(MemoryBackend::new())
    ///     .label("nightly-export@db-3")
    ///     .build()?;
    /// assert_eq!(client.label(), Some("nightly-export@db-3"));
    /// assert!(LockClient::builder(MemoryBackend::new()).label("").build().is_err());
    /// # Ok::<(), dlm_core::Error>(())
    /// ```
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Keeps no label with this client's holds (see [`label`](Self::label)).
    pub fn no_label(mut self) -> Self {
        self.label = None;
        self
    }

    /// Builds the client. No I/O happens here.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease or watchdog
    /// timeout below 1 ms (3 ms) or above the maximum lease, or a bad
    /// [`label`](Self::label).
    pub fn build(self) -> Result<LockClient> {
        if let Some(label) = &self.label {
            check_label(label)?;
        }
        if let Some(lease) = self.lease {
            check_lease(lease, self.max_lease)?;
        }
        check_lease(self.watchdog_timeout, self.max_lease)
            .map_err(|e| InvalidArgument::new("watchdog_timeout", e.reason().to_owned()))?;
        if self.watchdog_timeout < Duration::from_millis(3) {
            return Err(InvalidArgument::new("watchdog_timeout", "must be at least 3 ms").into());
        }
        Ok(LockClient::from_parts(self))
    }
}

/// `HOST:PID`: the machine's host name (from the kernel, `/etc/hostname` or the
/// environment; `localhost` when none says) and this process's id, made once.
fn default_label() -> &'static str {
    static LABEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LABEL.get_or_init(|| {
        let host = ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|path| std::fs::read_to_string(path).ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|h| {
                h.trim()
                    .chars()
                    .filter(|c| !c.is_control())
                    .collect::<String>()
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let pid = std::process::id();
        let mut host = host;
        // Room for ':' and the pid within the label's limit.
        while host.len() > MAX_LABEL_LEN - 12 {
            host.pop();
        }
        format!("{host}:{pid}")
    })
}

#[cfg(test)]
mod tests {
    //! The watchdog's schedule, seen through a client.
    use std::time::Instant;

    use super::*;
    use crate::Lock;
    use crate::backend::{Acquire, BackendError, Lease, OwnerToken};

    /// Grants every request at once: only the front's own work is left.
    #[derive(Debug)]
    struct Grant;

    impl LockBackend for Grant {
        fn try_acquire(
            &self,
            _: &LockName,
            _: &OwnerToken,
            ttl: Duration,
        ) -> Result<Acquire, BackendError> {
            Ok(Acquire::Acquired(Lease::new(Instant::now() + ttl)))
        }
        fn extend(
            &self,
            _: &LockName,
            _: &OwnerToken,
            ttl: Duration,
        ) -> Result<Option<Lease>, BackendError> {
            Ok(Some(Lease::new(Instant::now() + ttl)))
        }
        fn release(&self, _: &LockName, _: &OwnerToken) -> Result<bool, BackendError> {
            Ok(true)
        }
        fn force_release(&self, _: &LockName) -> Result<bool, BackendError> {
            Ok(true)
        }
        fn inspect(&self, _: &LockName) -> Result<Option<Duration>, BackendError> {
            Ok(None)
        }
    }

    #[test]
    fn ended_holds_leave_the_schedule_and_do_not_wake_the_thread() {
        let client = LockClient::new(Grant);
        let watchdog = client.shared.watchdog.clone();
        let locks: Vec<_> = (0..8)
            .map(|i| client.get_lock(&format!("l{i}")).unwrap())
            .collect();
        for i in 0..10_000 {
            let guard = locks[i % locks.len()].lock().unwrap();
            assert_eq!(watchdog.counts().0, 1, "the live hold is scheduled");
            drop(guard);
        }
        let (scheduled, wakes) = watchdog.counts();
        assert_eq!(scheduled, 0, "released holds stayed in the schedule");
        // The first hold starts the thread and wakes it; later holds come due after the
        // time it already sleeps until (the default period is 10 s).
        assert_eq!(wakes, 1, "holds woke the renewal thread");

        let held: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
        assert_eq!(watchdog.counts().0, locks.len());
        drop(held);
        assert_eq!(watchdog.counts().0, 0);
    }

    #[test]
    fn a_hold_due_sooner_than_the_thread_sleeps_wakes_it() {
        let slow = LockClient::builder(Arc::new(Grant))
            .watchdog_timeout(Duration::from_secs(3600))
            .build()
            .unwrap();
        let watchdog = slow.shared.watchdog.clone();
        let a = slow.get_lock("a").unwrap().lock().unwrap();
        assert_eq!(watchdog.counts(), (1, 1));
        // The thread plans once when it starts and once more for the wake-up that `a`
        // sent; then it sleeps until `a` is due.
        let deadline = Instant::now() + Duration::from_secs(10);
        while watchdog.plans() < 2 {
            assert!(
                Instant::now() < deadline,
                "the renewal thread never planned"
            );
            std::thread::yield_now();
        }
        // Pretend it sleeps until later than a new hold's renewal.
        watchdog.set_wake_at(Instant::now() + Duration::from_secs(7200));
        let b = slow.get_lock("b").unwrap().lock().unwrap();
        assert_eq!(watchdog.counts(), (2, 2));
        drop((a, b));
        assert_eq!(watchdog.counts().0, 0);
    }
}
