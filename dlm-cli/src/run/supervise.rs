//! The command under the lock: started with the lock's variables, its signals forwarded,
//! stopped by the lost-lock watcher if the lock is lost while it runs, then the release
//! and the run's exit status.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use dlm_core::{Error, HoldState};
use parking_lot::Mutex;
use rustix::process::{Pid, Signal};

use super::Held;
use super::child::{Child, Keeper, cannot_run, child_command, in_the_terminals_foreground};
use super::signals::{ChildState, Signals};
use super::{OnLost, RunArgs, token};
use crate::exit::{self, Failure};

/// Runs the command while `guard` holds the lock (or permit, or read or write hold);
/// stops it if the hold is lost.
pub(super) fn run_child(
    args: &RunArgs,
    guard: Held,
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
            .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot start a thread: {e}")))?
    };

    // Wait without reaping first, so that nobody signals a reaped (reusable) pid.
    let _ = rustix::process::waitid(
        rustix::process::WaitId::Pid(pid),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
    );
    state.lock().child = None;
    let status = child
        .wait()
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot wait for the command: {e}")))?;
    // The keeper goes (its exit is reaped after the release, which it does not delay).
    let keeper = keeper.map(Keeper::kill);
    signals.close();
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
