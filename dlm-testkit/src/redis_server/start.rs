//! Starting a `redis-server` child: its ports (fresh ones, or its own again for a
//! restart), the command line, readiness (it answers PING, and is our child). The
//! process itself, the retries while a port is taken and the controls are
//! [`crate::process`]'s.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{CONFIG_FILE, LOGS, RedisServer, START_TIMEOUT};
use crate::process::{Process, Server, Startup, free_ports, pick_port};

impl Server for RedisServer {
    fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    fn who(&self) -> String {
        format!("redis-server on port {}", self.port)
    }

    /// Fresh ports unless `again`; a TLS or cluster bus port is picked when there is none
    /// yet.
    fn start_once(&mut self, again: bool) -> Startup {
        if !again {
            self.port = pick_port();
        }
        if self.config.tls.is_some() && (!again || self.tls_port == 0) {
            free_ports(&[self.tls_port]);
            self.tls_port = pick_port();
        }
        if self.config.cluster_port && (!again || self.cluster_port == 0) {
            free_ports(&[self.cluster_port]);
            self.cluster_port = pick_port();
        }
        let log_from = self.process.log_len();
        self.process.launch(self.command());
        let url = self.admin_url();
        self.process
            .wait_started(log_from, START_TIMEOUT, || self.answers(&url))
    }
}

impl RedisServer {
    /// The command line, on the current ports.
    fn command(&self) -> Command {
        let dir = self.dir();
        let log = dir.join(LOGS.log);
        let mut cmd = self.process.command();
        if self.config.config_file.is_some() {
            // The config file must be the first argument.
            cmd.arg(dir.join(CONFIG_FILE));
        }
        cmd.arg("--port").arg(self.port.to_string());
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"]);
        cmd.args(["--protected-mode", "no"]);
        cmd.arg("--dir").arg(dir).arg("--logfile").arg(&log);
        if self.config.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            cmd.args(["--appenddirname", "appendonlydir"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(pw) = &self.config.password {
            cmd.args(["--requirepass", pw]);
        }
        if let Some(tls) = &self.config.tls {
            cmd.arg("--tls-port").arg(self.tls_port.to_string());
            cmd.arg("--tls-cert-file").arg(&tls.cert);
            cmd.arg("--tls-key-file").arg(&tls.key);
            cmd.arg("--tls-ca-cert-file").arg(&tls.ca);
            cmd.args([
                "--tls-auth-clients",
                if tls.auth_clients { "yes" } else { "no" },
            ]);
        }
        if self.cluster_port != 0 {
            cmd.arg("--cluster-port").arg(self.cluster_port.to_string());
        }
        cmd.args(&self.config.args);
        cmd.envs(self.config.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.process.stderr_file());
        cmd
    }

    /// Whether the server on our port answers PING and is our child (not some other
    /// process that grabbed the port).
    fn answers(&self, url: &str) -> bool {
        let Ok(mut con) = connect(url, Duration::from_millis(250)) else {
            return false;
        };
        if redis::cmd("PING").query::<String>(&mut con).is_err() {
            return false;
        }
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .unwrap_or_default();
        info.lines()
            .any(|l| l.trim() == format!("process_id:{}", self.pid()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        free_ports(&[self.port, self.tls_port, self.cluster_port]);
    }
}

/// Connects to `url` with `timeout` for connect, reads and writes.
pub(super) fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}
