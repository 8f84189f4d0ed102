//! How the connect workers of a round hand their connections back to its caller: a
//! channel, and an eventfd that the caller's `poll` watches beside the sockets.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use dlm_core::backend::{BackendError, BackendErrorKind};
use parking_lot::Mutex;
use rustix::event::{EventfdFlags, eventfd};

use super::{InFlight, Replies, Round};

/// What a connect worker hands back to the caller.
// Sent once per connect through a channel, never stored in bulk: boxing the connection
// would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Delivery {
    Sent(InFlight),
    Failed(usize, BackendError),
}

/// How a round's connect workers reach its caller: a channel, and an eventfd that the
/// caller's `poll` watches beside the sockets.
pub(super) struct Pickup {
    pub(super) state: Arc<Mutex<Round>>,
    pub(super) tx: Sender<Delivery>,
    pub(super) rx: Receiver<Delivery>,
    pub(super) wake: Arc<OwnedFd>,
    /// The nodes whose worker has not delivered yet.
    pub(super) connecting: Vec<usize>,
}

impl Pickup {
    pub(super) fn new(nodes: usize) -> Result<Pickup, BackendError> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Other,
                format!("cannot make an eventfd: {e}"),
            )
        })?;
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok(Pickup {
            state: Arc::new(Mutex::new(Round {
                over: false,
                outstanding: (0..nodes).map(|_| None).collect(),
            })),
            tx,
            rx,
            wake: Arc::new(wake),
            connecting: Vec::new(),
        })
    }

    /// Takes what the workers have delivered.
    pub(super) fn collect<T>(&mut self, flying: &mut Vec<InFlight>, replies: &mut Replies<T>) {
        while let Ok(delivery) = self.rx.try_recv() {
            let i = match delivery {
                Delivery::Sent(inflight) => {
                    let i = inflight.i;
                    flying.push(inflight);
                    i
                }
                Delivery::Failed(i, e) => {
                    replies.replies[i] = Some(Err(e));
                    i
                }
            };
            self.connecting.retain(|&c| c != i);
        }
    }
}

pub(super) fn signal(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

pub(super) fn clear(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(fd, &mut buf);
}
