//! The transport: a socket (TCP, unix or TLS over TCP) that speaks RESP2, the bottom
//! layer of every connection dlm opens. It knows nothing of locks, pools or topologies.

mod resp;
mod tls;
mod wire;

pub use dlm_core::tls::TlsOptions;
pub(crate) use resp::Resp;
pub(crate) use resp::words;
pub(crate) use tls::TlsTarget;
pub(crate) use wire::{Wire, is_tls_error};
