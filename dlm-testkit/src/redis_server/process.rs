//! Starting and reaping `redis-server` children: start-up on a fresh port (retried when
//! the port is taken), the command line, readiness, and the process helpers the other
//! testkit servers share (the spawner thread, `setpriv`, signals, `/proc` states).

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{LazyLock, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    CONFIG_FILE, LIVE_PIDS, LOG_FILE, RedisServer, START_ATTEMPTS, START_TIMEOUT, STDERR_FILE,
    USED_PORTS, pick_port, registry,
};

/// What one start-up attempt came to.
enum Startup {
    Ready,
    PortTaken,
    Failed(String),
}

impl RedisServer {
    /// Starts the child on `port` (restart), or on a fresh port, retrying a few times if
    /// another process grabs it first. Panics with the log if it does not come up.
    pub(super) fn start(&mut self, port: Option<u16>) {
        for attempt in 1..=START_ATTEMPTS {
            self.port = port.unwrap_or_else(pick_port);
            if self.config.tls.is_some() && (port.is_none() || self.tls_port == 0) {
                if self.tls_port != 0 {
                    registry(&USED_PORTS).remove(&self.tls_port);
                }
                self.tls_port = pick_port();
            }
            if self.config.cluster_port && (port.is_none() || self.cluster_port == 0) {
                if self.cluster_port != 0 {
                    registry(&USED_PORTS).remove(&self.cluster_port);
                }
                self.cluster_port = pick_port();
            }
            let log_offset = fs::metadata(self.dir().join(LOG_FILE)).map_or(0, |m| m.len());
            let child = spawn_child(self.command()).unwrap_or_else(|e| {
                panic!("spawning {}: {e}", self.binary.display());
            });
            self.pid = child.id();
            *registry(&self.child) = Some(child);
            registry(&LIVE_PIDS).insert(self.pid);
            match self.wait_ready(log_offset) {
                Startup::Ready => {
                    log::debug!("redis-server pid {} ready on port {}", self.pid, self.port);
                    return;
                }
                Startup::PortTaken => {
                    log::debug!("port {} taken (attempt {attempt}); retrying", self.port);
                    self.kill();
                    if port.is_some() {
                        thread::sleep(Duration::from_millis(200));
                    }
                }
                Startup::Failed(why) => {
                    let msg = format!("failed to start: {why}");
                    self.kill();
                    self.fail(&msg);
                }
            }
        }
        self.fail(&format!("port still taken after {START_ATTEMPTS} attempts"));
    }

    fn command(&self) -> Command {
        let dir = self.dir();
        let log = dir.join(LOG_FILE);
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(STDERR_FILE))
            .expect("opening redis-server's stderr file");
        let mut cmd = match &*SETPRIV {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
                cmd
            }
            None => Command::new(&self.binary),
        };
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
            .stderr(stderr);
        cmd
    }

    /// Polls until our child answers PING (and INFO shows our pid), it exits, or the
    /// start-up timeout runs out.
    fn wait_ready(&self, log_offset: u64) -> Startup {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = self.admin_url();
        loop {
            let exited = registry(&self.child)
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = self.log_contents();
                let new_log = log.get(log_offset as usize..).unwrap_or(&log);
                if new_log.contains("Address already in use") {
                    return Startup::PortTaken;
                }
                return Startup::Failed(format!("redis-server exited with {status}"));
            }
            if self.answers(&url) {
                return Startup::Ready;
            }
            if Instant::now() > deadline {
                return Startup::Failed(format!("no answer within {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
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
            .any(|l| l.trim() == format!("process_id:{}", self.pid))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        registry(&USED_PORTS).remove(&self.port);
        registry(&USED_PORTS).remove(&self.tls_port);
        registry(&USED_PORTS).remove(&self.cluster_port);
    }
}

/// Connects to `url` with `timeout` for connect, reads and writes.
pub(super) fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

/// `setpriv` (util-linux), if it is there and can set a parent-death signal: servers are
/// started through it (it `exec`s redis-server, so the pid stays the server's) so that
/// the kernel kills them when this process dies without running destructors (SIGKILL, a
/// harness's timeout, a crash). Without it, only `Drop` stops them.
pub(crate) static SETPRIV: LazyLock<Option<PathBuf>> = LazyLock::new(|| {
    let works = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        log::warn!(
            "setpriv --pdeathsig is not available: a killed test process leaves its redis-servers running"
        );
    }
    works.then(|| PathBuf::from("setpriv"))
});

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks every server from one thread that lives as long as the process: a parent-death
/// signal fires when the *thread* that forked the child ends, and a server restarted from
/// a short-lived helper thread must not die with that thread.
pub(crate) fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: LazyLock<Mutex<mpsc::Sender<SpawnRequest>>> = LazyLock::new(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("redis-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the redis-server spawner thread");
        Mutex::new(tx)
    });
    let (reply, result) = mpsc::channel();
    registry(&SPAWNER)
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// Sends `SIG<sig>` to `pid` with the `kill` command (no `unsafe` needed).
pub(crate) fn send_signal(pid: u32, sig: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill exited with {status}")))
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`...), if readable.
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_state_reads_own_process() {
        assert!(matches!(proc_state(std::process::id()), Some('R' | 'S')));
    }
}
