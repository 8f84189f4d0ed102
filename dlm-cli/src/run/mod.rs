//! `dlm run`: acquire, run the command as a child, stop it if the lock is lost, release.
//!
//! This file holds the arguments (`dlm run`'s, the lock settings it shares with `dlm hold`,
//! `dlm __exec`'s), their checks before any I/O, and the run from start to release. The
//! acquisition is in `acquire` (what it takes, the lock, a permit or a read or write hold,
//! in `resource`), the signals in `signals`, the command's process (its
//! keeper and process group, `dlm __exec`) in `child`, and the command's run under the
//! lock, the lost-lock watcher and the run's status in `supervise`.

mod acquire;
mod child;
mod resource;
mod signals;
mod supervise;

use std::time::Duration;

use clap::{Args, ValueEnum};
use dlm_core::LockName;

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};

pub(crate) use acquire::{acquire, lock_for, token};
pub(crate) use child::exec;
pub(crate) use resource::{Held, Kind, Resource};
pub(crate) use signals::Signals;

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
    /// Take one of N permits of the semaphore NAME instead of the lock NAME: at most N
    /// holders at once (as `consul lock -n N`). Every holder gives the same N (it is
    /// fixed while any permit is held; another count is refused, exit 2).
    #[arg(long, value_name = "N", value_parser = permits, conflicts_with_all = ["shared", "exclusive", "elect"])]
    permits: Option<u32>,
    /// Take a read hold of the read-write lock NAME: shared with other --shared holders,
    /// never beside an --exclusive one (as `flock -s`). A waiting --exclusive goes first.
    #[arg(long, conflicts_with_all = ["exclusive", "elect"])]
    shared: bool,
    /// Take the write hold of the read-write lock NAME: no other --shared or --exclusive
    /// holder beside it (as `flock -x`). NOT the lock of plain `dlm run NAME`: the lock
    /// NAME, the semaphore NAME and the read-write lock NAME are three separate resources.
    #[arg(long, conflicts_with = "elect")]
    exclusive: bool,
    /// Campaign in the election NAME instead of taking the lock NAME: the command runs as
    /// its leader (others wait as candidates), and publishes --value for `dlm leader NAME`
    /// to show. DLM_FENCING_TOKEN is the term. Not on Redlock (an election is the
    /// semaphore NAME of 1 permit).
    #[arg(long)]
    elect: bool,
    /// How `dlm status` names this holder (default: HOST:PID); with --elect, the value the
    /// leader publishes (an address, a host name). Kept with permits, read and write holds
    /// and leads; 1 to 256 bytes, no control characters.
    #[arg(long, visible_alias = "value", value_name = "TEXT")]
    pub(crate) label: Option<String>,
}

impl LockArgs {
    /// What is taken: the lock, a permit, a read or a write hold.
    pub(crate) fn kind(&self) -> Kind {
        if self.elect {
            return Kind::Lead;
        }
        match (self.permits, self.shared, self.exclusive) {
            (Some(n), _, _) => Kind::Permits(n),
            (None, true, _) => Kind::Shared,
            (None, false, true) => Kind::Exclusive,
            (None, false, false) => Kind::Lock,
        }
    }
}

/// A permit count: 1 or more.
pub(crate) fn permits(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a semaphore needs at least 1 permit".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of permits (1 or more)")),
    }
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
    let status = match got {
        Ok(guard) => supervise::run_child(args, guard, &mut signals, &command, lease),
        Err(code) => Ok(code),
    };
    lock.flush_releases();
    status
}
