//! A PostgreSQL primary and a streaming standby, for failover tests.
//!
//! [`PostgresPair::spawn`] starts a primary ([`PostgresServer`]: `wal_level=replica`,
//! replication connections trusted from 127.0.0.1 as `initdb --auth=trust` sets up), makes
//! a standby of it with `pg_basebackup -R -X stream` (as the OS user `postgres` when this
//! process is root) in a temp dir of its own, starts it on a free port of its own, and
//! returns once the primary shows it streaming (`pg_stat_replication`). Both are plain
//! [`PostgresServer`]s, public fields of the pair, with every control they have (kill,
//! pause, stop, start...): a failover is `pair.primary.kill()` then
//! [`promote_standby`](PostgresPair::promote_standby).
//!
//! [`Replication::Sync`] makes the standby synchronous: `synchronous_standby_names` names
//! it and `synchronous_commit=remote_apply` on the primary, so that a commit returns once
//! the standby has applied it (a transaction that sets `synchronous_commit=on` waits for
//! the standby's flush only), and blocks while the standby is down.
//!
//! ```no_run
//! use dlm_testkit::postgres_pair::{PostgresPair, Replication};
//!
//! let mut pair = PostgresPair::spawn(Replication::Async);
//! let url = pair.url(); // postgresql://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/postgres
//! pair.primary.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
//! pair.wait_replayed(); // the standby has it
//! pair.primary.kill();
//! pair.promote_standby(); // the standby accepts writes
//! assert_eq!(pair.standby.psql("SELECT v FROM t"), "1");
//! ```

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::postgres::{PostgresOptions, PostgresServer};

/// The standby's `application_name` (what `synchronous_standby_names` names).
const STANDBY_NAME: &str = "dlm_standby";
/// How long the base backup, the start of streaming, a replay or a promotion may take.
const WAIT: Duration = Duration::from_secs(60);

/// How the primary replicates to its standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replication {
    /// Asynchronous streaming (PostgreSQL's default): a commit returns once it is on the
    /// primary's disk; the standby may lag behind.
    Async,
    /// Synchronous streaming: `synchronous_standby_names` names the standby, and
    /// `synchronous_commit=remote_apply` on the primary: a commit returns once the standby
    /// has applied it (flushed it, for a transaction that sets `synchronous_commit=on`),
    /// and waits while the standby is down.
    Sync,
}

/// A primary and its streaming standby (real `postgres` processes, each with its own
/// port and temp dir). Dropping it kills both.
///
/// The servers are public: every control of [`PostgresServer`] applies to either. After
/// [`promote_standby`](Self::promote_standby), `standby` is the promoted server (a
/// primary); `primary` stays the old one (kill or stop it first for a failover, or leave
/// it running for a split brain).
#[derive(Debug)]
pub struct PostgresPair {
    /// The primary (initdb'd, started first).
    pub primary: PostgresServer,
    /// The standby (a base backup of the primary, streaming from it).
    pub standby: PostgresServer,
    replication: Replication,
}

impl PostgresPair {
    /// Starts a primary and a standby made from its base backup, and waits until the
    /// standby is streaming (for [`Replication::Sync`], as the synchronous standby).
    ///
    /// # Panics
    /// When PostgreSQL is missing, or a server, the base backup or streaming does not
    /// come up (with the tail of the server's log).
    pub fn spawn(replication: Replication) -> PostgresPair {
        let mut options = PostgresOptions::default();
        // Enough WAL kept for a standby stopped and started again during a test.
        options
            .settings
            .push(("wal_keep_size".into(), "64MB".into()));
        if replication == Replication::Sync {
            options
                .settings
                .push(("synchronous_standby_names".into(), STANDBY_NAME.into()));
            options
                .settings
                .push(("synchronous_commit".into(), "remote_apply".into()));
        }
        let primary = PostgresServer::spawn_with(options);
        let standby = PostgresServer::spawn_from(PostgresOptions::default(), |server, data| {
            base_backup(&primary, server, data)
        });
        let pair = PostgresPair {
            primary,
            standby,
            replication,
        };
        pair.wait_streaming();
        pair
    }

    /// How the primary replicates.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Waits until the primary shows the standby streaming in `pg_stat_replication` (for
    /// [`Replication::Sync`], as its synchronous standby): after [`spawn`](Self::spawn)
    /// (which calls it), or after the standby was stopped and started again.
    ///
    /// # Panics
    /// When it does not within a minute.
    pub fn wait_streaming(&self) {
        let sql = format!(
            "SELECT state || ' ' || sync_state FROM pg_stat_replication \
             WHERE application_name = '{STANDBY_NAME}'"
        );
        let want = match self.replication {
            Replication::Sync => "streaming sync",
            Replication::Async => "streaming async",
        };
        let mut last = String::new();
        let streaming = poll(|| {
            last = self.primary.try_psql(&sql).unwrap_or_else(|e| e);
            last == want
        });
        if !streaming {
            self.standby.fail(&format!(
                "the primary does not show the standby {want:?} within {WAIT:?} \
                 (pg_stat_replication: {last:?})"
            ));
        }
    }

    /// Promotes the standby (`pg_promote`) and waits until it accepts writes
    /// (`pg_is_in_recovery()` false). The primary is left as it is.
    ///
    /// # Panics
    /// When the promotion fails or does not end within a minute.
    pub fn promote_standby(&mut self) {
        let sql = format!("SELECT pg_promote(true, {})", WAIT.as_secs());
        match self.standby.try_psql(&sql) {
            Ok(out) if out == "t" => {}
            other => self
                .standby
                .fail(&format!("{sql}: {other:?} (not promoted in time)")),
        }
        let promoted = poll(|| {
            self.standby
                .try_psql("SELECT pg_is_in_recovery()")
                .is_ok_and(|out| out == "f")
        });
        if !promoted {
            self.standby
                .fail(&format!("still in recovery {WAIT:?} after pg_promote"));
        }
    }

    /// Waits until the standby has replayed the WAL the primary has written so far
    /// (`pg_current_wal_lsn()` on the primary, then until `pg_last_wal_replay_lsn()` on
    /// the standby reaches it).
    ///
    /// # Panics
    /// When the primary does not answer, or the standby does not catch up within a
    /// minute.
    pub fn wait_replayed(&self) {
        let lsn = self.primary.psql("SELECT pg_current_wal_lsn()");
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        let mut last = String::new();
        let replayed = poll(|| {
            last = self.standby.try_psql(&sql).unwrap_or_else(|e| e);
            last == "t"
        });
        if !replayed {
            let at = self
                .standby
                .try_psql("SELECT pg_last_wal_replay_lsn()")
                .unwrap_or_else(|e| e);
            self.standby.fail(&format!(
                "has not replayed up to the primary's {lsn} within {WAIT:?} (replayed up to {at}; {last})"
            ));
        }
    }

    /// Stops (SIGSTOP) the primary's WAL senders to the standby: from now on the standby
    /// receives nothing, whatever the primary commits (with [`Replication::Async`]; with
    /// `Sync`, commits wait). A deterministic lag: what the primary commits now is lost
    /// if it dies before [`resume_wal_sender`](Self::resume_wal_sender). (Stopping the
    /// standby instead is not enough: the WAL sent meanwhile waits in its socket's
    /// buffer, and it replays it once continued.)
    ///
    /// # Panics
    /// When the primary shows no WAL sender to the standby.
    pub fn pause_wal_sender(&self) {
        for pid in self.wal_senders() {
            signal(pid, "STOP");
            let stopped = poll(|| proc_state(pid).is_none_or(|s| matches!(s, 'T' | 'Z')));
            if !stopped {
                self.primary
                    .fail(&format!("WAL sender {pid} not stopped by SIGSTOP"));
            }
        }
    }

    /// Continues the WAL senders stopped by [`pause_wal_sender`](Self::pause_wal_sender).
    pub fn resume_wal_sender(&self) {
        for pid in self.wal_senders() {
            signal(pid, "CONT");
        }
    }

    /// The pids of the primary's WAL senders to the standby.
    fn wal_senders(&self) -> Vec<u32> {
        let out = self.primary.psql(&format!(
            "SELECT pid FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'"
        ));
        let pids: Vec<u32> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            self.primary.fail("no WAL sender to the standby");
        }
        pids
    }

    /// `postgresql://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/postgres`: both
    /// servers, the primary first (a client that asks for a server that accepts writes,
    /// as dlm does, follows a promotion).
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
            self.primary.port(),
            self.standby.port()
        )
    }
}

/// Makes `data` (the standby `server`'s data dir) a base backup of `primary` that will
/// stream from it (`-R`: `standby.signal`, and `primary_conninfo` naming the standby).
fn base_backup(primary: &PostgresServer, server: &PostgresServer, data: &Path) {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}",
        primary.port()
    );
    let mut cmd = server.tool("pg_basebackup");
    cmd.arg("-D").arg(data);
    // A fast checkpoint: a spread one could take minutes. No fsync of the copy: only
    // processes die in these tests, never the machine.
    cmd.args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-w"]);
    cmd.arg("-d").arg(&conninfo);
    cmd.current_dir(server.dir()).env_remove("PGPASSWORD");
    match output_within(cmd, WAIT) {
        Ok(out) if out.status.success() => {}
        Ok(out) => primary.fail(&format!(
            "pg_basebackup -d {conninfo:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => primary.fail(&format!("pg_basebackup -d {conninfo:?}: {e}")),
    }
}

/// Runs `cmd` (its stdin empty, its output captured), killing it after `timeout`.
fn output_within(mut cmd: Command, timeout: Duration) -> Result<Output, String> {
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
            signal(pid, "KILL");
            let _ = rx.recv();
            Err(format!("no answer within {timeout:?}"))
        }
    }
}

/// Polls `done` every 10 ms until it holds (true) or [`WAIT`] runs out (false).
fn poll(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `SIG<sig>` to `pid` with the `kill` command (errors ignored: it may be gone).
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The state letter of `/proc/<pid>/stat`, if readable.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replication, the URL, a paused WAL sender (what the primary commits meanwhile is
    /// lost with it) and a promotion, end to end.
    #[test]
    fn a_standby_replays_and_is_promoted() {
        let mut pair = PostgresPair::spawn(Replication::Async);
        assert_eq!(
            pair.url(),
            format!(
                "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
                pair.primary.port(),
                pair.standby.port()
            )
        );
        pair.primary
            .psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
        pair.wait_replayed();
        assert_eq!(pair.standby.psql("SELECT v FROM t"), "1");
        assert_eq!(pair.standby.psql("SELECT pg_is_in_recovery()"), "t");
        pair.pause_wal_sender();
        pair.primary.psql("INSERT INTO t VALUES (2)");
        pair.primary.kill();
        pair.promote_standby();
        assert_eq!(pair.standby.psql("SELECT pg_is_in_recovery()"), "f");
        assert_eq!(
            pair.standby.psql("SELECT string_agg(v::text, ',') FROM t"),
            "1",
            "the row committed while the WAL sender was stopped reached the standby"
        );
        pair.standby.psql("INSERT INTO t VALUES (3)");
    }
}
