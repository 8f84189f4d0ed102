//! `dlm run`: acquire, run the command as a child, stop it if the lock is lost, release.

use std::io::{IsTerminal, Write};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use dlm_core::{
    BackendErrorKind, DEFAULT_WATCHDOG_TIMEOUT, DistributedLock, Error, FencingToken, HoldState,
    Interrupter, Lock, LockGuard, LockName, RetryPolicy, interrupt_pair,
};
use parking_lot::Mutex;
use rustix::process::{Pid, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};

/// The signals forwarded to the command (and that end a wait for the lock).
const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

#[derive(Debug, Args)]
#[command(
    override_usage = "dlm run [OPTIONS] NAME -- COMMAND [ARGS...]\n       dlm run [OPTIONS] NAME -c 'SHELL COMMAND'"
)]
pub(crate) struct RunArgs {
    /// The lock's name (1 to 512 bytes, no control characters).
    #[arg(value_name = "NAME")]
    name: String,
    /// Words after NAME that are not options: a command given without `--`, refused with
    /// a hint (an option of the command's, such as `ls -l`, would be read as dlm's).
    #[arg(value_name = "WORDS", hide = true, allow_hyphen_values = true)]
    stray: Vec<String>,
    /// The command and its arguments (after --).
    #[arg(value_name = "COMMAND", last = true)]
    command: Vec<String>,
    /// Run this with `sh -c` instead of COMMAND.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL COMMAND",
        conflicts_with = "command"
    )]
    shell: Option<String>,
    /// Fail at once when the lock is held.
    #[arg(short = 'n', long, conflicts_with = "wait")]
    no_wait: bool,
    /// Give up after waiting SECS for the lock (default: wait forever). A backend that
    /// does not answer is retried for the whole wait (without -w: for 10 s); -n tries once.
    #[arg(short = 'w', long, value_name = "SECS", value_parser = seconds)]
    wait: Option<Duration>,
    /// The exit status when the lock was not obtained.
    #[arg(short = 'E', long, value_name = "N", default_value_t = exit::CONFLICT)]
    conflict_exit_code: u8,
    /// A fixed lease of SECS, never renewed: the command is stopped when it runs out.
    /// Default: a 30 s lease renewed every 10 s while the command runs.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    lease: Option<Duration>,
    /// The lease the watchdog keeps renewing (every third of it) while the command runs;
    /// if dlm dies, others wait at most this long for the lock. Default: 30.
    #[arg(long, value_name = "SECS", value_parser = seconds, conflicts_with = "lease")]
    watchdog: Option<Duration>,
    /// Stop renewing after SECS: the lease then runs out and the command is stopped.
    #[arg(long, value_name = "SECS", value_parser = seconds, conflicts_with = "lease")]
    max_hold: Option<Duration>,
    /// What to do when the lock is lost while the command runs.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// After SIGTERM for a lost lock, SIGKILL the command if it still runs after SECS.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
    kill_after: Duration,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

/// What `--on-lost` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnLost {
    /// SIGTERM the command, SIGKILL after --kill-after; exit 70.
    Term,
    /// SIGKILL the command at once; exit 70.
    Kill,
    /// Only warn; the command runs on, and dlm exits with its status.
    Ignore,
}

/// `dlm __exec PARENT [--keep] -- COMMAND...` (internal).
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The pid of the `dlm run` that started this.
    parent: i32,
    /// Stay as the keeper of the command's process group instead of becoming the command.
    #[arg(long)]
    keep: bool,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} seconds is too long"))
}

/// The command to run, as given.
fn command_of(args: &RunArgs) -> Result<Vec<String>, Failure> {
    if !args.stray.is_empty() {
        let words = args.stray.join(" ");
        return Err(Failure::usage(match args.shell {
            Some(_) => format!(
                "unexpected {words:?} after NAME: -c takes the whole shell command as one argument (quote it)"
            ),
            None => format!(
                "put the command after --: dlm run [OPTIONS] {} -- {words} (or give a shell command with -c)",
                args.name
            ),
        }));
    }
    match (&args.shell, args.command.is_empty()) {
        (Some(shell), _) => Ok(vec!["sh".into(), "-c".into(), shell.clone()]),
        (None, false) => Ok(args.command.clone()),
        (None, true) => Err(Failure::usage(
            "no command: give one after --, or -c 'shell command'",
        )),
    }
}

/// The signal that ended a wait or is forwarded, shared with the signal thread.
#[derive(Default)]
struct ChildState {
    /// The running command, until it has exited (then never signalled again: its pid
    /// could be another process's).
    child: Option<Child>,
    /// A signal received before the command ran (it ends the wait).
    received: Option<i32>,
}

/// The process `dlm run` started, and how to signal the command through it.
#[derive(Clone, Copy, Debug)]
enum Child {
    /// The keeper (`dlm __exec --keep`), leader of the command's own process group: it
    /// passes on the signals `dlm` sends it to the whole group, and kills the group if
    /// `dlm` dies. SIGKILL goes to the group directly.
    Keeper(Pid),
    /// The command itself, in `dlm`'s process group (the foreground job of a terminal):
    /// the terminal's signals reach it directly; others go to it alone.
    Command(Pid),
}

impl Child {
    /// Sends `sig` to the command and, with a keeper, to everything it started.
    fn signal(self, sig: Signal) {
        let _ = match self {
            Child::Keeper(pid) if sig == Signal::KILL => {
                rustix::process::kill_process_group(pid, sig)
            }
            Child::Keeper(pid) | Child::Command(pid) => rustix::process::kill_process(pid, sig),
        };
    }
}

/// The lock's name and the command, checked before any I/O.
pub(crate) fn check(args: &RunArgs) -> Result<(LockName, Vec<String>), Failure> {
    let name = LockName::new(&args.name)
        .map_err(|e| Failure::usage(format!("bad lock name: {}", e.reason())))?;
    Ok((name, command_of(args)?))
}

pub(crate) fn run(conn: &Connection, args: &RunArgs) -> Result<u8, Failure> {
    let (name, command) = check(args)?;
    let mut builder = conn.client();
    let lease = args
        .lease
        .or(args.watchdog)
        .unwrap_or(DEFAULT_WATCHDOG_TIMEOUT);
    if let Some(lease) = args.lease {
        builder = builder.lease(lease);
    }
    if let Some(timeout) = args.watchdog {
        builder = builder.watchdog_timeout(timeout);
    }
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    if let Some(wait) = args.wait {
        // Transient backend errors (unreachable, no quorum) are retried for the whole wait,
        // not only for the library's default 10 s.
        let retry = RetryPolicy::new();
        builder = builder.retry(retry.error_timeout(wait.max(retry.error_timeout_value())));
    }
    let client = builder
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let lock = client
        .get_lock(name.as_str())
        .map_err(|e| Failure::from_lock_error("bad lock name", &e))?;

    // Signals: they end a wait for the lock, and are forwarded to the command later.
    let state = Arc::new(Mutex::new(ChildState::default()));
    let (interrupter, interrupt) = interrupt_pair();
    let signals = SignalsInfo::<WithOrigin>::new(FORWARDED)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot handle signals: {e}")))?;
    let signals_handle = signals.handle();
    let signal_thread = {
        let state = state.clone();
        thread::Builder::new()
            .name("dlm-signals".into())
            .spawn(move || forward_signals(signals, &state, &interrupter))
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot start a thread: {e}")))?
    };
    let result = acquire_and_run(conn, args, &lock, &interrupt, &state, &command, lease);
    signals_handle.close();
    let _ = signal_thread.join();
    result
}

fn acquire_and_run(
    conn: &Connection,
    args: &RunArgs,
    lock: &DistributedLock,
    interrupt: &dlm_core::Interrupt,
    state: &Arc<Mutex<ChildState>>,
    command: &[String],
    lease: Duration,
) -> Result<u8, Failure> {
    let conflict = || {
        log::info!("{:?} is held by another owner", args.name);
        Ok(args.conflict_exit_code)
    };
    let interrupted = || {
        let signal = state.lock().received.unwrap_or(SIGTERM);
        Failure::new(
            u8::try_from(128 + signal).unwrap_or(u8::MAX),
            format!("interrupted while waiting for {:?}", args.name),
        )
    };
    let acquire_error = |e: Error| match e {
        Error::Interrupted => interrupted(),
        e => Failure::from_lock_error(
            &format!("cannot acquire {:?} ({})", args.name, conn.describe),
            &e,
        ),
    };
    // -n: one attempt. Otherwise the library's waiting calls, which retry transient
    // errors within the wait (a server that comes up late is waited for).
    let got = if args.no_wait {
        lock.try_lock()
    } else {
        let status = StatusLine::start(args, lock);
        let got = match args.wait {
            Some(wait) => lock.try_lock_interruptibly(wait, interrupt),
            None => lock.lock_interruptibly(interrupt).map(Some),
        };
        drop(status);
        got
    };
    let Some(guard) = got.map_err(acquire_error)? else {
        return conflict();
    };
    // The token is drawn now (tokens are drawn when read), for DLM_FENCING_TOKEN.
    let token = match guard.fencing_token() {
        Ok(token) => Some(token),
        Err(e) if e.backend_kind() == Some(BackendErrorKind::Unsupported) => None,
        Err(Error::LockLost) => {
            return Err(Failure::new(
                exit::LOST,
                format!("{:?} was lost before the command started", args.name),
            ));
        }
        Err(e) => {
            drop(guard.unlock());
            return Err(Failure::from_lock_error(
                &format!(
                    "cannot draw the fencing token of {:?} ({})",
                    args.name, conn.describe
                ),
                &e,
            ));
        }
    };
    if state.lock().received.is_some() {
        // A signal came just as the lock was taken: do not start the command.
        drop(guard.unlock());
        return Err(interrupted());
    }
    log::info!(
        "acquired {:?} (fencing token {:?}, lease {lease:?})",
        args.name,
        token.map(|t| t.get())
    );
    run_child(args, guard, token, state, command, lease)
}

/// Runs the command while `guard` holds the lock; stops it if the lock is lost.
fn run_child(
    args: &RunArgs,
    guard: LockGuard,
    token: Option<FencingToken>,
    state: &Arc<Mutex<ChildState>>,
    command: &[String],
    lease: Duration,
) -> Result<u8, Failure> {
    let (mut cmd, own_group) = child_command(command, !in_the_terminals_foreground());
    // dlm's secrets are not the command's: with the lock server's password it could
    // release anyone's lock.
    for var in crate::backend::secret_vars() {
        cmd.env_remove(var);
    }
    cmd.env("DLM_LOCK_NAME", &args.name)
        .env("DLM_LEASE_MS", lease.as_millis().to_string());
    match token {
        Some(token) => cmd.env("DLM_FENCING_TOKEN", token.get().to_string()),
        None => cmd.env_remove("DLM_FENCING_TOKEN"),
    };
    let mut child = {
        // Under the state lock: a signal arriving now is forwarded once the pid is known.
        let mut s = state.lock();
        let child = cmd.spawn().map_err(|e| {
            Failure::new(
                exit::CANNOT_EXECUTE,
                format!("cannot start {:?}: {e}", command[0]),
            )
        })?;
        let pid = Pid::from_child(&child);
        s.child = Some(if own_group {
            Child::Keeper(pid)
        } else {
            Child::Command(pid)
        });
        log::debug!(
            "started the command (pid {pid:?}, {})",
            if own_group {
                "in its own process group"
            } else {
                "in dlm's process group: the terminal's foreground job"
            }
        );
        child
    };
    let pid = Pid::from_child(&child);

    // The lost-lock watcher: stops the command when the lock is lost while it runs.
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let signal = guard.lost_signal();
        let (state, lost) = (state.clone(), lost.clone());
        let (on_lost, kill_after, name) = (args.on_lost, args.kill_after, args.name.clone());
        thread::Builder::new()
            .name("dlm-lost".into())
            .spawn(move || {
                watch_lost(&signal, &done_rx, &state, &lost, on_lost, kill_after, &name);
            })
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot start a thread: {e}")))?
    };

    // Wait without reaping first, so that nobody signals a reaped (reusable) pid.
    let _ = rustix::process::waitid(
        rustix::process::WaitId::Pid(pid),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
    );
    state.lock().child = None;
    let status = child.wait().map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot wait for the command: {e}"),
        )
    })?;
    let code = exit::of_status(status);
    log::info!("the command exited: {status}");
    // The watcher stops watching, and the release ends its wait.
    let _ = done_tx.send(());
    let released = guard.unlock();
    let _ = watcher.join();
    let was_lost = lost.load(std::sync::atomic::Ordering::SeqCst);
    match released {
        Ok(()) => {}
        Err(Error::LockLost) if was_lost => {}
        Err(Error::LockLost) => {
            // Lost between the command's exit and the release, or unnoticed (no renewal
            // was due): the command ran to its end, but maybe not alone at the end.
            log::warn!(
                "{:?}: the lock had been lost when the command exited (it may not have run alone)",
                args.name
            );
            if args.on_lost != OnLost::Ignore {
                return Ok(exit::LOST);
            }
        }
        Err(e) => log::warn!(
            "{:?}: releasing failed ({e}); the lock ends with its lease",
            args.name
        ),
    }
    if was_lost && args.on_lost != OnLost::Ignore {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "the lock {:?} was lost while the command ran; the command was stopped",
                args.name
            ),
        ));
    }
    Ok(code)
}

/// Whether `dlm` is the foreground job of the terminal on its stdin: then the command
/// stays in `dlm`'s process group, so that it can read the terminal and gets Ctrl-C from
/// it. Anywhere else (cron, scripts, pipelines, services) it gets a group of its own.
fn in_the_terminals_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal()
        && rustix::termios::tcgetpgrp(&stdin).is_ok_and(|g| g == rustix::process::getpgrp())
}

/// The command, started through `dlm __exec` (this binary again) so that it dies with
/// `dlm`, without unsafe code between fork and exec.
///
/// With `own_group`, the `__exec` process leads a new process group and stays as the
/// command's keeper: a signal for the command reaches everything the command started,
/// and the whole group is killed if `dlm` dies. Without, it sets the parent-death signal
/// and becomes the command. Also returns whether the command got its own group (under a
/// keeper).
fn child_command(command: &[String], own_group: bool) -> (Command, bool) {
    use std::os::unix::process::CommandExt;
    let mut cmd = match std::env::current_exe() {
        Ok(me) => Command::new(me),
        Err(e) => {
            log::warn!(
                "cannot find dlm's own executable ({e}): the command would not die with dlm; running it directly"
            );
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..]);
            return (cmd, false);
        }
    };
    cmd.arg("__exec")
        .arg(rustix::process::getpid().as_raw_nonzero().to_string());
    if own_group {
        // Set between fork and exec by the standard library: a group signal can never
        // miss the keeper.
        cmd.arg("--keep").process_group(0);
    }
    cmd.arg("--").args(command);
    (cmd, own_group)
}

/// `dlm __exec PARENT [--keep] -- COMMAND...`: dies with the parent, then becomes the
/// command or (with `--keep`) starts it and keeps its process group.
pub(crate) fn exec(args: &ExecArgs) -> Result<u8, Failure> {
    use std::os::unix::process::CommandExt;
    if args.keep {
        return keep(args);
    }
    #[cfg(target_os = "linux")]
    {
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).map_err(|e| {
            Failure::new(
                exit::CANNOT_EXECUTE,
                format!("cannot set the parent-death signal: {e}"),
            )
        })?;
    }
    if orphaned(args.parent) {
        // `dlm` died before the signal was set: do not run unlocked.
        return Err(Failure::new(
            exit::LOST,
            "dlm exited before the command started",
        ));
    }
    let e = Command::new(&args.command[0])
        .args(&args.command[1..])
        .exec();
    Err(cannot_run(&args.command[0], &e))
}

/// Whether the `dlm run` with pid `parent` is gone (this process was re-parented).
fn orphaned(parent: i32) -> bool {
    rustix::process::getppid()
        .map(Pid::as_raw_nonzero)
        .map(i32::from)
        != Some(parent)
}

fn cannot_run(program: &str, e: &std::io::Error) -> Failure {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        exit::NOT_FOUND
    } else {
        exit::CANNOT_EXECUTE
    };
    Failure::new(code, format!("cannot run {program:?}: {e}"))
}

/// What the keeper's signal thread needs to know of the command.
#[derive(Default)]
struct KeeperState {
    /// The command runs: signals from dlm are passed on to the group.
    started: bool,
    /// A signal from dlm before the command started: it is not started.
    early_signal: Option<i32>,
}

/// The parent-death signal of the keeper (Linux); not one that is forwarded.
const PARENT_DIED: i32 = signal_hook::consts::SIGUSR1;

/// The keeper: leader of the command's process group (set by `dlm run` at spawn). It
/// starts the command, passes the signals `dlm run` sends it on to the whole group, and
/// SIGKILLs the group when `dlm run` dies (Linux: a parent-death signal; elsewhere it
/// checks its parent every 250 ms). It exits with the command's status (128+N for
/// signal N).
fn keep(args: &ExecArgs) -> Result<u8, Failure> {
    let failed = |what: &str, e: std::io::Error| {
        Failure::new(exit::CANNOT_EXECUTE, format!("cannot {what}: {e}"))
    };
    // Handlers first: from here on, no signal ends the keeper (but SIGKILL).
    let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED.iter().chain(&[PARENT_DIED]))
        .map_err(|e| failed("handle signals", e))?;
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Signal::from_named_raw(PARENT_DIED))
        .map_err(|e| failed("set the parent-death signal", e.into()))?;
    let parent = args.parent;
    if orphaned(parent) {
        return Err(Failure::new(
            exit::LOST,
            "dlm exited before the command started",
        ));
    }
    let group = rustix::process::getpgrp();
    let kill_group = move || {
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    };
    let started: Arc<Mutex<KeeperState>> = Arc::default();
    {
        let started = started.clone();
        thread::Builder::new()
            .name("dlm-keeper".into())
            .spawn(move || {
                #[cfg(not(target_os = "linux"))]
                thread::spawn(move || {
                    while !orphaned(parent) {
                        thread::sleep(Duration::from_millis(250));
                    }
                    kill_group();
                });
                for origin in signals.forever() {
                    if orphaned(parent) {
                        kill_group(); // this process included
                    }
                    // Only what dlm sends is passed on: the group's own signals (ours
                    // passed on, or anyone's `kill -- -PGID`) reached the command already.
                    let from_dlm = origin.process.is_some_and(|p| p.pid == parent);
                    if origin.signal == PARENT_DIED || !from_dlm {
                        continue;
                    }
                    let mut s = started.lock();
                    if s.started {
                        if let Some(sig) = Signal::from_named_raw(origin.signal) {
                            let _ = rustix::process::kill_process_group(group, sig);
                        }
                    } else {
                        s.early_signal.get_or_insert(origin.signal);
                    }
                }
            })
            .map_err(|e| failed("start a thread", e))?;
    }
    let mut child = {
        let mut s = started.lock();
        if let Some(signal) = s.early_signal {
            // Stopped before it started: report it as the command's death by `signal`.
            return Ok(u8::try_from(128 + signal).unwrap_or(u8::MAX));
        }
        // Spawn returns once the command has been executed: a signal passed on after
        // this meets the command, not the fork in between.
        let child = Command::new(&args.command[0])
            .args(&args.command[1..])
            .spawn()
            .map_err(|e| cannot_run(&args.command[0], &e))?;
        s.started = true;
        child
    };
    let status = child
        .wait()
        .map_err(|e| failed("wait for the command", e))?;
    Ok(exit::of_status(status))
}

/// Forwards the signals `dlm` gets to the command; before it runs, they end the wait.
fn forward_signals(
    mut signals: SignalsInfo<WithOrigin>,
    state: &Mutex<ChildState>,
    interrupter: &Interrupter,
) {
    for origin in signals.forever() {
        let mut s = state.lock();
        match s.child {
            Some(child) => {
                // A signal from the terminal (Ctrl-C, Ctrl-\) reached a command in our
                // process group too. Any other is passed on.
                if origin.process.is_none() && matches!(child, Child::Command(_)) {
                    continue;
                }
                if let Some(sig) = Signal::from_named_raw(origin.signal) {
                    log::info!("forwarding signal {} to the command", origin.signal);
                    child.signal(sig);
                }
            }
            None => {
                s.received.get_or_insert(origin.signal);
                interrupter.interrupt();
            }
        }
    }
}

/// Waits for the hold to end; if it was lost while the command runs, stops the command.
fn watch_lost(
    signal: &dlm_core::LostSignal,
    done: &Receiver<()>,
    state: &Mutex<ChildState>,
    lost: &std::sync::atomic::AtomicBool,
    on_lost: OnLost,
    kill_after: Duration,
    name: &str,
) {
    // The hold ends lost, or released after the command exited (`done` is sent first).
    if signal.wait() != HoldState::Lost || done.try_recv().is_ok() {
        return;
    }
    lost.store(true, std::sync::atomic::Ordering::SeqCst);
    let send = |sig: Signal| {
        if let Some(child) = state.lock().child {
            child.signal(sig);
        }
    };
    match on_lost {
        OnLost::Ignore => {
            log::warn!("{name:?}: the lock was lost; the command runs on (--on-lost=ignore)");
        }
        OnLost::Kill => {
            log::error!("{name:?}: the lock was lost: killing the command");
            send(Signal::KILL);
        }
        OnLost::Term => {
            log::error!(
                "{name:?}: the lock was lost: stopping the command (SIGTERM, SIGKILL after {kill_after:?})"
            );
            send(Signal::TERM);
            if let Err(RecvTimeoutError::Timeout) = done.recv_timeout(kill_after) {
                log::error!("{name:?}: the command still runs after {kill_after:?}: SIGKILL");
                send(Signal::KILL);
            }
        }
    }
}

/// How long a wait lasts before the status line shows.
const STATUS_AFTER: Duration = Duration::from_millis(300);

/// The line on stderr while waiting on a terminal: what is waited for, and how long.
struct StatusLine {
    stop: Option<Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl StatusLine {
    fn start(args: &RunArgs, lock: &DistributedLock) -> StatusLine {
        let none = StatusLine {
            stop: None,
            thread: None,
        };
        if args.backend.quiet || !std::io::stderr().is_terminal() {
            return none;
        }
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let lock = lock.clone();
        let name = args.name.clone();
        let thread = thread::Builder::new()
            .name("dlm-status".into())
            .spawn(move || {
                let start = Instant::now();
                // Nothing for a lock obtained at once: the line shows once the wait has
                // lasted a moment.
                if !matches!(
                    stopped.recv_timeout(STATUS_AFTER),
                    Err(RecvTimeoutError::Timeout)
                ) {
                    return;
                }
                // The holder's lease (`Ok(Some)`), a free lock (`Ok(None)`), or whether
                // the backend failed transiently (`Err`), asked every few seconds.
                let mut seen: Result<Option<Duration>, bool> = Err(false);
                let mut asked = Instant::now();
                let mut first = true;
                loop {
                    if first || asked.elapsed() >= Duration::from_secs(3) {
                        seen = lock.remaining_lease().map_err(|e| {
                            e.backend()
                                .is_some_and(dlm_core::BackendError::is_transient)
                        });
                        asked = Instant::now();
                        first = false;
                    }
                    let holder = match seen {
                        Ok(Some(r)) => format!(
                            "held by another owner, lease ends in {}s",
                            r.saturating_sub(asked.elapsed()).as_secs()
                        ),
                        Ok(None) => "free a moment ago".to_owned(),
                        Err(true) => "the backend does not answer; retrying".to_owned(),
                        Err(false) => "held by another owner".to_owned(),
                    };
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "\r\x1b[2Kdlm: waiting for {name:?} ({holder}); waited {}s",
                        start.elapsed().as_secs()
                    );
                    let _ = err.flush();
                    drop(err);
                    if !matches!(
                        stopped.recv_timeout(Duration::from_secs(1)),
                        Err(RecvTimeoutError::Timeout)
                    ) {
                        let _ = write!(std::io::stderr(), "\r\x1b[2K");
                        return;
                    }
                }
            })
            .ok();
        StatusLine {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
