//! What the harness measures: a lock system, and one per-thread handle of it.

/// A lock implementation under test, configured for one set of servers.
pub trait LockSystem: Send + Sync {
    /// The name in the results, e.g. `dlm`, `minimal`, `rslock (default retry)`.
    fn name(&self) -> String;
    /// A handle for one thread (its own connections or client, as the system intends).
    fn handle(&self) -> Box<dyn LockHandle>;
}

/// One thread's view of a lock system. Keys are plain names; each system maps them to
/// its own key layout. Every call is bounded: a system whose own retry gives up returns
/// `false`.
pub trait LockHandle: Send {
    /// One attempt (no retry): `true` if the lock on `key` is now held by this handle.
    fn try_lock(&mut self, key: &str) -> bool;
    /// Acquire with the system's own waiting/retry behaviour, giving up after about
    /// `max_wait_ms`: `true` if acquired.
    fn lock(&mut self, key: &str, max_wait_ms: u64) -> bool;
    /// Release the lock this handle holds (the last one acquired).
    fn unlock(&mut self);
    /// The `fenced-use` scenario's work under the lock: read the hold's fencing token and
    /// write with it to a fenced resource (with `fresh`, a new one: the name is new,
    /// `fenced-new-names`). `false` if that failed. A system without fencing tokens does
    /// nothing (the minimal client: the bar).
    fn use_token(&mut self, fresh: bool) -> bool {
        let _ = fresh;
        true
    }
}
