//! The process control every server of the testkit shares ([`RedisServer`], [`EtcdServer`]):
//! a [`Process`] is one server's child and its temp dir, started through the spawner
//! thread and `setpriv --pdeathsig`, registered among the live pids of its kind, paused,
//! resumed, killed and reaped, quoted in failure messages with the tail of its log; a
//! [`Server`] is started again on its ports while they turn out to be taken; free
//! loopback ports are picked here, never one twice in this process.
//!
//! No server is left behind when the test process dies without running destructors
//! (SIGKILL, a harness's timeout, a crash): every child is started through `setpriv
//! --pdeathsig KILL` (it `exec`s the server, so the pid stays the server's), forked by one
//! thread that lives as long as the process (the signal fires when the *thread* that
//! forked the child ends). `Drop` kills and reaps them otherwise, and the registry of live
//! pids lets a test prove it.
//!
//! [`RedisServer`]: crate::redis_server::RedisServer
//! [`EtcdServer`]: crate::etcd::EtcdServer

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How many times a server is started (on fresh ports, or again on its own) while a port
/// turns out to be taken.
pub(crate) const START_ATTEMPTS: usize = 5;
/// How many log lines failure messages quote.
const LOG_TAIL_LINES: usize = 40;

/// A server's binary: `$<env>` if set, else `name` on `PATH`, else in one of `dirs`.
pub(crate) fn find_binary(env: &str, name: &str, dirs: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Ports handed out in this process, so that two servers never race for one port.
static USED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Locks a registry, shrugging off poisoning (a panicking test must not break others).
fn registry<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A free loopback port that no other server of this process has been given.
pub(crate) fn pick_port() -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if registry(&USED_PORTS).insert(port) {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// Gives `ports` back (0, no port, is ignored): another server may be given them.
pub(crate) fn free_ports(ports: &[u16]) {
    let mut used = registry(&USED_PORTS);
    for port in ports {
        used.remove(port);
    }
}

/// The pids of one kind of server's children alive in this process (each kind has its
/// own, so that a test of one kind is not confused by another's).
pub(crate) struct LivePids(Mutex<BTreeSet<u32>>);

/// Only its name: a server's `Debug` does not list every live pid of its kind.
impl std::fmt::Debug for LivePids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LivePids")
    }
}

impl LivePids {
    /// An empty registry, for a `static`.
    pub(crate) const fn new() -> LivePids {
        LivePids(Mutex::new(BTreeSet::new()))
    }

    /// The pids, sorted.
    pub(crate) fn pids(&self) -> Vec<u32> {
        registry(&self.0).iter().copied().collect()
    }
}

/// What one start-up attempt came to.
pub(crate) enum Startup {
    /// The child serves.
    Ready,
    /// The child exited because one of its ports was taken.
    PortTaken,
    /// The child exited, or did not serve in time: why.
    Failed(String),
}

/// The log files of a server, in its dir.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Logs {
    /// The log, whose last lines failure messages quote.
    pub(crate) log: &'static str,
    /// Where the child's stderr goes, quoted whole, when that is not the log.
    pub(crate) stderr: Option<&'static str>,
}

/// One server's child process (the current one, across restarts) and its temp dir.
#[derive(Debug)]
pub(crate) struct Process {
    /// The program's name in messages (`redis-server`, `etcd`).
    program: &'static str,
    /// The server's binary (run through `setpriv` where it works).
    binary: PathBuf,
    /// Data and logs; removed on drop, or by a later test process if this one dies
    /// first (`tempdirs`).
    dir: TempDir,
    /// Its log files in `dir`.
    logs: Logs,
    /// The live pids of this kind of server.
    live: &'static LivePids,
    /// The current (or, after a kill, the last) child's pid; 0 before the first start.
    pid: u32,
    /// The running child; `None` once killed or found exited.
    child: Mutex<Option<Child>>,
    /// Whether it was paused and not resumed since.
    paused: AtomicBool,
}

impl Process {
    /// A process of `binary`, not started yet, with a new temp dir (`dir_prefix...`).
    pub(crate) fn new(
        program: &'static str,
        binary: PathBuf,
        dir_prefix: &str,
        logs: Logs,
        live: &'static LivePids,
    ) -> Process {
        let dir = crate::tempdirs::owned_tempdir(dir_prefix)
            .unwrap_or_else(|e| panic!("creating a temp dir for {program}: {e}"));
        Process {
            program,
            binary,
            dir,
            logs,
            live,
            pid: 0,
            child: Mutex::new(None),
            paused: AtomicBool::new(false),
        }
    }

    /// The binary run, through `setpriv --pdeathsig KILL` where it works; the caller adds
    /// the server's arguments.
    pub(crate) fn command(&self) -> Command {
        match &*SETPRIV {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
                cmd
            }
            None => Command::new(&self.binary),
        }
    }

    /// As [`command`](Self::command), run as the OS user `user` (its uid and gid, no
    /// supplementary groups) by an outer `setpriv`: the parent-death signal is set after
    /// the change of credentials, which clears it.
    pub(crate) fn command_as(&self, user: &str) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={user}"))
            .arg(format!("--regid={user}"))
            .args(["--clear-groups", "--"]);
        if let Some(setpriv) = &*SETPRIV {
            cmd.arg(setpriv).args(["--pdeathsig", "KILL", "--"]);
        }
        cmd.arg(&self.binary);
        cmd
    }

    /// Starts `cmd` (from [`command`](Self::command)) from the spawner thread, and
    /// registers its pid. Panics if it cannot be spawned.
    pub(crate) fn launch(&mut self, cmd: Command) {
        let child =
            spawn_child(cmd).unwrap_or_else(|e| panic!("spawning {}: {e}", self.binary.display()));
        self.pid = child.id();
        *registry(&self.child) = Some(child);
        registry(&self.live.0).insert(self.pid);
    }

    /// Polls until `ready` says the child serves, it exits (its log since byte `log_from`
    /// telling a port taken from another failure), or `timeout` runs out.
    pub(crate) fn wait_started(
        &self,
        log_from: u64,
        timeout: Duration,
        ready: impl Fn() -> bool,
    ) -> Startup {
        let deadline = Instant::now() + timeout;
        loop {
            let exited = registry(&self.child)
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = self.log_contents();
                let new_log = log.get(log_from as usize..).unwrap_or(&log);
                if new_log
                    .to_ascii_lowercase()
                    .contains("address already in use")
                {
                    return Startup::PortTaken;
                }
                return Startup::Failed(format!("{} exited with {status}", self.program));
            }
            if ready() {
                return Startup::Ready;
            }
            if Instant::now() > deadline {
                return Startup::Failed(format!("not ready within {timeout:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of the current (or, after a kill, the last) child.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The temp dir.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log (empty if unreadable).
    pub(crate) fn log_contents(&self) -> String {
        fs::read(self.dir().join(self.logs.log))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The log's length in bytes (0 if unreadable): where a start-up's own lines begin.
    pub(crate) fn log_len(&self) -> u64 {
        fs::metadata(self.dir().join(self.logs.log)).map_or(0, |m| m.len())
    }

    /// The file the child's stderr goes to: the log unless the server has a file of its
    /// own for it.
    pub(crate) fn stderr_file(&self) -> fs::File {
        let name = self.logs.stderr.unwrap_or(self.logs.log);
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir().join(name))
            .unwrap_or_else(|e| panic!("opening {}'s {name}: {e}", self.program))
    }

    /// Panics with `msg`, naming the server (`who`) and its pid, with the tail of its logs.
    pub(crate) fn fail(&self, who: &str, msg: &str) -> ! {
        panic!("{who} (pid {}): {msg}\n{}", self.pid, self.log_tail())
    }

    /// The log's last lines, and the stderr file when there is one.
    fn log_tail(&self) -> String {
        let log = self.log_contents();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        let mut out = format!(
            "--- {} (last {LOG_TAIL_LINES} lines) ---\n{tail}",
            self.logs.log
        );
        if let Some(stderr) = self.logs.stderr {
            let text = fs::read_to_string(self.dir().join(stderr)).unwrap_or_default();
            out.push_str(&format!("\n--- stderr ---\n{text}"));
        }
        out
    }

    /// Stops the child with SIGSTOP, and returns once the kernel reports it stopped.
    pub(crate) fn pause(&self) -> Result<(), String> {
        self.signal("STOP")?;
        self.paused.store(true, Ordering::SeqCst);
        self.wait_proc_state(|s| s == 'T');
        Ok(())
    }

    /// Continues a paused child with SIGCONT.
    pub(crate) fn resume(&self) -> Result<(), String> {
        self.signal("CONT")?;
        self.paused.store(false, Ordering::SeqCst);
        self.wait_proc_state(|s| s != 'T');
        Ok(())
    }

    /// Whether [`pause`](Self::pause) was called without a later resume.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Kills the child with SIGKILL (continuing it first if paused) and reaps it; nothing
    /// if it is not running. `who` names the server in the debug log.
    pub(crate) fn kill(&mut self, who: &str) {
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
            registry(&self.live.0).remove(&child.id());
            log::debug!("{who}: pid {} killed", child.id());
        }
    }

    /// Whether the child is alive (not killed, not exited). A paused one is running.
    pub(crate) fn is_running(&self) -> bool {
        let mut guard = registry(&self.child);
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        registry(&self.live.0).remove(&child.id());
        *guard = None;
        false
    }

    /// Sends `SIG<sig>` to the child.
    fn signal(&self, sig: &str) -> Result<(), String> {
        send_signal(self.pid, sig).map_err(|e| format!("kill -{sig} {}: {e}", self.pid))
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
}

/// A server that holds a [`Process`]: what starting it needs to know of it.
pub(crate) trait Server {
    /// Its process.
    fn process(&mut self) -> &mut Process;

    /// The server in messages: `redis-server on port 6379`, `etcd m0 on client port 2379`.
    fn who(&self) -> String;

    /// One start: picks fresh ports unless `again` (a restart keeps them), starts the
    /// child and waits for it.
    fn start_once(&mut self, again: bool) -> Startup;

    /// Starts the child, on fresh ports or `again` on its own, a few times while a port
    /// turns out to be taken (by another process, between the pick and the bind; a
    /// restart waits a moment between tries). Panics with the log if it does not come up.
    fn start(&mut self, again: bool) {
        for attempt in 1..=START_ATTEMPTS {
            match self.start_once(again) {
                Startup::Ready => {
                    log::debug!("{} (pid {}) ready", self.who(), self.process().pid());
                    return;
                }
                Startup::PortTaken => {
                    let who = self.who();
                    log::debug!("{who}: port taken (attempt {attempt}); retrying");
                    self.process().kill(&who);
                    if again {
                        thread::sleep(Duration::from_millis(200));
                    }
                }
                Startup::Failed(why) => {
                    let who = self.who();
                    self.process().kill(&who);
                    let verb = if again { "restart" } else { "start" };
                    self.process()
                        .fail(&who, &format!("failed to {verb}: {why}"));
                }
            }
        }
        let who = self.who();
        self.process().fail(
            &who,
            &format!("ports still taken after {START_ATTEMPTS} attempts"),
        );
    }
}

/// The controls every server offers, as public methods of its type (which implements
/// [`Server`] and holds its [`Process`] in a field `process`): pid, dir, log, pause and
/// resume, kill, whether it runs; and `fail`, for its own failures.
macro_rules! controls {
    () => {
        /// The pid of the current (or, after [`kill`](Self::kill), the last) process.
        pub fn pid(&self) -> u32 {
            self.process.pid()
        }

        /// Its temp dir (its data and its log).
        pub fn dir(&self) -> &std::path::Path {
            self.process.dir()
        }

        /// The server's log (empty if unreadable).
        pub fn log_contents(&self) -> String {
            self.process.log_contents()
        }

        /// Stops the process with SIGSTOP: it keeps its sockets but answers nothing.
        /// Returns once the kernel reports it stopped.
        pub fn pause(&self) {
            if let Err(e) = self.process.pause() {
                self.fail(&e);
            }
        }

        /// Continues a paused process with SIGCONT.
        pub fn resume(&self) {
            if let Err(e) = self.process.resume() {
                self.fail(&e);
            }
        }

        /// Whether [`pause`](Self::pause) was called without a later resume.
        pub fn is_paused(&self) -> bool {
            self.process.is_paused()
        }

        /// Kills the process with SIGKILL (`kill -9`: no clean shutdown) and reaps it;
        /// the server is down afterwards. Does nothing if it is not running.
        pub fn kill(&mut self) {
            let who = $crate::process::Server::who(self);
            self.process.kill(&who);
        }

        /// Whether the process is alive (not killed, not exited). A paused one is running.
        pub fn is_running(&self) -> bool {
            self.process.is_running()
        }

        /// Panics with `msg`, the server's ports and pid, and the tail of its logs.
        pub(crate) fn fail(&self, msg: &str) -> ! {
            self.process.fail(&$crate::process::Server::who(self), msg)
        }
    };
}
pub(crate) use controls;

/// `setpriv` (util-linux), if it is there and can set a parent-death signal: servers are
/// started through it (it `exec`s the server, so the pid stays the server's) so that
/// the kernel kills them when this process dies without running destructors (SIGKILL, a
/// harness's timeout, a crash). Without it, only `Drop` stops them.
static SETPRIV: LazyLock<Option<PathBuf>> = LazyLock::new(|| {
    let works = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        log::warn!(
            "setpriv --pdeathsig is not available: a killed test process leaves its servers running"
        );
    }
    works.then(|| PathBuf::from("setpriv"))
});

/// A command for the spawner thread, and where its child goes.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks every server from one thread that lives as long as the process: a parent-death
/// signal fires when the *thread* that forked the child ends, and a server restarted from
/// a short-lived helper thread must not die with that thread.
fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: LazyLock<Mutex<mpsc::Sender<SpawnRequest>>> = LazyLock::new(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("server-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the server spawner thread");
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
fn send_signal(pid: u32, sig: &str) -> std::io::Result<()> {
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
fn proc_state(pid: u32) -> Option<char> {
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
