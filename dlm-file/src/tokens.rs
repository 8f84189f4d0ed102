//! Fencing tokens: one counter per directory, in `.tokens`, drawn under a lock of its own,
//! below a reservation made durable (`fdatasync`) before any token above the last one is
//! handed out.
//!
//! The file holds `last` (the last token handed out: written at every draw, not synced),
//! `reserved` (synced: no token handed out is above it) and the boot id of the draw that
//! wrote them. A process that crashes loses nothing the kernel has (its writes are in
//! the page cache); only the machine's crash can lose `last`, and then the boot id
//! differs and the draw starts above `reserved`. So a draw syncs only when it passes the
//! reservation (which it then moves [`RESERVE_US`] ahead) or is the first after a boot:
//! `fdatasync` costs about 2 ms on a disk, a draw without it a few µs.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlm_core::backend::{BackendError, BackendErrorKind, FencingToken};
use parking_lot::Mutex;
use rustix::fs::{FlockOperation, fdatasync, flock};
use rustix::io::{Errno, pread, pwrite};

use crate::dir::Dir;

/// The counter's file in the lock directory (lock files start with `m.`).
pub(crate) const TOKENS_FILE: &str = ".tokens";

/// How far ahead of a token the durable reservation is moved (µs: 10 s of the clock
/// term), so that one `fdatasync` covers the draws of 10 s.
const RESERVE_US: u64 = 10_000_000;

/// The file's layout: `last`, `reserved` (u64 little-endian), the boot id (16 bytes).
const LEN: usize = 32;

/// This boot of the machine (`/proc/sys/kernel/random/boot_id`), as 16 bytes.
fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|c| match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => c - b'A' + 10,
        })
        .collect();
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        id[i] = pair[0] << 4 | pair.get(1).copied().unwrap_or(0);
    }
    id
}

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
    /// `max(last + 1, now in µs since the epoch)`, never above the durable reservation
    /// (see the module's documentation). The clock term keeps tokens increasing when the
    /// file itself was lost (a directory on a tmpfs, after a reboot), as long as the
    /// clock has not gone back below the last token.
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
            let mut buf = [0u8; LEN];
            let n = pread(fd, &mut buf, 0).map_err(|e| failed("read", e))?;
            let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
            let (mut last, mut reserved) = if n >= 16 { (word(0), word(8)) } else { (0, 0) };
            let boot = boot_id();
            let same_boot = n >= LEN && buf[16..LEN] == boot;
            if !same_boot {
                // The first draw since the machine started (or ever): what was not synced
                // before may be lost; the reservation was synced.
                last = last.max(reserved);
            }
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let next = last.saturating_add(1).max(now);
            if next > reserved || !same_boot {
                reserved = next.saturating_add(RESERVE_US);
                let mut whole = [0u8; LEN];
                whole[0..8].copy_from_slice(&next.to_le_bytes());
                whole[8..16].copy_from_slice(&reserved.to_le_bytes());
                whole[16..LEN].copy_from_slice(&boot);
                pwrite(fd, &whole, 0).map_err(|e| failed("write", e))?;
                fdatasync(fd).map_err(|e| failed("fdatasync", e))?;
            } else {
                pwrite(fd, &next.to_le_bytes(), 0).map_err(|e| failed("write", e))?;
            }
            Ok(FencingToken::new(next))
        })();
        let _ = flock(fd, FlockOperation::Unlock);
        drawn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::{Dir, DirOptions};

    fn dir(tmp: &tempfile::TempDir) -> Dir {
        Dir::open(
            &tmp.path().join("d"),
            DirOptions {
                group_shared: false,
                allow_network: false,
            },
        )
        .unwrap()
    }

    fn file_words(dir: &Dir) -> (u64, u64, [u8; 16]) {
        let bytes = std::fs::read(dir.path.join(TOKENS_FILE)).unwrap();
        let w = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        (w(0), w(8), bytes[16..32].try_into().unwrap())
    }

    /// Sets the counter's last token, as a counter ahead of the clock has it.
    fn set_last(dir: &Dir, last: u64) {
        let mut bytes = std::fs::read(dir.path.join(TOKENS_FILE)).unwrap();
        bytes[0..8].copy_from_slice(&last.to_le_bytes());
        std::fs::write(dir.path.join(TOKENS_FILE), &bytes).unwrap();
    }

    #[test]
    fn tokens_increase_and_stay_under_the_durable_reservation() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(&tmp);
        let tokens = Tokens::default();
        let mut last = 0;
        for _ in 0..1000 {
            let t = tokens.draw(&dir).unwrap().get();
            assert!(t > last);
            last = t;
            let (stored, reserved, boot) = file_words(&dir);
            assert_eq!(stored, t);
            assert!(t <= reserved, "token {t} above the reservation {reserved}");
            assert_eq!(boot, boot_id());
        }
    }

    #[test]
    fn after_the_machine_lost_the_unsynced_counter_tokens_start_above_the_reservation() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(&tmp);
        let issued = Tokens::default().draw(&dir).unwrap().get();
        let (_, reserved, _) = file_words(&dir);
        // What a crash of the machine can leave: the last token's write lost (an old
        // value), the synced reservation kept, and another boot.
        let mut bytes = std::fs::read(dir.path.join(TOKENS_FILE)).unwrap();
        bytes[0..8].copy_from_slice(&1u64.to_le_bytes());
        bytes[16..32].copy_from_slice(&[0xab; 16]);
        std::fs::write(dir.path.join(TOKENS_FILE), &bytes).unwrap();
        let next = Tokens::default().draw(&dir).unwrap().get();
        assert!(
            next > reserved && next > issued,
            "{next} after {issued} (reserved {reserved})"
        );
    }

    #[test]
    fn a_counter_file_lost_whole_restarts_above_its_tokens_from_the_clock() {
        // A directory on a tmpfs loses the file at a reboot: the clock term keeps tokens
        // increasing (the clock has not gone back here).
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(&tmp);
        let issued = Tokens::default().draw(&dir).unwrap().get();
        std::fs::remove_file(dir.path.join(TOKENS_FILE)).unwrap();
        let next = Tokens::default().draw(&dir).unwrap().get();
        assert!(next > issued, "{next} after {issued}");
    }

    /// A counter in use whose last token is far ahead of the clock (as after the clock
    /// was set back): the counter, and that last token.
    fn counter_ahead_of_the_clock(dir: &Dir) -> (Tokens, u64) {
        let tokens = Tokens::default();
        tokens.draw(dir).unwrap();
        let ahead = u64::MAX / 4;
        set_last(dir, ahead);
        (tokens, ahead)
    }

    #[test]
    fn a_counter_ahead_of_the_clock_keeps_counting() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(&tmp);
        let (tokens, ahead) = counter_ahead_of_the_clock(&dir);
        assert_eq!(tokens.draw(&dir).unwrap().get(), ahead + 1);
        assert_eq!(tokens.draw(&dir).unwrap().get(), ahead + 2);
    }

    /// The negative control of the assumption "the directory keeps its counter, or the
    /// clock has not gone back below the last token": tokens issued above the clock (as
    /// after the clock was set back), then the counter lost: the next token is below
    /// them. The documented failure, seen.
    #[test]
    fn losing_the_counter_after_the_clock_went_back_lets_tokens_go_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(&tmp);
        let (tokens, _) = counter_ahead_of_the_clock(&dir);
        let issued = tokens.draw(&dir).unwrap().get();
        std::fs::remove_file(dir.path.join(TOKENS_FILE)).unwrap();
        let next = Tokens::default().draw(&dir).unwrap().get();
        assert!(
            next < issued,
            "{next} after {issued}: the clock term alone cannot reach a counter ahead of it"
        );
    }

    #[test]
    fn the_boot_id_is_read() {
        assert_ne!(boot_id(), [0u8; 16]);
    }
}
