//! The temp dirs of the testkit's servers and certificates, and the removal of those whose
//! test process died without running destructors.
//!
//! A server's dir is removed when the server is dropped. A server kept in a `static` (the
//! conformance suites' [`Shared`](crate::conformance::Shared) fixtures, one per test
//! process under nextest) is never dropped, nor is anything in a process killed by a
//! harness's timeout: each such dir stayed behind (an etcd data dir preallocates 128 MB of
//! write-ahead log; a suite run left gigabytes). So every dir made here is marked with its
//! owner (`.dlm-owner`: the process's pid and start time, which tells a reused pid from
//! the owner), and the first dir made in a process removes the marked dirs whose owner is
//! gone. A dir without the mark, or with one this code cannot read, is not touched.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Once;

use tempfile::TempDir;

/// The owner mark's file name, in each dir.
const MARK: &str = ".dlm-owner";
/// Every dir made here starts so; only those are looked at by the sweep.
const PREFIX: &str = "dlm-";

/// A new temp dir `<prefix>XXXXXX` (`prefix` starts with `dlm-`), removed on drop, marked
/// with this process as its owner. The first call in a process first removes the dirs
/// whose owner is gone.
pub(crate) fn owned_tempdir(prefix: &str) -> io::Result<TempDir> {
    debug_assert!(prefix.starts_with(PREFIX), "{prefix}");
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| sweep(&std::env::temp_dir()));
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    // Written aside and renamed: a sweep in another process never reads half a mark.
    let aside = dir.path().join(".dlm-owner.new");
    fs::write(&aside, owner_mark(std::process::id())?)?;
    fs::rename(&aside, dir.path().join(MARK))?;
    Ok(dir)
}

/// `pid start-time` of a live process (start time in clock ticks since boot, field 22 of
/// `/proc/<pid>/stat`), which a reused pid does not share.
fn owner_mark(pid: u32) -> io::Result<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is in parentheses and may hold spaces: fields resume after the last ')'.
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .ok_or_else(|| io::Error::other(format!("unexpected /proc/{pid}/stat: {stat}")))?;
    Ok(format!("{pid} {start}"))
}

/// Whether the process a mark names is gone: no such pid, or a pid now another process's.
/// `None` for a mark that does not parse.
fn owner_gone(mark: &str) -> Option<bool> {
    let pid: u32 = mark.split_whitespace().next()?.parse().ok()?;
    Some(owner_mark(pid).map_or(true, |live| live != mark.trim()))
}

/// Removes the dirs `dlm-*` in `tmp` whose mark names a process that is gone. Errors are
/// logged, not raised: a dir another user owns is that user's to remove.
fn sweep(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = entry.path();
        let Ok(mark) = fs::read_to_string(dir.join(MARK)) else {
            continue;
        };
        if owner_gone(&mark) != Some(true) {
            continue;
        }
        if let Err(e) = fs::remove_dir_all(&dir) {
            log::warn!(
                "removing {}, left by a test process that is gone: {e}",
                dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn removes_only_marked_dirs_whose_owner_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let make = |name: &str, mark: Option<String>| {
            let dir = tmp.path().join(name);
            fs::create_dir(&dir).unwrap();
            fs::write(dir.join("data"), b"x").unwrap();
            if let Some(mark) = mark {
                fs::write(dir.join(MARK), mark).unwrap();
            }
            dir
        };
        let me = owner_mark(std::process::id()).unwrap();
        let dead = format!("{} 1", dead_pid());
        // This process's pid with another start time: the pid was reused.
        let reused = format!("{} 1", std::process::id());

        let live = make("dlm-redis-live", Some(me.clone()));
        let orphan = make("dlm-etcd-orphan", Some(dead.clone()));
        let reused_pid = make("dlm-postgres-reused", Some(reused));
        let unmarked = make("dlm-redis-unmarked", None);
        let garbled = make("dlm-redis-garbled", Some("not a mark".into()));
        let other = make("someone-else", Some(dead));

        sweep(tmp.path());

        assert!(live.exists(), "a live owner's dir was removed");
        assert!(!orphan.exists(), "a dead owner's dir was kept");
        assert!(!reused_pid.exists(), "a dir whose pid was reused was kept");
        assert!(unmarked.exists(), "a dir without a mark was removed");
        assert!(
            garbled.exists(),
            "a dir with an unreadable mark was removed"
        );
        assert!(other.exists(), "a dir not named dlm-* was removed");
    }

    #[test]
    fn owned_dirs_carry_this_process_as_owner() {
        let dir = owned_tempdir("dlm-test-").unwrap();
        let mark = fs::read_to_string(dir.path().join(MARK)).unwrap();
        assert_eq!(owner_gone(&mark), Some(false), "{mark}");
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists());
    }
}
