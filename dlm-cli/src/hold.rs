//! `dlm hold`: takes a lock, prints it as shell assignments, keeps it (renewed) until its
//! standard input ends, its standard output's reader goes, or a signal, then releases it;
//! so that a shell script can hold a lock across several commands.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::thread;

use clap::Args;
use crossbeam_channel::{Sender, select};
use dlm_core::{Error, HoldState, LockName};

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};
use crate::run::{self, Held, LockArgs, Signals};

#[derive(Debug, Args)]
#[command(override_usage = "dlm hold [OPTIONS] NAME")]
pub(crate) struct HoldArgs {
    /// The lock's name (1 to 512 bytes, no control characters).
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

/// The lock's name, checked before any I/O.
pub(crate) fn check(args: &HoldArgs) -> Result<LockName, Failure> {
    LockName::new(&args.name).map_err(|e| Failure::usage(format!("bad lock name: {}", e.reason())))
}

/// Why a hold ends.
enum End {
    /// Standard input reached its end, or standard output's reader is gone.
    Closed(&'static str),
    /// A signal (its number).
    Signal(i32),
    /// The lock was lost (a renewal found it gone, or its lease ran out).
    Lost,
}

pub(crate) fn hold(conn: &Connection, args: &HoldArgs) -> Result<u8, Failure> {
    let name = check(args)?;
    let (lock, lease) = run::lock_for(conn, &name, &args.lock)?;
    let (report, signalled) = crossbeam_channel::unbounded();
    let mut signals = Signals::start(Some(report))?;
    let result = run::acquire(
        conn,
        &args.name,
        &args.lock,
        args.backend.quiet,
        &lock,
        &mut signals,
    )
    .and_then(|got| match got {
        Ok(guard) => {
            let line = assignments(&args.name, run::token(&guard), lease.as_millis());
            held(&args.name, guard, &line, &signalled)
        }
        Err(code) => Ok(code),
    });
    signals.stop();
    lock.flush_releases();
    result
}

/// `DLM_LOCK_NAME='…' DLM_FENCING_TOKEN=… DLM_LEASE_MS=…`: one line that `eval` turns into
/// shell variables (the name single-quoted; the token empty without fencing).
fn assignments(name: &str, token: Option<u64>, lease_ms: u128) -> String {
    let token = token.map(|t| t.to_string()).unwrap_or_default();
    format!(
        "DLM_LOCK_NAME={} DLM_FENCING_TOKEN={token} DLM_LEASE_MS={lease_ms}",
        quote(name)
    )
}

/// `s` single-quoted for a POSIX shell (a `'` becomes `'\''`).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Prints `line`, then keeps the lock until the hold ends, and releases it.
fn held(
    name: &str,
    guard: Held,
    line: &str,
    signalled: &crossbeam_channel::Receiver<i32>,
) -> Result<u8, Failure> {
    let (closed_tx, closed) = crossbeam_channel::bounded(1);
    let (lost_tx, lost) = crossbeam_channel::bounded(1);
    {
        // Ends with the hold (released or lost); not joined: the process exits after.
        let signal = guard.lost_signal();
        let spawned = thread::Builder::new()
            .name("dlm-lost".into())
            .spawn(move || {
                if signal.wait() == HoldState::Lost {
                    let _ = lost_tx.send(());
                }
            });
        if let Err(e) = spawned {
            drop(guard.unlock());
            return Err(Failure::new(
                exit::OS_ERROR,
                format!("cannot start a thread: {e}"),
            ));
        }
    }
    let mut out = std::io::stdout().lock();
    let printed = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(out);
    let end = match printed {
        // Nobody reads: the hold is over before it began.
        Err(e) => End::Closed(if e.kind() == std::io::ErrorKind::BrokenPipe {
            "standard output's reader is gone"
        } else {
            "standard output failed"
        }),
        Ok(()) => {
            // The watcher gets a clone: it returns at once when it watches nothing (a
            // file, /dev/null), and a dropped last sender would end the hold as if input
            // had ended. This one lives until the hold ends.
            let watcher_tx = closed_tx.clone();
            let watched = thread::Builder::new()
                .name("dlm-hold-io".into())
                .spawn(move || watch_io(&watcher_tx));
            if let Err(e) = watched {
                drop(guard.unlock());
                return Err(Failure::new(
                    exit::OS_ERROR,
                    format!("cannot start a thread: {e}"),
                ));
            }
            select! {
                recv(closed) -> why => End::Closed(why.unwrap_or("standard input ended")),
                recv(signalled) -> sig => End::Signal(sig.unwrap_or(signal_hook::consts::SIGTERM)),
                recv(lost) -> _ => End::Lost,
            }
        }
    };
    let code = match end {
        End::Lost => {
            drop(guard.unlock());
            return Err(Failure::new(
                exit::LOST,
                format!("the lock {name:?} was lost"),
            ));
        }
        End::Closed(why) => {
            log::info!("{why}: releasing {name:?}");
            0
        }
        End::Signal(sig) => {
            log::info!("signal {sig}: releasing {name:?}");
            u8::try_from(128 + sig).unwrap_or(u8::MAX)
        }
    };
    match guard.unlock() {
        Ok(()) => Ok(code),
        Err(Error::LockLost) => Err(Failure::new(
            exit::LOST,
            format!(
                "the lock {name:?} had been lost when it was released (it may not have been held throughout)"
            ),
        )),
        Err(e) => {
            log::warn!("{name:?}: releasing failed ({e}); the lock ends with its lease");
            Ok(code)
        }
    }
}

/// Sends on `closed` when standard input reaches its end (a pipe, a socket or a terminal:
/// Ctrl-D; a file or `/dev/null` is not watched) or standard output's reader goes (a pipe
/// or a socket). Input is read and dropped. Returns without sending when neither is
/// watched.
fn watch_io(closed: &Sender<&'static str>) {
    use rustix::event::{PollFd, PollFlags, poll};
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let watch_in = is_channel(&stdin, true);
    let watch_out = is_channel(&stdout, false);
    if !watch_in && !watch_out {
        return;
    }
    let (stdin_fd, stdout_fd) = (stdin.as_fd(), stdout.as_fd());
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = Vec::with_capacity(2);
        if watch_out {
            // No event asked: a pipe whose reader is gone reports POLLERR, a socket POLLHUP.
            fds.push(PollFd::new(&stdout_fd, PollFlags::empty()));
        }
        if watch_in {
            fds.push(PollFd::new(&stdin_fd, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        let (out_events, in_events) = match (watch_out, watch_in) {
            (true, true) => (fds[0].revents(), fds[1].revents()),
            (true, false) => (fds[0].revents(), PollFlags::empty()),
            (false, _) => (PollFlags::empty(), fds[0].revents()),
        };
        if out_events.intersects(PollFlags::ERR | PollFlags::HUP) {
            let _ = closed.send("standard output's reader is gone");
            return;
        }
        if !in_events.is_empty() {
            match rustix::io::read(stdin_fd, &mut buf) {
                Ok(0) => {
                    let _ = closed.send("standard input ended");
                    return;
                }
                Ok(_) | Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(_) => {
                    let _ = closed.send("standard input failed");
                    return;
                }
            }
        }
    }
}

/// Whether `fd` is a pipe or a socket (or, with `tty`, a terminal): something whose other
/// end can go away.
fn is_channel(fd: &impl AsFd, tty: bool) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(owned) = fd.as_fd().try_clone_to_owned() else {
        return false;
    };
    let file = std::fs::File::from(owned);
    if tty && file.is_terminal() {
        return true;
    }
    file.metadata()
        .is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_are_quoted_for_the_shell() {
        assert_eq!(
            assignments("it's $HOME `x`", Some(42), 30_000),
            r"DLM_LOCK_NAME='it'\''s $HOME `x`' DLM_FENCING_TOKEN=42 DLM_LEASE_MS=30000"
        );
        assert_eq!(
            assignments("a", None, 1000),
            "DLM_LOCK_NAME='a' DLM_FENCING_TOKEN= DLM_LEASE_MS=1000"
        );
    }
}
