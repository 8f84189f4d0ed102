//! Interrupting blocked lock waits (Java's `Thread.interrupt` for `lockInterruptibly`).

use std::fmt;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

/// Creates a connected pair: the [`Interrupter`] fires, every clone of the [`Interrupt`]
/// sees it.
///
/// ```
/// let (interrupter, interrupt) = dlm_core::interrupt_pair();
/// assert!(!interrupt.is_interrupted());
/// interrupter.interrupt();
/// assert!(interrupt.is_interrupted());
/// ```
pub fn interrupt_pair() -> (Interrupter, Interrupt) {
    let (tx, rx) = crossbeam_channel::bounded(0);
    (
        Interrupter {
            sender: Arc::new(Mutex::new(Some(tx))),
        },
        Interrupt { receiver: rx },
    )
}

/// The sending side of an interrupt. Cloning shares it.
///
/// Interrupting is permanent and reaches every waiter at once (it closes a channel).
/// Dropping the last clone also interrupts: nobody could interrupt any more, and a
/// dropped cancellation handle is how a scope says "stop".
#[derive(Clone)]
pub struct Interrupter {
    sender: Arc<Mutex<Option<Sender<()>>>>,
}

impl Interrupter {
    /// Interrupts every wait that uses the paired [`Interrupt`], now and later.
    pub fn interrupt(&self) {
        self.sender.lock().take();
    }
}

impl fmt::Debug for Interrupter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interrupter")
            .field("interrupted", &self.sender.lock().is_none())
            .finish()
    }
}

/// The receiving side of an interrupt, passed to the `*_interruptibly` operations.
/// Cloning is cheap.
#[derive(Clone)]
pub struct Interrupt {
    receiver: Receiver<()>,
}

impl Interrupt {
    /// An interrupt that never fires.
    pub fn never() -> Self {
        Interrupt {
            receiver: crossbeam_channel::never(),
        }
    }

    /// `true` once the [`Interrupter`] fired (or was dropped).
    pub fn is_interrupted(&self) -> bool {
        matches!(self.receiver.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// The channel that disconnects on interrupt, for use in `crossbeam_channel::select!`.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.receiver
    }
}

impl fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interrupt")
            .field("interrupted", &self.is_interrupted())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_last_interrupter_interrupts() {
        let (a, i) = interrupt_pair();
        let b = a.clone();
        drop(a);
        assert!(!i.is_interrupted());
        drop(b);
        assert!(i.is_interrupted());
    }

    #[test]
    fn never_stays_quiet() {
        let i = Interrupt::never();
        assert!(!i.is_interrupted());
    }
}
