//! The resource side of fencing: a value that accepts writes only from the newest holder.

use std::fmt;

use parking_lot::Mutex;

use crate::backend::FencingToken;

/// A write was refused: its fencing token is older than one the resource already
/// accepted, so it comes from a holder whose lock has since been taken by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The token the refused write carried.
    pub presented: FencingToken,
    /// The highest token the resource has accepted.
    pub highest: FencingToken,
}

impl fmt::Display for StaleToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fencing token {} (the resource has accepted {})",
            self.presented, self.highest
        )
    }
}

impl std::error::Error for StaleToken {}

/// An in-process resource guarded by fencing tokens (Kleppmann's storage-side check).
///
/// A write carrying token `t` is applied only if no write with a larger token was applied
/// before; the same token may write again (one holder, several writes). A holder that
/// was paused past its lease, and whose lock was taken meanwhile, is refused with
/// [`StaleToken`] as soon as the newer holder has written once.
///
/// ```
/// use dlm_core::{FencedResource, FencingToken};
///
/// let account = FencedResource::new(100_i64);
/// account.write(FencingToken::new(34), |balance| *balance -= 10)?; // holder with token 34
/// account.write(FencingToken::new(35), |balance| *balance -= 20)?; // the next holder
/// // The first holder wakes up from a long pause and tries again: refused.
/// let refused = account.write(FencingToken::new(34), |balance| *balance -= 10);
/// assert!(refused.is_err());
/// assert_eq!(account.read(|balance| *balance), 70);
/// # Ok::<(), dlm_core::StaleToken>(())
/// ```
#[derive(Debug, Default)]
pub struct FencedResource<T> {
    inner: Mutex<(Option<FencingToken>, T)>,
}

impl<T> FencedResource<T> {
    /// A resource holding `value`, that has accepted no token yet.
    pub fn new(value: T) -> Self {
        FencedResource {
            inner: Mutex::new((None, value)),
        }
    }

    /// Applies `write` if `token` is not older than any token accepted before, and
    /// records it.
    ///
    /// # Errors
    /// [`StaleToken`] (and `write` is not called) when a larger token was accepted.
    pub fn write<R>(
        &self,
        token: FencingToken,
        write: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut inner = self.inner.lock();
        if let Some(highest) = inner.0
            && token < highest
        {
            return Err(StaleToken {
                presented: token,
                highest,
            });
        }
        inner.0 = Some(token);
        Ok(write(&mut inner.1))
    }

    /// Reads the value.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.inner.lock().1)
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        self.inner.lock().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    #[test]
    fn accepts_increasing_and_repeated_tokens_and_refuses_older_ones() {
        let r = FencedResource::new(Vec::new());
        r.write(t(1), |v| v.push(1)).unwrap();
        r.write(t(3), |v| v.push(3)).unwrap();
        r.write(t(3), |v| v.push(33)).unwrap();
        let e = r.write(t(2), |v| v.push(2)).unwrap_err();
        assert_eq!(
            e,
            StaleToken {
                presented: t(2),
                highest: t(3)
            }
        );
        assert_eq!(r.read(|v| v.clone()), [1, 3, 33]);
        assert_eq!(r.highest(), Some(t(3)));
        assert!(e.to_string().contains("stale fencing token 2"));
    }
}
