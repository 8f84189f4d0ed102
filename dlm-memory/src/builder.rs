//! [`MemoryBackendBuilder`]: a store's clock and fencing.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Clock, Faults, Inner, MemoryBackend, Store};

/// Configures a [`MemoryBackend`]. Created by [`MemoryBackend::builder`].
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) fencing: bool,
}

impl MemoryBackendBuilder {
    /// The clock expiry follows. Defaults to [`SystemClock`](crate::SystemClock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Whether acquisitions carry fencing tokens (1, 2, 3, ... for the whole store, so
    /// each name's tokens increase, with gaps where other names took some). Defaults to
    /// `true`.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryBackend {
        MemoryBackend {
            inner: Arc::new(Inner {
                clock: self.clock,
                fencing: self.fencing,
                store: Mutex::new(Store::default()),
                faults: Faults::default(),
            }),
        }
    }
}
