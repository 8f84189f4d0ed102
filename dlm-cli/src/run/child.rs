//! The command's process and how it dies with `dlm`: in a process group of its own, led
//! by a keeper shell that kills the group if `dlm` dies ([`Keeper`]), or, as the
//! terminal's foreground job, through `dlm __exec` and the parent-death signal ([`exec`]);
//! and how the command is signalled ([`Child`]).

use std::io::IsTerminal;
use std::process::{Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::process::{Pid, Signal};

use super::ExecArgs;
use crate::exit::{self, Failure};

/// The process `dlm run` started, and how to signal the command.
#[derive(Clone, Debug)]
pub(super) enum Child {
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
    pub(super) fn signal(&self, sig: Signal) {
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
pub(super) struct Ready(Mutex<Option<std::process::ChildStdout>>);

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
pub(super) struct Keeper {
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
    pub(super) fn group(&self) -> Pid {
        Pid::from_child(&self.process)
    }

    /// Ends the keeper (the group it leads lives on with what the command left running):
    /// SIGKILL, which it cannot outlive to read the end of its input when `dlm` exits.
    /// Returns the process, to reap.
    pub(super) fn kill(mut self) -> std::process::Child {
        let _ = self.process.kill();
        self.process
    }

    /// Ends the keeper and reaps it.
    pub(super) fn end(self) {
        let _ = self.kill().wait();
    }
}

/// Whether `dlm` is the foreground job of the terminal on its stdin: then the command
/// stays in `dlm`'s process group, so that it can read the terminal and gets Ctrl-C from
/// it. Anywhere else (cron, scripts, pipelines, services) it gets a group of its own.
pub(super) fn in_the_terminals_foreground() -> bool {
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
pub(super) fn child_command(
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

pub(super) fn cannot_run(program: &str, e: &std::io::Error) -> Failure {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        exit::NOT_FOUND
    } else {
        exit::CANNOT_EXECUTE
    };
    Failure::new(code, format!("cannot run {program:?}: {e}"))
}
