//! A client's registry of hold states: one [`LockShared`] per name and kind of hold
//! (and per thread for the kinds several threads hold at once), shared by every live
//! handle and guard of it, and forgotten when the last one goes.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::backend::{Claim, LockName};
use crate::hold::{Forget, HoldKey, LockShared};
use crate::observe::Metrics;
use crate::settings::ClientShared;

/// The hold states of one client that a handle or guard keeps alive.
#[derive(Default)]
pub(crate) struct Registry {
    states: Mutex<HashMap<HoldKey, Weak<LockShared>>>,
}

impl Registry {
    /// The shared state of the lock called `name`: the one every live handle to it
    /// shares, or a new one.
    pub(crate) fn lock_state(
        self: &Arc<Self>,
        client: &Arc<ClientShared>,
        name: LockName,
    ) -> Arc<LockShared> {
        self.hold_state(client, HoldKey::new(name, Claim::Exclusive))
    }

    /// The shared state of the holds `key` names, as [`lock_state`](Self::lock_state).
    pub(crate) fn hold_state(
        self: &Arc<Self>,
        client: &Arc<ClientShared>,
        key: HoldKey,
    ) -> Arc<LockShared> {
        let mut states = self.states.lock();
        if let Some(shared) = states.get(&key).and_then(Weak::upgrade) {
            return shared;
        }
        let name = key.name.clone();
        let prediction = client.predictions.slot(&name);
        let metrics = if client.metrics_lock_names {
            Arc::new(Metrics::register(
                client.backend.kind(),
                Some(name.as_str()),
            ))
        } else {
            client.metrics.clone()
        };
        let me: Weak<dyn Forget> = Arc::downgrade(self) as Weak<dyn Forget>;
        let shared = Arc::new(LockShared::new(
            client.clone(),
            me,
            key.clone(),
            metrics,
            prediction,
        ));
        states.insert(key, Arc::downgrade(&shared));
        shared
    }

    /// The shared state of `key` if a handle or guard keeps it alive (no new one).
    pub(crate) fn existing_state(&self, key: &HoldKey) -> Option<Arc<LockShared>> {
        self.states.lock().get(key).and_then(Weak::upgrade)
    }
}

impl Forget for Registry {
    fn forget(&self, key: &HoldKey, lock: *const LockShared) {
        let mut states = self.states.lock();
        if states.get(key).is_some_and(|w| w.as_ptr() == lock) {
            states.remove(key);
        }
    }
}
