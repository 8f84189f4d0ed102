//! Redis Sentinel: finding the master of a monitored group through its sentinels, and
//! finding it again after a failover.
//!
//! The lock connections of a Sentinel-mode `RedisBackend` go to
//! whichever server the sentinels name as the master. Every new connection asks for it
//! (the answer is cached until something casts doubt on it) and checks with `ROLE` that
//! the server is a master, as the Sentinel client guidelines ask. Doubt comes from a
//! `READONLY` reply (the server was demoted), a connection failure or a timeout; a changed
//! answer bumps a generation, and pooled connections of an older generation are dropped
//! instead of being reused.
//!
//! Here: [`Sentinel`], the topology's part, which ties the folder's files together (none
//! of them imports it): `discovery.rs` (asking the sentinels, `ROLE`, generations),
//! `watcher.rs` (the thread that asks every 0.5 s), `journal.rs` (the releases sent
//! again to a new master), `setup.rs` (the checks at build).

mod discovery;
mod journal;
mod setup;
mod watcher;

use std::sync::{Arc, Weak};

use dlm_core::backend::{BackendError, Claim, LockName, OwnerToken};

pub(crate) use setup::MasterAuth;

use self::journal::Journal;
use self::watcher::Watcher;
use crate::node::Node;
use crate::options::Options;

/// A Sentinel deployment as a backend's topology: the master's node (whose endpoint finds
/// the master through the sentinels on each connect), the journal of the releases made
/// lately, and the watcher that sends them again to each new master.
pub(crate) struct Sentinel {
    /// The master, whichever server that is now.
    pub(crate) node: Arc<Node>,
    journal: Journal,
    /// Stopped and joined when the topology is dropped.
    _watcher: Option<Watcher>,
}

impl Sentinel {
    /// The master of `master_name` that the `sentinels` (URLs) name, reached with
    /// `master`'s credentials and database: checks the settings and asks every sentinel
    /// once (`setup.rs`), then starts the watcher, which sends the journal again to each
    /// new master. The watcher holds the topology weakly: once it is dropped, nothing is
    /// sent.
    pub(crate) fn connect(
        master_name: &str,
        sentinels: &[String],
        master: &MasterAuth,
        options: &Options,
    ) -> dlm_core::Result<Arc<Sentinel>> {
        let (node, discovery) = setup::master(master_name, sentinels, master, options)?;
        Ok(Arc::new_cyclic(|me: &Weak<Sentinel>| {
            let me = me.clone();
            Sentinel {
                node,
                journal: Journal::default(),
                _watcher: Watcher::start(&discovery, options.timeouts(), move |_| {
                    if let Some(sentinel) = me.upgrade() {
                        sentinel.journal.release_again(&sentinel.node);
                    }
                }),
            }
        }))
    }

    /// Runs `release`, a release of `owner`'s `claim` hold of `name` on the master that
    /// says whether it released; one that did is journaled with the generation of the
    /// master's address it was sent in, to be sent again to a later master if this one
    /// was being replaced (see [`Journal`]).
    pub(crate) fn journaled(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        release: impl FnOnce() -> Result<bool, BackendError>,
    ) -> Result<bool, BackendError> {
        let generation = self.node.endpoint.generation();
        let released = release()?;
        if released {
            self.journal.record(name, claim, owner, generation);
        }
        Ok(released)
    }
}
