//! Connections: where a server is ([`Endpoint`], [`Locate`]), pooled connections to it
//! ([`Manager`], [`Conn`]) and its errors, typed ([`map_error`]). Above the transport;
//! below the protocol, the nodes and the topologies.

mod background;
mod endpoint;
mod errors;
mod pool;
mod worker;

pub(crate) use background::Background;
pub(crate) use endpoint::{Endpoint, Locate, ParsedUrl, Timeouts};
pub(crate) use errors::map_error;
pub(crate) use pool::{Conn, Pool, Pooled};
pub(crate) use worker::{ConnectWorker, Job};
