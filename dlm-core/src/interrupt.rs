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
    let sender = Arc::new(Mutex::new(Some(tx)));
    (
        Interrupter {
            sender: sender.clone(),
        },
        Interrupt {
            receiver: rx,
            _sender: Some(sender),
        },
    )
}

/// The sending side of an interrupt. Cloning shares it.
///
/// Only [`interrupt`](Self::interrupt) fires, and it is permanent: it reaches every waiter
/// at once (it closes a channel). Dropping an `Interrupter`, even the last one, interrupts
/// nothing, so `let (_, interrupt) = interrupt_pair();` is harmless (an interrupt nobody
/// can fire). To interrupt when a scope ends, keep an [`on_drop`](Self::on_drop) guard.
#[derive(Clone)]
pub struct Interrupter {
    sender: Arc<Mutex<Option<Sender<()>>>>,
}

impl Interrupter {
    /// Interrupts every wait that uses the paired [`Interrupt`], now and later.
    pub fn interrupt(&self) {
        self.sender.lock().take();
    }

    /// A guard that interrupts when it is dropped: cancellation tied to a scope.
    ///
    /// ```
    /// let (interrupter, interrupt) = dlm_core::interrupt_pair();
    /// {
    ///     let _stop_on_exit = interrupter.on_drop();
    ///     assert!(!interrupt.is_interrupted());
    /// }
    /// assert!(interrupt.is_interrupted());
    /// ```
    #[must_use = "the guard interrupts when dropped: bind it to a named variable"]
    pub fn on_drop(self) -> InterruptOnDrop {
        InterruptOnDrop(self)
    }
}

/// Interrupts its [`Interrupter`] when dropped; from [`Interrupter::on_drop`].
#[derive(Debug)]
pub struct InterruptOnDrop(Interrupter);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        self.0.interrupt();
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
    /// Keeps the channel open after every `Interrupter` is gone: only `interrupt()`
    /// closes it.
    _sender: Option<Arc<Mutex<Option<Sender<()>>>>>,
}

impl Interrupt {
    /// An interrupt that never fires.
    pub fn never() -> Self {
        Interrupt {
            receiver: crossbeam_channel::never(),
            _sender: None,
        }
    }

    /// `true` once the [`Interrupter`] fired.
    pub fn is_interrupted(&self) -> bool {
        matches!(self.receiver.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// The channel that disconnects on interrupt, for the wait loop's `select!`.
    pub(crate) fn receiver(&self) -> &Receiver<()> {
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
    fn dropping_every_interrupter_interrupts_nothing() {
        let (a, i) = interrupt_pair();
        let b = a.clone();
        drop(a);
        drop(b);
        assert!(!i.is_interrupted());
        let (_, discarded) = interrupt_pair();
        assert!(!discarded.is_interrupted());
    }

    #[test]
    fn interrupt_reaches_every_clone_and_on_drop_fires_once_out_of_scope() {
        let (a, i) = interrupt_pair();
        let j = i.clone();
        a.interrupt();
        assert!(i.is_interrupted() && j.is_interrupted());
        let (b, k) = interrupt_pair();
        let guard = b.clone().on_drop();
        drop(b);
        assert!(!k.is_interrupted());
        drop(guard);
        assert!(k.is_interrupted());
    }

    #[test]
    fn never_stays_quiet() {
        let i = Interrupt::never();
        assert!(!i.is_interrupted());
    }
}
