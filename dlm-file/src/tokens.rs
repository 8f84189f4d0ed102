//! Fencing tokens: one counter per directory, in `.tokens`, drawn under a lock of its own
//! and made durable (`fdatasync`) before a token is handed out.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlm_core::backend::{BackendError, BackendErrorKind, FencingToken};
use parking_lot::Mutex;
use rustix::fs::{FlockOperation, fdatasync, flock};
use rustix::io::{Errno, pread, pwrite};

use crate::dir::Dir;

/// The counter's file in the lock directory (lock files start with `m.`).
pub(crate) const TOKENS_FILE: &str = ".tokens";

/// How long a draw waits for another process's draw to end before it fails (`Timeout`):
/// a draw holds the counter's lock for one read, one write and one `fdatasync`.
const DRAW_WAIT: Duration = Duration::from_secs(2);

/// The counter, opened at the first draw; the mutex orders this process's draws (a
/// `flock` is shared by every thread that uses one open file).
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    file: Mutex<Option<OwnedFd>>,
}

fn failed(what: &str, e: Errno) -> BackendError {
    BackendError::new(
        BackendErrorKind::Other,
        format!("fencing counter ({TOKENS_FILE}): {what}: {e}"),
    )
}

impl Tokens {
    /// A token larger than every token drawn from this directory before, by any process:
    /// `max(last + 1, now in µs since the epoch)`. The counter's file keeps `last`,
    /// written with `fdatasync` before the token is returned; the clock term keeps
    /// tokens increasing when the file was lost (a directory on a tmpfs, after a
    /// reboot), as long as the clock has not gone back below the last token.
    pub(crate) fn draw(&self, dir: &Dir) -> Result<FencingToken, BackendError> {
        let mut file = self.file.lock();
        if file.is_none() {
            *file = dir.open_file(TOKENS_FILE, true)?;
        }
        let fd = file.as_ref().expect("opened above");
        let deadline = Instant::now() + DRAW_WAIT;
        loop {
            match flock(fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(Errno::WOULDBLOCK | Errno::INTR) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(Errno::WOULDBLOCK) => {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "fencing counter ({TOKENS_FILE}): another process held its lock \
                             for {DRAW_WAIT:?} (stopped while drawing?)"
                        ),
                    )
                    .never_sent());
                }
                Err(e) => return Err(failed("flock", e)),
            }
        }
        let drawn = (|| {
            let mut buf = [0u8; 8];
            let n = pread(fd, &mut buf, 0).map_err(|e| failed("read", e))?;
            let last = if n == 8 { u64::from_le_bytes(buf) } else { 0 };
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let next = last.saturating_add(1).max(now);
            pwrite(fd, &next.to_le_bytes(), 0).map_err(|e| failed("write", e))?;
            fdatasync(fd).map_err(|e| failed("fdatasync", e))?;
            Ok(FencingToken::new(next))
        })();
        let _ = flock(fd, FlockOperation::Unlock);
        drawn
    }
}
