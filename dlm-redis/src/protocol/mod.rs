//! The lock protocol: the requests dlm sends (the plain `SET NX`, the scripts of
//! `src/protocol/lua/`, `WAIT`), encoded from a lock's keys, and what their replies mean. Above
//! the connections; it runs nothing itself (the nodes do).

mod call;
mod fencing;
mod keys;
mod refusal;
mod release_id;
mod replies;
mod requests;

pub(crate) use call::{Call, ReplicaWait, Shape};
pub(crate) use fencing::token_of_id;
pub use keys::LockKeys;
pub(crate) use keys::{Keys, millis};
pub(crate) use refusal::Refusal;
pub(crate) use release_id::ReleaseId;
pub(crate) use replies::{NodeAcquire, NodeFence, ReplyReader, Step};
pub(crate) use requests::claim_member;
