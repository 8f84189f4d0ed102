//! Connections: where a server is ([`Endpoint`], [`Locate`]), pooled connections to it
//! ([`Manager`], [`Conn`]) and its errors, typed ([`map_error`]). Above the transport;
//! below the protocol, the nodes and the topologies.

mod endpoint;
mod errors;
mod pool;

pub(crate) use endpoint::{Endpoint, Locate, ParsedUrl, Timeouts};
pub(crate) use errors::map_error;
pub(crate) use pool::{Conn, Manager};
