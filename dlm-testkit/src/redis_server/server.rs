//! [`RedisServer`]'s addresses and controls: URLs and ports, admin connections,
//! restart, early expiry, INFO; the process controls (pause/resume, kill, logs, failures
//! that panic with the log tail) are [`crate::process`]'s.

use std::thread;
use std::time::{Duration, Instant};

use super::start::connect;
use super::{ADMIN_TIMEOUT, RedisServer, RedisServerBuilder, encode};
use crate::process::Server;

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

    crate::process::controls!();

    /// A direct admin connection (the `default` user, with the password if any) with 5 s
    /// connect/read/write timeouts. Panics with the log tail if it cannot connect.
    pub fn connection(&self) -> redis::Connection {
        connect(&self.admin_url(), ADMIN_TIMEOUT)
            .unwrap_or_else(|e| self.fail(&format!("admin connection: {e}")))
    }

    /// Kills the process (if running) and starts it again on the same port, with the
    /// same configuration and data dir (so with AOF on, the data survives). Returns once
    /// it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        self.start(true);
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

    /// The output of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
    }

    /// Runs one command on a fresh admin connection; panics with the log tail on error.
    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| self.fail(&format!("command {:?} failed: {e}", cmd_text(cmd))))
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
