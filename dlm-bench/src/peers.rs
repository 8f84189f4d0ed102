//! Peer lock libraries as bench systems: `rslock`, `redis-lock`, `redlock` and `redsync`,
//! each in two variants, its default retry settings and its smallest retry delay.
//!
//! Every handle maps a key to `<prefix>:<key>` with a prefix of its own, so that peers
//! never collide with each other (or with dlm and the minimal client).
//!
//! - `try_lock` is one attempt of the peer's own acquisition round (a retry count of 1).
//! - `lock` waits the way the peer's own "block until acquired" call does (its
//!   `acquire`: the retrying `lock` call, again and again), but stops calling once
//!   `max_wait_ms` has passed, so it may run over by the rest of one retrying call.
//!   For `redis-lock`, whose `lock_across` takes a maximum duration, `max_wait_ms` is
//!   that duration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::system::{LockHandle, LockSystem};

/// All peer systems for the given Redis URLs (1 URL = single node, N URLs = N nodes where the
/// peer supports multiple masters; skip a peer for a node count it cannot do). For each peer,
/// two variants: its default retry settings (`"<name> (default)"`) and its smallest retry
/// delay (`"<name> (min retry)"`), as far as the crate lets you configure it.
///
/// All four peers take any number of servers (quorum N/2+1), so every peer is in for
/// every node count. `ttl_ms` is the lease of every lock.
pub fn peers(urls: &[String], ttl_ms: u64) -> Vec<Box<dyn LockSystem>> {
    let mut v: Vec<Box<dyn LockSystem>> = Vec::new();
    for variant in [Variant::Default, Variant::MinRetry] {
        let config = Config {
            urls: urls.to_vec(),
            ttl_ms,
            variant,
        };
        v.push(Box::new(Rslock(config.clone())));
        v.push(Box::new(RedisLock(config.clone())));
        v.push(Box::new(Redlock(config.clone())));
        v.push(Box::new(Redsync(config)));
    }
    v
}

/// Which retry settings a peer system uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The crate's defaults.
    Default,
    /// The smallest retry delay the crate accepts (other settings at their defaults).
    MinRetry,
}

impl Variant {
    /// The suffix in the system's name.
    fn label(self) -> &'static str {
        match self {
            Variant::Default => "default",
            Variant::MinRetry => "min retry",
        }
    }
}

/// What every peer system is configured with.
#[derive(Debug, Clone)]
struct Config {
    urls: Vec<String>,
    ttl_ms: u64,
    variant: Variant,
}

impl Config {
    /// `<peer> (<variant>)`.
    fn name(&self, peer: &str) -> String {
        format!("{peer} ({})", self.variant.label())
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// Calls `attempt` (one call of a peer's own retrying acquisition) until it succeeds, or
/// until `max_wait_ms` has passed after a failed call. At least one call is made.
fn until_deadline(max_wait_ms: u64, mut attempt: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
    loop {
        if attempt() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// A tokio current-thread runtime for one handle (one bench thread); every call
/// `block_on`s it, so the connections' driver tasks run on the calling thread.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio current-thread runtime")
}

// --- rslock ---------------------------------------------------------------------------

/// `rslock`'s default retry count (`DEFAULT_RETRY_COUNT`, private in the crate).
const RSLOCK_DEFAULT_RETRY_COUNT: u32 = 3;
/// `rslock`'s smallest retry delay: it sleeps `random_range(0..delay_ms)` between tries,
/// which panics for 0 ms, so 1 ms (every sleep is then 0 ms).
const RSLOCK_MIN_RETRY_DELAY: Duration = Duration::from_millis(1);

/// `rslock` 0.10 (async Redlock over multiplexed connections).
///
/// Default: `LockManager::new(urls)` as is (3 tries, random 0..200 ms between tries).
/// Min retry: `set_retry(3, 1 ms)`. `try_lock`: a clone with `set_retry(1, 1 ms)`.
struct Rslock(Config);

impl LockSystem for Rslock {
    fn name(&self) -> String {
        self.0.name("rslock")
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let mut manager = rslock::LockManager::new(self.0.urls.clone());
        if self.0.variant == Variant::MinRetry {
            manager.set_retry(RSLOCK_DEFAULT_RETRY_COUNT, RSLOCK_MIN_RETRY_DELAY);
        }
        // A clone shares the connections; only the retry settings differ.
        let mut once = manager.clone();
        once.set_retry(1, RSLOCK_MIN_RETRY_DELAY);
        Box::new(RslockHandle {
            rt: runtime(),
            manager,
            once,
            ttl: self.0.ttl(),
            held: None,
        })
    }
}

/// One thread's `rslock` lock manager (its own connections) and runtime.
struct RslockHandle {
    rt: Runtime,
    /// The variant's retry settings.
    manager: rslock::LockManager,
    /// One try.
    once: rslock::LockManager,
    ttl: Duration,
    held: Option<rslock::Lock>,
}

impl RslockHandle {
    fn acquire(&mut self, key: &str, once: bool) -> bool {
        let resource = format!("rslock:{key}");
        let manager = if once { &self.once } else { &self.manager };
        match self
            .rt
            .block_on(manager.lock(resource.as_bytes(), self.ttl))
        {
            Ok(lock) => {
                self.held = Some(lock);
                true
            }
            Err(_) => false,
        }
    }
}

impl LockHandle for RslockHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        self.acquire(key, true)
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        until_deadline(max_wait_ms, || self.acquire(key, false))
    }

    fn unlock(&mut self) {
        if let Some(lock) = self.held.take() {
            self.rt.block_on(self.manager.unlock(&lock));
        }
    }
}

// --- redis-lock -------------------------------------------------------------------------

/// The window of a `redis-lock` `try_lock`: `lock_across` has no try count, only a
/// maximum duration checked before each try, and it sleeps `retry` after a failed try. With
/// `retry == duration` it makes exactly one try (unless the thread stalls for this long
/// between two statements); a failed `try_lock` therefore costs this sleep.
const REDIS_LOCK_TRY_WINDOW: Duration = Duration::from_millis(1);

/// `redis-lock` 0.5 `lock_across` (async Redlock over multiplexed connections).
///
/// `lock_across` runs a future while it holds the lock, so a handle spawns it on its runtime
/// with a future that reports the acquisition and then waits for `unlock`.
/// Default: `LockAcrossOptions { ttl, retry: DEFAULT_RETRY_DELAY (100 ms), duration:
/// max_wait_ms }`. Min retry: `retry: 0`. `try_lock`: `retry = duration = 1 ms`.
struct RedisLock(Config);

impl LockSystem for RedisLock {
    fn name(&self) -> String {
        self.0.name("redis-lock")
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let rt = runtime();
        let conns = rt.block_on(async {
            let mut conns = Vec::with_capacity(self.0.urls.len());
            for url in &self.0.urls {
                let client = redis_lock_redis::Client::open(url.as_str())
                    .unwrap_or_else(|e| panic!("redis-lock: bad URL {url}: {e}"));
                let con = client
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| panic!("redis-lock: connecting to {url}: {e}"));
                conns.push(Arc::new(tokio::sync::Mutex::new(con)));
            }
            conns
        });
        let retry = match self.0.variant {
            Variant::Default => redis_lock::DEFAULT_RETRY_DELAY,
            Variant::MinRetry => Duration::ZERO,
        };
        Box::new(RedisLockHandle {
            rt,
            conns,
            ttl: self.0.ttl(),
            retry,
            held: None,
        })
    }
}

/// A multiplexed connection of `redis-lock`'s own `redis` version.
type RedisLockConn = Arc<tokio::sync::Mutex<redis_lock_redis::aio::MultiplexedConnection>>;

/// One thread's `redis-lock` connections (one per server) and runtime.
struct RedisLockHandle {
    rt: Runtime,
    conns: Vec<RedisLockConn>,
    ttl: Duration,
    retry: Duration,
    /// While a lock is held: the signal that ends the `lock_across` future, and its task.
    held: Option<(oneshot::Sender<()>, JoinHandle<bool>)>,
}

impl RedisLockHandle {
    /// Runs `lock_across` on a task until it has acquired the lock (`true`, the task then
    /// waits for `unlock`) or given up (`false`).
    fn acquire(&mut self, key: &str, retry: Duration, duration: Duration) -> bool {
        let (acquired_tx, acquired_rx) = oneshot::channel::<()>();
        let (release_tx, release_rx) = oneshot::channel::<()>();
        let conns = self.conns.clone();
        let resource = format!("redis-lock:{key}");
        let options = redis_lock::LockAcrossOptions {
            ttl: self.ttl,
            retry,
            duration,
        };
        let task = self.rt.spawn(async move {
            let critical_section = async move {
                let _ = acquired_tx.send(());
                let _ = release_rx.await;
            };
            redis_lock::lock_across(&conns, &resource, critical_section, options)
                .await
                .is_ok()
        });
        // The sender is dropped unused when `lock_across` gives up.
        if self.rt.block_on(acquired_rx).is_ok() {
            self.held = Some((release_tx, task));
            true
        } else {
            let _ = self.rt.block_on(task);
            false
        }
    }
}

impl LockHandle for RedisLockHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        self.acquire(key, REDIS_LOCK_TRY_WINDOW, REDIS_LOCK_TRY_WINDOW)
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        self.acquire(key, self.retry, Duration::from_millis(max_wait_ms))
    }

    fn unlock(&mut self) {
        if let Some((release, task)) = self.held.take() {
            let _ = release.send(());
            let _ = self.rt.block_on(task);
        }
    }
}

// --- redlock ------------------------------------------------------------------------------

/// `redlock`'s default retry count (`DEFAULT_RETRY_COUNT`, private in the crate).
const REDLOCK_DEFAULT_RETRY_COUNT: u32 = 3;
/// `redlock`'s smallest retry delay in ms: it sleeps `gen_range(0..delay)` after each failed
/// try, which panics for 0, so 1 (every sleep is then 0 ms).
const REDLOCK_MIN_RETRY_DELAY_MS: u32 = 1;

/// `redlock` 2 (sync Redlock; a new connection per command).
///
/// Default: `RedLock::new(urls)` as is (3 tries, random 0..200 ms after each failed try).
/// Min retry: `set_retry(3, 1)`. `try_lock`: a clone with `set_retry(1, 1)`, so that a
/// failed try does not sleep either.
struct Redlock(Config);

impl LockSystem for Redlock {
    fn name(&self) -> String {
        self.0.name("redlock")
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let urls: Vec<&str> = self.0.urls.iter().map(String::as_str).collect();
        let mut manager = redlock::RedLock::new(urls);
        if self.0.variant == Variant::MinRetry {
            manager.set_retry(REDLOCK_DEFAULT_RETRY_COUNT, REDLOCK_MIN_RETRY_DELAY_MS);
        }
        let mut once = manager.clone();
        once.set_retry(1, REDLOCK_MIN_RETRY_DELAY_MS);
        Box::new(RedlockHandle {
            manager,
            once,
            ttl_ms: usize::try_from(self.0.ttl_ms).expect("TTL fits usize"),
            held: None,
        })
    }
}

/// One thread's `redlock` lock manager.
struct RedlockHandle {
    /// The variant's retry settings.
    manager: redlock::RedLock,
    /// One try.
    once: redlock::RedLock,
    ttl_ms: usize,
    /// The held lock's resource and value (a `redlock::Lock` borrows its manager).
    held: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedlockHandle {
    fn acquire(&mut self, key: &str, once: bool) -> bool {
        let resource = format!("redlock-rs:{key}");
        let manager = if once { &self.once } else { &self.manager };
        match manager.lock(resource.as_bytes(), self.ttl_ms) {
            Ok(Some(lock)) => {
                self.held = Some((lock.resource, lock.val));
                true
            }
            Ok(None) | Err(_) => false,
        }
    }
}

impl LockHandle for RedlockHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        self.acquire(key, true)
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        until_deadline(max_wait_ms, || self.acquire(key, false))
    }

    fn unlock(&mut self) {
        if let Some((resource, val)) = self.held.take() {
            self.manager.unlock(&redlock::Lock {
                resource,
                val,
                validity_time: 0,
                lock_manager: &self.manager,
            });
        }
    }
}

// --- redsync ------------------------------------------------------------------------------

/// `redsync` 1 (sync Redlock; a new connection per command, connect timeout 1% of the TTL,
/// so the TTL must be at least 100 ms).
///
/// Default: `Redsync::new(instances)` (3 tries, 200 ms ± 100 ms between tries).
/// Min retry: `RedsyncBuilder::new(instances).retry_delay(0).build()`.
/// `try_lock`: `RedsyncBuilder::new(instances).retry_count(1).build()`.
struct Redsync(Config);

impl Redsync {
    fn instances(&self) -> Vec<redsync::RedisInstance> {
        self.0
            .urls
            .iter()
            .map(|url| {
                redsync::RedisInstance::new(url.as_str())
                    .unwrap_or_else(|e| panic!("redsync: bad URL {url}: {e}"))
            })
            .collect()
    }
}

impl LockSystem for Redsync {
    fn name(&self) -> String {
        self.0.name("redsync")
    }

    fn handle(&self) -> Box<dyn LockHandle> {
        let manager = match self.0.variant {
            Variant::Default => redsync::Redsync::new(self.instances()),
            Variant::MinRetry => redsync::RedsyncBuilder::new(self.instances())
                .retry_delay(Duration::ZERO)
                .build(),
        };
        let once = redsync::RedsyncBuilder::new(self.instances())
            .retry_count(1)
            .build();
        Box::new(RedsyncHandle {
            manager,
            once,
            ttl: self.0.ttl(),
            held: None,
        })
    }
}

/// One thread's `redsync` lock manager.
struct RedsyncHandle {
    /// The variant's retry settings.
    manager: redsync::Redsync<redsync::RedisInstance>,
    /// One try.
    once: redsync::Redsync<redsync::RedisInstance>,
    ttl: Duration,
    held: Option<redsync::Lock>,
}

impl RedsyncHandle {
    fn acquire(&mut self, key: &str, once: bool) -> bool {
        let resource = format!("redsync:{key}");
        let manager = if once { &self.once } else { &self.manager };
        match manager.lock(&resource, self.ttl) {
            Ok(lock) => {
                self.held = Some(lock);
                true
            }
            Err(_) => false,
        }
    }
}

impl LockHandle for RedsyncHandle {
    fn try_lock(&mut self, key: &str) -> bool {
        self.acquire(key, true)
    }

    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool {
        until_deadline(max_wait_ms, || self.acquire(key, false))
    }

    fn unlock(&mut self) {
        if let Some(lock) = self.held.take() {
            let _ = self.manager.unlock(&lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use dlm_testkit::redis_server::{RedisNodes, RedisServer, require_redis_server};

    use super::*;

    /// The bench's lease (redsync needs at least 100 ms).
    const TTL_MS: u64 = 30_000;

    fn fresh_key(tag: &str) -> String {
        format!("peers-test-{tag}-{:016x}", rand::random::<u64>())
    }

    /// The exclusion and hand-over checks of one system.
    fn check(system: &dyn LockSystem) {
        let name = system.name();
        let key = fresh_key("check");
        let mut a = system.handle();
        let mut b = system.handle();

        assert!(a.try_lock(&key), "{name}: try_lock on a fresh key");
        let t0 = Instant::now();
        assert!(!b.try_lock(&key), "{name}: try_lock on a held key");
        let failed_try = t0.elapsed();
        assert!(
            failed_try < Duration::from_millis(100),
            "{name}: a failed try_lock took {failed_try:?} (more than one attempt?)"
        );
        a.unlock();
        assert!(b.try_lock(&key), "{name}: try_lock after unlock");

        // b holds the key and releases it from another thread after ~100 ms.
        let releaser = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            b.unlock();
            b
        });
        let t0 = Instant::now();
        assert!(
            a.lock(&key, 2_000),
            "{name}: lock while the holder releases"
        );
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(50),
            "{name}: lock returned after {waited:?}, before the holder released"
        );
        eprintln!("{name}: failed try_lock {failed_try:?}, lock waited {waited:?}");
        let mut b = releaser.join().expect("releaser thread");
        assert!(!b.try_lock(&key), "{name}: try_lock while lock() holds");
        a.unlock();
        assert!(b.try_lock(&key), "{name}: try_lock after lock()/unlock");
        b.unlock();
    }

    /// `lock` on a key that stays held gives up, in bounded time.
    fn check_bounded(system: &dyn LockSystem) {
        let name = system.name();
        let key = fresh_key("bounded");
        let mut a = system.handle();
        let mut b = system.handle();
        assert!(a.try_lock(&key), "{name}: try_lock on a fresh key");
        let t0 = Instant::now();
        assert!(!b.lock(&key, 300), "{name}: lock on a held key");
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(1_500),
            "{name}: lock(300 ms) on a held key returned after {waited:?}"
        );
        eprintln!("{name}: lock(300 ms) on a held key gave up after {waited:?}");
        a.unlock();
    }

    fn check_all(urls: &[String]) {
        let systems = peers(urls, TTL_MS);
        assert_eq!(systems.len(), 8, "4 peers x 2 variants");
        thread::scope(|s| {
            for system in &systems {
                s.spawn(|| {
                    check(system.as_ref());
                    check_bounded(system.as_ref());
                });
            }
        });
    }

    #[test]
    fn peers_names_are_distinct() {
        let systems = peers(&["redis://127.0.0.1:1/".to_owned()], TTL_MS);
        let mut names: Vec<String> = systems.iter().map(|s| s.name()).collect();
        assert!(names.contains(&"rslock (default)".to_owned()));
        assert!(names.contains(&"redsync (min retry)".to_owned()));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 8);
    }

    #[test]
    fn peers_single_node() {
        require_redis_server();
        let server = RedisServer::spawn();
        check_all(&[server.url()]);
    }

    #[test]
    fn peers_three_nodes() {
        require_redis_server();
        let nodes = RedisNodes::spawn(3);
        check_all(&nodes.urls());
    }

    /// Every peer takes the same key at once: their key layouts do not collide.
    #[test]
    fn peers_do_not_collide() {
        require_redis_server();
        let server = RedisServer::spawn();
        let systems = peers(&[server.url()], TTL_MS);
        let key = fresh_key("shared");
        // One per peer (the two variants of a peer share its key layout).
        let mut handles: Vec<(String, Box<dyn LockHandle>)> = systems
            .iter()
            .filter(|s| s.name().ends_with("(default)"))
            .map(|s| (s.name(), s.handle()))
            .collect();
        assert_eq!(handles.len(), 4);
        for (name, h) in &mut handles {
            assert!(h.try_lock(&key), "{name}: key taken by another peer");
        }
        for (_, h) in &mut handles {
            h.unlock();
        }
    }
}
