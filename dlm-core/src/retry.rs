//! How the front paces its attempts while it waits.

use std::time::Duration;

use rand::Rng;

use crate::error::InvalidArgument;

/// How a waiting acquisition paces its attempts.
///
/// Between attempts the front sleeps for a jittered, exponentially growing backoff, cut
/// short by a release hint from the backend (when it has [`watch`](crate::backend::LockBackend::watch))
/// and capped by the holder's remaining lease (the lock cannot expire before then).
/// Transient backend errors are retried within the caller's wait, but for at most
/// [`error_timeout`](RetryPolicy::error_timeout) in a row, so `lock()` on a dead server
/// reports the failure instead of spinning forever.
///
/// A release that fails transiently is sent again in the background until it succeeds or
/// the hold's lease ends; the client's last handle, when dropped, waits for such releases
/// at most [`release_wait`](RetryPolicy::release_wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    min_backoff: Duration,
    max_backoff: Duration,
    error_timeout: Duration,
    release_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            min_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(200),
            error_timeout: Duration::from_secs(10),
            release_wait: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The default policy: backoff from 2 ms to 200 ms, errors retried for 10 s, releases
    /// being sent again awaited for 5 s when the client is dropped.
    pub fn new() -> Self {
        RetryPolicy::default()
    }

    /// The first backoff and the largest one. Each sleep is drawn uniformly from
    /// `[b/2, b]` where `b` doubles from `min` to `max`. Defaults to 2 ms and 200 ms.
    ///
    /// # Errors
    /// [`InvalidArgument`] when `min` is zero or larger than `max`.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Result<Self, InvalidArgument> {
        if min.is_zero() {
            return Err(InvalidArgument::new("backoff", "minimum must be positive"));
        }
        if min > max {
            return Err(InvalidArgument::new(
                "backoff",
                "minimum must not exceed maximum",
            ));
        }
        self.min_backoff = min;
        self.max_backoff = max;
        Ok(self)
    }

    /// How long transient backend errors (unavailable, timeout, no quorum, busy) are
    /// retried in a row before the wait returns the error. Defaults to 10 s.
    pub fn error_timeout(mut self, timeout: Duration) -> Self {
        self.error_timeout = timeout;
        self
    }

    /// The configured error timeout.
    pub fn error_timeout_value(&self) -> Duration {
        self.error_timeout
    }

    /// How long the last handle of a client, when dropped, waits for the releases that
    /// failed transiently and are being sent again in the background (each until it
    /// succeeds or its hold's lease ends): what is left after it ends with its lease.
    /// Defaults to 5 s; zero does not wait. [`LockClient::flush_releases`](crate::LockClient::flush_releases)
    /// waits for them at any time.
    pub fn release_wait(mut self, wait: Duration) -> Self {
        self.release_wait = wait;
        self
    }

    /// The configured wait for releases on drop.
    pub fn release_wait_value(&self) -> Duration {
        self.release_wait
    }

    /// The sleep before attempt number `attempt + 1` (0-based), with jitter, capped by
    /// `cap` (the holder's remaining lease) when given.
    pub(crate) fn delay(&self, attempt: u32, cap: Option<Duration>) -> Duration {
        let base = self
            .min_backoff
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_backoff);
        let low = base / 2;
        let nanos = rand::rng().random_range(low.as_nanos() as u64..=base.as_nanos() as u64);
        let d = Duration::from_nanos(nanos);
        match cap {
            // +1 ms so that we look just after the expiry, not just before it.
            Some(cap) => d.min(cap + Duration::from_millis(1)),
            None => d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_within_bounds_and_respect_the_cap() {
        let p = RetryPolicy::new()
            .backoff(Duration::from_millis(4), Duration::from_millis(64))
            .unwrap();
        for attempt in 0..30 {
            let d = p.delay(attempt, None);
            assert!(d >= Duration::from_millis(2) && d <= Duration::from_millis(64));
        }
        assert!(p.delay(10, None) >= Duration::from_millis(32));
        assert!(p.delay(10, Some(Duration::ZERO)) <= Duration::from_millis(1));
    }

    #[test]
    fn rejects_bad_backoff() {
        assert!(
            RetryPolicy::new()
                .backoff(Duration::ZERO, Duration::ZERO)
                .is_err()
        );
        assert!(
            RetryPolicy::new()
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
                .is_err()
        );
    }
}
