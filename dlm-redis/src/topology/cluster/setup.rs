//! Redis Cluster at build: every seed asked for its view (`CLUSTER NODES`, `CLUSTER
//! SLOTS`); a server without cluster mode and seeds of two clusters are refused
//! (`InvalidArgument`), and the slot map is made from the first view.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use dlm_core::{BackendError, InvalidArgument};
use parking_lot::{Mutex, RwLock};

use super::{Cluster, SlotMap, cluster_slots};
use crate::conn::{Endpoint, Timeouts};
use crate::options::Options;
use crate::slot::SLOTS;

/// A seed's answer at build.
struct SeedView {
    seed: String,
    /// Its own node id, and every node id it knows (`CLUSTER NODES`).
    id: String,
    known: Vec<String>,
    slots: redis::Value,
}

impl Cluster {
    /// Asks every seed for its view; refuses a server without cluster mode and seeds of
    /// different clusters, then makes the map from the first view.
    pub(crate) fn connect(options: Options, seeds: &[String]) -> dlm_core::Result<Arc<Cluster>> {
        let bad = |field: &'static str, why: String| -> dlm_core::Error {
            InvalidArgument::new(field, why).into()
        };
        options.validate()?;
        if seeds.is_empty() {
            return Err(bad("seeds", "no seed URL".into()));
        }
        let (endpoints, tls) = options.endpoints(seeds)?;
        let t = options.timeouts();
        let mut views = Vec::new();
        let mut failed = Vec::new();
        for seed in &endpoints {
            match view(seed, t) {
                Ok(v) => views.push(v),
                Err(e) if e.message().contains("cluster support disabled") => {
                    return Err(bad(
                        "seeds",
                        format!(
                            "{seed} is not in cluster mode (cluster-enabled no): use RedisBackend::builder for a single server"
                        ),
                    ));
                }
                Err(e) => failed.push(e),
            }
        }
        let Some(first) = views.first() else {
            return Err(dlm_core::Error::Backend(
                failed.into_iter().next().expect("at least one seed"),
            ));
        };
        if let Some(other) = views[1..]
            .iter()
            .find(|v| !first.known.contains(&v.id) || !v.known.contains(&first.id))
        {
            return Err(bad(
                "seeds",
                format!(
                    "{} and {} belong to different clusters (neither knows the other's node id)",
                    first.seed, other.seed
                ),
            ));
        }
        let cluster = Arc::new_cyclic(|me| Cluster {
            options,
            seeds: endpoints,
            tls,
            map: RwLock::new(SlotMap {
                nodes: HashMap::new(),
                slots: vec![None; SLOTS],
            }),
            refreshed: Mutex::new(Some(Instant::now())),
            me: me.clone(),
        });
        let seed = cluster
            .seeds
            .iter()
            .find(|s| s.to_string() == first.seed)
            .expect("the view of a seed")
            .clone();
        cluster
            .apply(&seed, &first.slots)
            .map_err(dlm_core::Error::Backend)?;
        Ok(cluster)
    }
}

/// What a seed says about itself and its cluster.
fn view(seed: &Endpoint, t: Timeouts) -> Result<SeedView, BackendError> {
    let mut con = seed.connect(t)?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut con)
        .map_err(|e| seed.error(&e))?;
    let mut id = String::new();
    let mut known = Vec::new();
    for line in nodes.lines() {
        let mut fields = line.split(' ');
        let (Some(node_id), _, Some(flags)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if flags.split(',').any(|f| f == "myself") {
            id = node_id.to_owned();
        }
        known.push(node_id.to_owned());
    }
    let slots = cluster_slots(&mut con, seed)?;
    Ok(SeedView {
        seed: seed.to_string(),
        id,
        known,
        slots,
    })
}
