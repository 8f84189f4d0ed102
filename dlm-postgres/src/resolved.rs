//! What a builder resolved, below both the builder and the backend it builds.

use crate::conn::Connector;

/// What `build` resolved: the connections' settings and the backend's own.
pub(crate) struct Resolved {
    pub(crate) connector: Connector,
    /// Where the release hints are listened for.
    pub(crate) listen: Connector,
    pub(crate) schema: String,
    pub(crate) drift_factor: f64,
    pub(crate) pool_size: usize,
}
