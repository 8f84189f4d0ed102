//! `dlm run`: acquire, run the command as a child, stop it if the lock is lost, release.

use std::io::{IsTerminal, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use dlm_core::{
    BackendErrorKind, DEFAULT_WATCHDOG_TIMEOUT, DistributedLock, Error, HoldState, Interrupter,
    Lock, LockGuard, LockName, RetryPolicy, interrupt_pair,
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
    #[command(flatten)]
    pub(crate) lock: LockArgs,
    /// What to do when the lock is lost while the command runs.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// After SIGTERM for a lost lock, SIGKILL the command if it still runs after SECS.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
    kill_after: Duration,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

/// How to take and keep the lock: shared by `dlm run` and `dlm hold`.
#[derive(Debug, Args)]
pub(crate) struct LockArgs {
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
    /// A fixed lease of SECS, never renewed: when it runs out the lock is lost (run: the
    /// command is stopped). Default: a 30 s lease renewed every 10 s while the lock is held.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    lease: Option<Duration>,
    /// The lease the watchdog keeps renewing (every third of it) while the lock is held;
    /// if dlm dies, others wait at most this long for the lock. Default: 30.
    #[arg(long, value_name = "SECS", value_parser = seconds, conflicts_with = "lease")]
    watchdog: Option<Duration>,
    /// Stop renewing after SECS: the lease then runs out and the lock is lost (run: the
    /// command is stopped).
    #[arg(long, value_name = "SECS", value_parser = seconds, conflicts_with = "lease")]
    max_hold: Option<Duration>,
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

/// `dlm __exec PARENT -- COMMAND...` (internal).
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The pid of the `dlm run` that started this.
    parent: i32,
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
    /// `dlm hold`: where the signals received while no command runs are reported.
    report: Option<Sender<i32>>,
}

/// The process `dlm run` started, and how to signal the command.
#[derive(Clone, Debug)]
enum Child {
    /// The command, in the process group of its keeper (a shell, see [`Keeper`]), which kills the
    /// group if `dlm` dies: signals go to the whole group, so that they reach what the
    /// command started too (once the keeper is ready to ignore them).
    Group { group: Pid, ready: Arc<Ready> },
    /// The command itself, in `dlm`'s process group (the foreground job of a terminal):
    /// the terminal's signals reach it directly; others go to it alone.
    Command(Pid),
}

impl Child {
    /// Sends `sig` to the command and, in a group of its own, to everything it started.
    fn signal(&self, sig: Signal) {
        let _ = match self {
            Child::Group { group, ready } => {
                if sig != Signal::KILL {
                    ready.wait();
                }
                rustix::process::kill_process_group(*group, sig)
            }
            Child::Command(pid) => rustix::process::kill_process(*pid, sig),
        };
    }
}

/// Whether the keeper has installed its signal handlers: until then a signal sent to the
/// group would end it, and with it the guarantee that the group dies with `dlm`. It writes
/// one byte on its standard output once they are in place (or exits: end of file).
#[derive(Debug)]
struct Ready(Mutex<Option<std::process::ChildStdout>>);

impl Ready {
    /// Waits until the keeper is ready or gone (at most its start-up, once).
    fn wait(&self) {
        use std::io::Read;
        if let Some(mut out) = self.0.lock().take() {
            let _ = out.read(&mut [0u8; 1]);
        }
    }
}

/// The keeper of the command's process group: a POSIX shell running [`KEEPER`], started
/// as the leader of a new group that the command then joins. Its standard input is a pipe
/// from `dlm`, which writes nothing: when `dlm` dies, the kernel closes `dlm`'s end (it
/// is close-on-exec, so the command does not hold it), the keeper reads end of file, and
/// SIGKILLs the group, itself included. No parent-death signal and no polling: the pipe
/// says it, on every Unix, and a `dlm` that died before the keeper read is seen all the
/// same. The signals `dlm` forwards to the group reach the keeper too: it ignores them
/// (`trap ''`), and says so with one byte on its standard output, before which `dlm` sends
/// the group none. At the end of a run, `dlm` SIGKILLs it (the group then lives on with
/// what the command left) and reaps it before it exits.
///
/// A shell rather than `dlm` itself: with no `unsafe` code, `dlm` cannot fork without an
/// exec, and a second start of `dlm` cost about 0.4 ms more CPU than the shell's, on every
/// run (issue #21).
struct Keeper {
    process: std::process::Child,
}

/// The keeper's script (see [`Keeper`]): every word of it is a POSIX shell built-in
/// (`kill 0` is the shell's own process group).
const KEEPER: &str =
    "trap '' INT TERM HUP QUIT; printf r; while read -r _; do :; done; kill -s KILL 0";

/// The shell that runs [`KEEPER`].
const SHELL: &str = "/bin/sh";

impl Keeper {
    /// Starts the keeper; `Err` when it cannot be started.
    fn start() -> std::io::Result<(Keeper, Arc<Ready>)> {
        use std::os::unix::process::CommandExt;
        let mut process = Command::new(SHELL)
            .arg("-c")
            .arg(KEEPER)
            // Nothing of dlm's (its secrets), and nothing a shell might read at start.
            .env_clear()
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let ready = Arc::new(Ready(Mutex::new(process.stdout.take())));
        Ok((Keeper { process }, ready))
    }

    /// The process group the command joins (the keeper leads it).
    fn group(&self) -> Pid {
        Pid::from_child(&self.process)
    }

    /// Ends the keeper (the group it leads lives on with what the command left running):
    /// SIGKILL, which it cannot outlive to read the end of its input when `dlm` exits.
    /// Returns the process, to reap.
    fn kill(mut self) -> std::process::Child {
        let _ = self.process.kill();
        self.process
    }

    /// Ends the keeper and reaps it.
    fn end(self) {
        let _ = self.kill().wait();
    }
}

/// The lock's name and the command, checked before any I/O.
pub(crate) fn check(args: &RunArgs) -> Result<(LockName, Vec<String>), Failure> {
    let name = LockName::new(&args.name)
        .map_err(|e| Failure::usage(format!("bad lock name: {}", e.reason())))?;
    Ok((name, command_of(args)?))
}

/// `dlm run`, to its end: it exits the process (with the command's status, or the
/// failure's) as soon as the lock is released, without tearing anything down: its
/// threads, connections and handlers end with the process.
pub(crate) fn run(conn: &Connection, args: &RunArgs) -> ! {
    exit::now(run_to_release(conn, args))
}

fn run_to_release(conn: &Connection, args: &RunArgs) -> Result<u8, Failure> {
    let (name, command) = check(args)?;
    let (lock, lease) = lock_for(conn, &name, &args.lock)?;
    // Signals: they end a wait for the lock, and are forwarded to the command later. With
    // -n there is no wait to end: the thread starts once the command runs.
    let mut signals = Signals::new(None)?;
    if !args.lock.no_wait {
        signals.start_thread()?;
    }
    let got = acquire(
        conn,
        &args.name,
        &args.lock,
        args.backend.quiet,
        &lock,
        &mut signals,
    )?;
    match got {
        Ok(guard) => run_child(args, guard, &mut signals, &command, lease),
        Err(code) => Ok(code),
    }
}

/// The lock `name` on a client with `args`' lease settings, and the lease in force.
pub(crate) fn lock_for(
    conn: &Connection,
    name: &LockName,
    args: &LockArgs,
) -> Result<(DistributedLock, Duration), Failure> {
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
    Ok((lock, lease))
}

/// The signals `dlm` gets, and the thread that handles them: before the lock is held they
/// end the wait; then `dlm run` forwards them to the command, and `dlm hold` gets them on
/// `report`. The handlers are installed at once ([`Signals::new`]); the thread starts
/// when something needs it ([`Signals::start_thread`]): before a wait (it interrupts it),
/// or, for `dlm run -n`, after the command started (a signal that came before is found by
/// [`Signals::take_pending`], or forwarded once the thread runs), so that the command's
/// start does not wait for a thread's.
pub(crate) struct Signals {
    state: Arc<Mutex<ChildState>>,
    interrupt: dlm_core::Interrupt,
    interrupter: Option<Interrupter>,
    /// Until the thread takes them.
    signals: Option<SignalsInfo<WithOrigin>>,
    handle: signal_hook::iterator::Handle,
    thread: Option<thread::JoinHandle<()>>,
}

impl Signals {
    /// Installs the handlers (signals received from now on are kept), without the thread.
    pub(crate) fn new(report: Option<Sender<i32>>) -> Result<Signals, Failure> {
        let state = Arc::new(Mutex::new(ChildState {
            report,
            ..ChildState::default()
        }));
        let (interrupter, interrupt) = interrupt_pair();
        let signals = SignalsInfo::<WithOrigin>::new(FORWARDED)
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot handle signals: {e}")))?;
        Ok(Signals {
            state,
            interrupt,
            interrupter: Some(interrupter),
            handle: signals.handle(),
            signals: Some(signals),
            thread: None,
        })
    }

    /// The handlers and the thread.
    pub(crate) fn start(report: Option<Sender<i32>>) -> Result<Signals, Failure> {
        let mut signals = Signals::new(report)?;
        signals.start_thread()?;
        Ok(signals)
    }

    /// Starts the thread (once): it handles the signals received so far, then the next.
    pub(crate) fn start_thread(&mut self) -> Result<(), Failure> {
        let (Some(mut signals), Some(interrupter)) = (self.signals.take(), self.interrupter.take())
        else {
            return Ok(());
        };
        let state = self.state.clone();
        let thread = thread::Builder::new()
            .name("dlm-signals".into())
            .spawn(move || forward_signals(&mut signals, &state, &interrupter))
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot start a thread: {e}")))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Before the thread runs: notes a signal received so far (it ends the run as one
    /// that ended a wait does). Whether there was one.
    fn take_pending(&mut self) -> bool {
        let Some(signals) = &mut self.signals else {
            return false;
        };
        if let Some(origin) = signals.pending().next() {
            self.state.lock().received.get_or_insert(origin.signal);
        }
        self.state.lock().received.is_some()
    }

    pub(crate) fn stop(self) {
        self.handle.close();
        if let Some(thread) = self.thread {
            let _ = thread.join();
        }
    }

    /// The status for a wait ended by a signal: 128 + its number.
    fn interrupted(&self, name: &str) -> Failure {
        let signal = self.state.lock().received.unwrap_or(SIGTERM);
        Failure::new(
            u8::try_from(128 + signal).unwrap_or(u8::MAX),
            format!("interrupted while waiting for {name:?}"),
        )
    }
}

/// Takes `lock` as `args` say (`-n`, `-w`, or waiting for it); a signal ends the wait.
/// `Ok(Err(status))` when it was not obtained (held by another owner).
pub(crate) fn acquire(
    conn: &Connection,
    name: &str,
    args: &LockArgs,
    quiet: bool,
    lock: &DistributedLock,
    signals: &mut Signals,
) -> Result<Result<LockGuard, u8>, Failure> {
    let acquire_error = |e: Error| match e {
        Error::Interrupted => signals.interrupted(name),
        e => Failure::from_lock_error(&format!("cannot acquire {name:?} ({})", conn.describe), &e),
    };
    // -n: one attempt. Otherwise the library's waiting calls, which retry transient
    // errors within the wait (a server that comes up late is waited for).
    let got = if args.no_wait {
        lock.try_lock()
    } else {
        let status = StatusLine::start(name, quiet, lock);
        let got = match args.wait {
            Some(wait) => lock.try_lock_interruptibly(wait, &signals.interrupt),
            None => lock.lock_interruptibly(&signals.interrupt).map(Some),
        };
        drop(status);
        got
    };
    let Some(guard) = got.map_err(acquire_error)? else {
        log::info!("{name:?} is held by another owner");
        return Ok(Err(args.conflict_exit_code));
    };
    if signals.take_pending() {
        // A signal came just as the lock was taken (or, with -n, before the thread that
        // handles signals started): do not go on.
        drop(guard.unlock());
        return Err(signals.interrupted(name));
    }
    // The token is drawn now (tokens are drawn when read), for DLM_FENCING_TOKEN; later
    // reads (`token`) are local.
    match guard.fencing_token() {
        Ok(_) => {}
        Err(e) if e.backend_kind() == Some(BackendErrorKind::Unsupported) => {}
        Err(Error::LockLost) => {
            return Err(Failure::new(
                exit::LOST,
                format!("{name:?} was lost before the command started"),
            ));
        }
        Err(e) => {
            drop(guard.unlock());
            return Err(Failure::from_lock_error(
                &format!(
                    "cannot draw the fencing token of {name:?} ({})",
                    conn.describe
                ),
                &e,
            ));
        }
    }
    log::info!("acquired {name:?} (fencing token {:?})", token(&guard));
    Ok(Ok(guard))
}

/// The hold's fencing token, if fencing is on (the one place that reads it; drawn by
/// [`acquire`], so this read is local).
pub(crate) fn token(guard: &LockGuard) -> Option<u64> {
    guard.known_fencing_token().map(|t| t.get())
}

/// Runs the command while `guard` holds the lock; stops it if the lock is lost.
fn run_child(
    args: &RunArgs,
    guard: LockGuard,
    signals: &mut Signals,
    command: &[String],
    lease: Duration,
) -> Result<u8, Failure> {
    let state = &signals.state.clone();
    let (mut cmd, keeper) = child_command(command, !in_the_terminals_foreground())?;
    // dlm's secrets are not the command's: with the lock server's password it could
    // release anyone's lock.
    for var in crate::backend::secret_vars() {
        cmd.env_remove(var);
    }
    cmd.env("DLM_LOCK_NAME", &args.name)
        .env("DLM_LEASE_MS", lease.as_millis().to_string());
    match token(&guard) {
        Some(token) => cmd.env("DLM_FENCING_TOKEN", token.to_string()),
        None => cmd.env_remove("DLM_FENCING_TOKEN"),
    };
    let spawned = {
        // Under the state lock: a signal arriving now is forwarded once the pid is known.
        let mut s = state.lock();
        cmd.spawn().inspect(|child| {
            let pid = Pid::from_child(child);
            s.child = Some(match &keeper {
                Some((keeper, ready)) => Child::Group {
                    group: keeper.group(),
                    ready: ready.clone(),
                },
                None => Child::Command(pid),
            });
            log::debug!(
                "started the command (pid {pid:?}, {})",
                if keeper.is_some() {
                    "in a process group of its own"
                } else {
                    "in dlm's process group: the terminal's foreground job"
                }
            );
        })
    };
    let keeper = keeper.map(|(keeper, _)| keeper);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Some(keeper) = keeper {
                keeper.end();
            }
            return Err(cannot_run(&command[0], &e));
        }
    };
    let pid = Pid::from_child(&child);
    // Signals received from now on are forwarded to the command (with -n, the thread
    // starts here, after the command: it forwards what came meanwhile).
    signals.start_thread()?;

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
    // The keeper goes (its exit is reaped after the release, which it does not delay).
    let keeper = keeper.map(Keeper::kill);
    let code = exit::of_status(status);
    log::info!("the command exited: {status}");
    // The watcher stops watching, and the release ends its wait (it is not joined: once
    // the command's pid is cleared, it changes nothing, and the process exits next).
    let _ = done_tx.send(());
    let released = guard.unlock();
    if let Some(mut keeper) = keeper {
        let _ = keeper.wait();
    }
    drop(watcher);
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

/// A started keeper, and whether it is ready for group signals.
type KeeperAndReady = (Keeper, Arc<Ready>);

/// How the command is started, so that it dies with `dlm` without unsafe code between
/// fork and exec.
///
/// With `own_group`: the command itself, in the process group of a [`Keeper`] started
/// first: a signal for the command reaches everything the command started, and the
/// keeper kills the whole group if `dlm` dies. The command does not wait for the
/// keeper's start-up (it joins the group as soon as the keeper's process exists).
/// Without (the terminal's foreground job): `dlm __exec`, which sets the parent-death
/// signal and becomes the command. Also returns the keeper, if any.
fn child_command(
    command: &[String],
    own_group: bool,
) -> Result<(Command, Option<KeeperAndReady>), Failure> {
    use std::os::unix::process::CommandExt;
    if own_group {
        let (keeper, ready) = Keeper::start().map_err(|e| {
            Failure::new(
                exit::CANNOT_EXECUTE,
                format!("cannot start dlm's keeper process ({SHELL}): {e}"),
            )
        })?;
        let mut cmd = Command::new(&command[0]);
        // Joined between fork and exec by the standard library: a group signal can never
        // miss the command.
        cmd.args(&command[1..])
            .process_group(keeper.group().as_raw_nonzero().get());
        return Ok((cmd, Some((keeper, ready))));
    }
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            log::warn!(
                "cannot find dlm's own executable ({e}): the command would not die with dlm; running it directly"
            );
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..]);
            return Ok((cmd, None));
        }
    };
    let mut cmd = Command::new(me);
    cmd.arg("__exec")
        .arg(rustix::process::getpid().as_raw_nonzero().to_string())
        .arg("--")
        .args(command);
    Ok((cmd, None))
}

/// `dlm __exec PARENT -- COMMAND...`: dies with the parent, then becomes the command.
pub(crate) fn exec(args: &ExecArgs) -> Result<u8, Failure> {
    use std::os::unix::process::CommandExt;
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

/// Forwards the signals `dlm` gets to the command; before it runs, they end the wait.
fn forward_signals(
    signals: &mut SignalsInfo<WithOrigin>,
    state: &Mutex<ChildState>,
    interrupter: &Interrupter,
) {
    for origin in signals.forever() {
        let mut s = state.lock();
        match &s.child {
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
                if let Some(report) = &s.report {
                    let _ = report.send(origin.signal);
                }
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
    {
        // Decided under the state lock: once the main thread has cleared the command's
        // pid (it exited), `lost` no longer changes, and is read without joining this
        // thread. A loss found after the command's exit is the main thread's to report.
        let s = state.lock();
        if s.child.is_none() {
            return;
        }
        lost.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let send = |sig: Signal| {
        if let Some(child) = &state.lock().child {
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
    fn start(name: &str, quiet: bool, lock: &DistributedLock) -> StatusLine {
        let none = StatusLine {
            stop: None,
            thread: None,
        };
        if quiet || !std::io::stderr().is_terminal() {
            return none;
        }
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let lock = lock.clone();
        let name = name.to_owned();
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
