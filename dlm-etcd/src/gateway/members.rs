//! That every member answering belongs to one etcd cluster (`header.cluster_id`).

use std::sync::atomic::Ordering;

use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

use super::Gateway;

impl Gateway {
    /// Once, at first use: asks every member for its status (at once, each within the
    /// timeouts) and fails if those that answer are not all of one cluster. A member that
    /// does not answer now is checked by [`same_cluster`](Self::same_cluster) on its
    /// first reply.
    pub(super) fn check_members(&self) -> Result<(), BackendError> {
        let why = self.members_checked.get_or_init(|| {
            if self.members.len() < 2 {
                return None;
            }
            let ids: Vec<Option<u64>> = std::thread::scope(|scope| {
                let asks: Vec<_> = (0..self.members.len())
                    .map(|i| {
                        scope.spawn(move || {
                            let body =
                                self.send_as(i, "/v3/maintenance/status", "{}", None).ok()?;
                            let v: Value = serde_json::from_str(&body).ok()?;
                            cluster_id(&v)
                        })
                    })
                    .collect();
                asks.into_iter().map(|a| a.join().ok().flatten()).collect()
            });
            let mut first: Option<(usize, u64)> = None;
            for (i, id) in ids.iter().enumerate() {
                let Some(id) = *id else { continue };
                match first {
                    None => first = Some((i, id)),
                    Some((j, known)) if known != id => {
                        return Some(foreign(&self.members[i], id, &self.members[j], known));
                    }
                    Some(_) => {}
                }
            }
            if let Some((_, id)) = first {
                self.cluster_id.store(id, Ordering::Relaxed);
            }
            None
        });
        match why {
            None => Ok(()),
            Some(why) => Err(BackendError::new(BackendErrorKind::Protocol, why.clone())),
        }
    }

    /// Fails when member `i`'s reply comes from another cluster than the first reply seen.
    pub(super) fn same_cluster(&self, i: usize, reply: &Value) -> Result<(), BackendError> {
        let Some(id) = cluster_id(reply) else {
            return Ok(());
        };
        match self
            .cluster_id
            .compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(known) if known == id => Ok(()),
            Err(known) => Err(BackendError::new(
                BackendErrorKind::Protocol,
                foreign(&self.members[i], id, "the other members", known),
            )),
        }
    }
}

/// A reply's `header.cluster_id` (a decimal string in the JSON).
fn cluster_id(reply: &Value) -> Option<u64> {
    reply
        .pointer("/header/cluster_id")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .filter(|&id| id != 0)
}

/// The message for a member of another cluster.
fn foreign(member: &str, id: u64, other: &str, known: u64) -> String {
    format!(
        "{member} belongs to another etcd cluster (cluster_id {id:x}) than {other} \
         (cluster_id {known:x}): list the members of one cluster"
    )
}
