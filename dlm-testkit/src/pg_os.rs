//! What the PostgreSQL and PgBouncer servers of the testkit share with the OS: the user
//! they run as when this process is root, commands with a deadline, and process trees
//! read from `/proc` (a postmaster's children) and signalled with `kill`.

use std::fs;
use std::io;
use std::os::unix::fs::{chown, lchown};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{LazyLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// The OS user the servers run as when this process is root.
pub(crate) const POSTGRES: &str = "postgres";

/// The uid and gid of the OS user `postgres` when this process runs as root (PostgreSQL
/// and PgBouncer refuse to), `None` otherwise.
pub(crate) static RUN_AS: LazyLock<Option<(u32, u32)>> = LazyLock::new(|| {
    if !is_root() {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, POSTGRES]).output();
        out.ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "running as root, PostgreSQL and PgBouncer must run as the OS user {POSTGRES}, \
                     which `id {flag} {POSTGRES}` does not find"
                )
            })
    };
    Some((id("-u"), id("-g")))
});

/// Whether the effective uid of this process is 0 (`/proc/self/status`).
pub(crate) fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
            .unwrap_or(false)
    })
}

/// `chown -R uid:gid path` (symbolic links themselves, not what they point to).
pub(crate) fn chown_all(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return lchown(path, Some(uid), Some(gid));
    }
    chown(path, Some(uid), Some(gid))?;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            chown_all(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Runs `cmd` (its stdin empty, its output captured), killing it after `timeout`.
pub(crate) fn output_within(mut cmd: Command, timeout: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| format!("spawning {cmd:?}: {e}"))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.map_err(|e| format!("waiting for {cmd:?}: {e}")),
        Err(_) => {
            let _ = signal(&[pid], "KILL");
            let _ = rx.recv();
            Err(format!("no answer within {timeout:?}"))
        }
    }
}

/// The children of `ppid` (by the parent pid in `/proc/*/stat`).
pub(crate) fn children_of(ppid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, parent)| parent == ppid))
        .collect()
}

/// The state letter and the parent pid in `/proc/<pid>/stat`, if readable.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is alive: it exists and is not a zombie (which holds no memory).
pub(crate) fn is_alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// Polls `done` until it holds (true) or `timeout` runs out (false).
pub(crate) fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `SIG<sig>` to `pids` with the `kill` command (no `unsafe` needed); nothing for
/// none. An error when one of them could not be signalled (the others are).
pub(crate) fn signal(pids: &[u32], sig: &str) -> Result<(), String> {
    if pids.is_empty() {
        return Ok(());
    }
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("kill -{sig}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pids:?} exited with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_reads_own_parent() {
        let (state, ppid) = proc_stat(std::process::id()).unwrap();
        assert!(matches!(state, 'R' | 'S'));
        assert!(ppid > 0);
        assert!(children_of(ppid).contains(&std::process::id()));
    }
}
