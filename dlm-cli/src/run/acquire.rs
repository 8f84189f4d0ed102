//! Taking the lock: the client built from the lock settings and the resource it takes
//! ([`lock_for`]: the lock, a permit, a read or write hold), the acquisition (`-n`, `-w`, or a wait that a signal ends: [`acquire`]), the fencing token
//! drawn for the command ([`token`]), and the status line shown while waiting on a terminal.

use std::io::{IsTerminal, Write};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};
use dlm_core::{
    BackendErrorKind, DEFAULT_WATCHDOG_TIMEOUT, Error, LockGuard, LockName, RetryPolicy, TokenDraw,
};

use super::resource::{Held, Kind, Resource};
use super::{LockArgs, Signals};
use crate::backend::Connection;
use crate::exit::{self, Failure};

/// What `args` take of `name` (the lock, a permit, a read or write hold) on a client with
/// their lease settings, and the lease in force. A backend without that resource is
/// refused here, before anything runs.
pub(crate) fn lock_for(
    conn: &Connection,
    name: &LockName,
    args: &LockArgs,
) -> Result<(Resource, Duration), Failure> {
    // The command gets the token in its environment: drawn with the acquisition, one
    // round trip instead of two (a one-shot run has no earlier hold to predict from).
    let mut builder = conn.client().token_draw(TokenDraw::AtAcquisition);
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
    if let Some(label) = &args.label {
        builder = builder.label(label);
    }
    // dlm waits for the releases sent again in the background itself, once, before it
    // exits (`Resource::flush_releases`): the client's drop need not wait again.
    let mut retry = RetryPolicy::new().release_wait(Duration::ZERO);
    if let Some(wait) = args.wait {
        // Transient backend errors (unreachable, no quorum) are retried for the whole wait,
        // not only for the library's default 10 s.
        retry = retry.error_timeout(wait.max(retry.error_timeout_value()));
    }
    builder = builder.retry(retry);
    let client = builder
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let resource = Resource::new(conn, &client, name, args.kind())?;
    Ok((resource, lease))
}

/// Takes `lock` as `args` say (`-n`, `-w`, or waiting for it); a signal ends the wait.
/// `Ok(Err(status))` when it was not obtained (held by another owner).
pub(crate) fn acquire(
    conn: &Connection,
    name: &str,
    args: &LockArgs,
    quiet: bool,
    lock: &Resource,
    signals: &mut Signals,
) -> Result<Result<Held, u8>, Failure> {
    let acquire_error = |e: Error| match e {
        Error::Interrupted => signals.interrupted(name),
        // Another permit count is in use: a setting to fix, not a wait to retry.
        e if e.backend_kind() == Some(BackendErrorKind::Conflict) => Failure::new(
            exit::CONFIG,
            format!(
                "cannot take a permit of {name:?} ({}): {}; every holder must give the same --permits (the count is fixed while any permit is held)",
                conn.describe,
                e.backend()
                    .map_or("another permit count is in use", |b| b.message())
            ),
        ),
        e => Failure::from_lock_error(&format!("cannot acquire {name:?} ({})", conn.describe), &e),
    };
    // -n: one attempt. Otherwise the library's waiting calls, which retry transient
    // errors within the wait (a server that comes up late is waited for).
    let got = if args.no_wait {
        lock.try_once()
    } else {
        let status = StatusLine::start(name, quiet, lock);
        let got = lock.wait_for(args.wait, &signals.interrupt);
        drop(status);
        got
    };
    let Some(guard) = got.map_err(acquire_error)? else {
        log::info!(
            "{name:?} is held by another owner{}",
            match lock.kind() {
                Kind::Permits(n) => format!(" (all {n} permits are taken)"),
                _ => String::new(),
            }
        );
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

/// How long a wait lasts before the status line shows.
const STATUS_AFTER: Duration = Duration::from_millis(300);

/// The line on stderr while waiting on a terminal: what is waited for, and how long.
struct StatusLine {
    stop: Option<Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl StatusLine {
    fn start(name: &str, quiet: bool, lock: &Resource) -> StatusLine {
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
                // The holders and their longest lease (`Ok(Some)`), a free lock
                // (`Ok(None)`), or whether the backend failed transiently (`Err`), asked
                // every few seconds.
                let mut seen: Result<dlm_core::Holders, bool> = Err(false);
                let mut asked = Instant::now();
                let mut first = true;
                loop {
                    if first || asked.elapsed() >= Duration::from_secs(3) {
                        seen = lock.inspect().map_err(|e| {
                            e.backend()
                                .is_some_and(dlm_core::BackendError::is_transient)
                        });
                        asked = Instant::now();
                        first = false;
                    }
                    let holder = match &seen {
                        Ok(h) if h.is_free() => "free a moment ago".to_owned(),
                        Ok(h) => lock.holders_text(h, asked.elapsed()),
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
