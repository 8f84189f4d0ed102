//! Signals: the ones `dlm` handles ([`Signals`]), the state shared with the thread that
//! handles them ([`ChildState`]), and that thread: before the lock is held a signal ends
//! the wait; then it is forwarded to the command.

use std::sync::Arc;
use std::thread;

use crossbeam_channel::Sender;
use dlm_core::{Interrupter, interrupt_pair};
use parking_lot::Mutex;
use rustix::process::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;

use super::child::Child;
use crate::exit::{self, Failure};

/// The signals forwarded to the command (and that end a wait for the lock).
const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// The signal that ended a wait or is forwarded, shared with the signal thread.
#[derive(Default)]
pub(super) struct ChildState {
    /// The running command, until it has exited (then never signalled again: its pid
    /// could be another process's).
    pub(super) child: Option<Child>,
    /// A signal received before the command ran (it ends the wait).
    received: Option<i32>,
    /// `dlm hold`: where the signals received while no command runs are reported.
    report: Option<Sender<i32>>,
}

/// The signals `dlm` gets, and the thread that handles them: before the lock is held they
/// end the wait; then `dlm run` forwards them to the command, and `dlm hold` gets them on
/// `report`. The handlers are installed at once ([`Signals::new`]); the thread starts
/// when something needs it ([`Signals::start_thread`]): before a wait (it interrupts it),
/// or, for `dlm run -n`, after the command started (a signal that came before is found by
/// [`Signals::take_pending`], or forwarded once the thread runs), so that the command's
/// start does not wait for a thread's.
pub(crate) struct Signals {
    pub(super) state: Arc<Mutex<ChildState>>,
    pub(super) interrupt: dlm_core::Interrupt,
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
            .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot handle signals: {e}")))?;
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
            .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot start a thread: {e}")))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Before the thread runs: notes a signal received so far (it ends the run as one
    /// that ended a wait does). Whether there was one.
    pub(super) fn take_pending(&mut self) -> bool {
        let Some(signals) = &mut self.signals else {
            return false;
        };
        if let Some(origin) = signals.pending().next() {
            self.state.lock().received.get_or_insert(origin.signal);
        }
        self.state.lock().received.is_some()
    }

    /// Ends the forwarding thread's wait without joining it: nothing is forwarded after
    /// the command's exit.
    pub(super) fn close(&self) {
        self.handle.close();
    }

    pub(crate) fn stop(self) {
        self.handle.close();
        if let Some(thread) = self.thread {
            let _ = thread.join();
        }
    }

    /// The status for a wait ended by a signal: 128 + its number.
    pub(super) fn interrupted(&self, name: &str) -> Failure {
        let signal = self.state.lock().received.unwrap_or(SIGTERM);
        Failure::new(
            u8::try_from(128 + signal).unwrap_or(u8::MAX),
            format!("interrupted while waiting for {name:?}"),
        )
    }
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
