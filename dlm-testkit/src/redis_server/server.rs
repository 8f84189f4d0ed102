//! [`RedisServer`]'s addresses and controls: URLs and ports, admin connections,
//! pause/resume, kill, restart, early expiry, logs; failures panic with the log tail.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::process::{connect, proc_state, send_signal};
use super::{
    ADMIN_TIMEOUT, LIVE_PIDS, LOG_FILE, LOG_TAIL_LINES, RedisServer, RedisServerBuilder,
    STDERR_FILE, encode, registry,
};

impl RedisServer {
    /// Starts a server with the default configuration (no persistence, no password).
    pub fn spawn() -> RedisServer {
        Self::builder().spawn()
    }

    /// A builder for a server with non-default configuration.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port it listens on (127.0.0.1). It stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://[user:pw@]127.0.0.1:<port>/`, with the builder's
    /// [`credentials`](RedisServerBuilder::credentials), else its
    /// [`password`](RedisServerBuilder::password), if any.
    pub fn url(&self) -> String {
        match (&self.config.credentials, &self.config.password) {
            (Some((user, pw)), _) => self.url_with(&format!("{}:{}@", encode(user), encode(pw))),
            (None, Some(pw)) => self.url_with(&format!(":{}@", encode(pw))),
            (None, None) => self.url_with(""),
        }
    }

    /// The URL of the `default` user (the admin), with the password if any.
    pub(super) fn admin_url(&self) -> String {
        match &self.config.password {
            Some(pw) => self.url_with(&format!(":{}@", encode(pw))),
            None => self.url_with(""),
        }
    }

    fn url_with(&self, userinfo: &str) -> String {
        format!("redis://{userinfo}127.0.0.1:{}/", self.port)
    }

    /// `rediss://[user:pw@]127.0.0.1:<tls port>/`, with the same credentials as
    /// [`url`](Self::url).
    ///
    /// # Panics
    /// When the server was built without [`RedisServerBuilder::tls`].
    pub fn tls_url(&self) -> String {
        assert!(self.tls_port != 0, "this server has no TLS port");
        self.url()
            .replacen("redis://", "rediss://", 1)
            .replace(&format!(":{}/", self.port), &format!(":{}/", self.tls_port))
    }

    /// The TLS port (0 without TLS).
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The cluster bus port (0 without [`RedisServerBuilder::cluster_port`]).
    pub fn cluster_port(&self) -> u16 {
        self.cluster_port
    }

    /// The pid of the current (or, after [`kill`](Self::kill), the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its temp dir (data, AOF, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A direct admin connection (the `default` user, with the password if any) with 5 s
    /// connect/read/write timeouts. Panics with the log tail if it cannot connect.
    pub fn connection(&self) -> redis::Connection {
        connect(&self.admin_url(), ADMIN_TIMEOUT)
            .unwrap_or_else(|e| self.fail(&format!("admin connection: {e}")))
    }

    /// Stops the process with SIGSTOP: it keeps its sockets but answers nothing. Returns
    /// once the kernel reports it stopped.
    pub fn pause(&self) {
        self.signal("STOP");
        self.paused.store(true, Ordering::SeqCst);
        self.wait_proc_state(|s| s == 'T');
    }

    /// Continues a paused process with SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
        self.paused.store(false, Ordering::SeqCst);
        self.wait_proc_state(|s| s != 'T');
    }

    /// Whether [`pause`](Self::pause) was called without a later resume.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Kills the process with SIGKILL and reaps it; the server is down afterwards.
    /// Does nothing if it is not running.
    pub fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut child) = child {
            if self.paused.swap(false, Ordering::SeqCst) {
                let _ = send_signal(child.id(), "CONT");
            }
            let _ = child.kill();
            let _ = child.wait();
            registry(&LIVE_PIDS).remove(&child.id());
            log::debug!(
                "redis-server pid {} on port {} killed",
                child.id(),
                self.port
            );
        }
    }

    /// Kills the process (if running) and starts it again on the same port, with the
    /// same configuration and data dir (so with AOF on, the data survives). Returns once
    /// it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        self.start(Some(port));
    }

    /// Whether the process is alive (not killed, not exited). A paused one is running.
    pub fn is_running(&self) -> bool {
        let mut guard = registry(&self.child);
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        registry(&LIVE_PIDS).remove(&child.id());
        *guard = None;
        false
    }

    /// `SCRIPT FLUSH`: empties the Lua script cache (the next EVALSHA gets NOSCRIPT).
    pub fn flush_scripts(&self) {
        let _: () = self.query(redis::cmd("SCRIPT").arg("FLUSH"));
    }

    /// Expires `key` now on this server (`PEXPIRE key 1`), and returns once it is gone.
    pub fn expire_now(&self, key: &str) {
        let mut con = self.connection();
        let deadline = Instant::now() + Duration::from_secs(2);
        let run = |con: &mut redis::Connection, cmd: &redis::Cmd| -> bool {
            cmd.query(con)
                .unwrap_or_else(|e| self.fail(&format!("expiring {key:?}: {e}")))
        };
        run(&mut con, redis::cmd("PEXPIRE").arg(key).arg(1));
        // EXISTS on an expired key deletes it (lazy expiry), firing the `expired` event.
        while run(&mut con, redis::cmd("EXISTS").arg(key)) {
            if Instant::now() > deadline {
                self.fail(&format!("key {key:?} did not expire"));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// The server's log file (empty if unreadable).
    pub fn log_contents(&self) -> String {
        fs::read(self.dir().join(LOG_FILE))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The output of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
    }

    /// Runs one command on a fresh admin connection; panics with the log tail on error.
    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| self.fail(&format!("command {:?} failed: {e}", cmd_text(cmd))))
    }

    fn signal(&self, sig: &str) {
        if let Err(e) = send_signal(self.pid, sig) {
            self.fail(&format!("kill -{sig} {}: {e}", self.pid));
        }
    }

    /// Waits (up to 2 s) until `/proc/<pid>/stat` shows a state that `ok` accepts.
    fn wait_proc_state(&self, ok: impl Fn(char) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(state) = proc_state(self.pid) {
            if ok(state) || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Panics with `msg`, the server's port and pid, and the tail of its logs.
    pub(super) fn fail(&self, msg: &str) -> ! {
        panic!(
            "redis-server on port {} (pid {}): {msg}\n{}",
            self.port,
            self.pid,
            self.log_tail()
        )
    }

    fn log_tail(&self) -> String {
        let log = self.log_contents();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        let stderr = fs::read_to_string(self.dir().join(STDERR_FILE)).unwrap_or_default();
        format!("--- redis.log (last {LOG_TAIL_LINES} lines) ---\n{tail}\n--- stderr ---\n{stderr}")
    }
}

/// The command as text, for messages.
fn cmd_text(cmd: &redis::Cmd) -> String {
    let args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
        _ => "<cursor>".to_owned(),
    });
    args.collect::<Vec<_>>().join(" ")
}
