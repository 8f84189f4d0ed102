//! The watchdog's renewal rounds on [`RedisBackend`]: every due hold of a client, of
//! every kind, pipelined per node and sent to every node at once through the fan-out.

use std::sync::Arc;
use std::time::Instant;

use dlm_core::backend::{
    BackendError, BackendErrorKind, Claim, Lease, LockBackend, Renewal, Renewed,
};

use super::RedisBackend;
use crate::fanout::Late;
use crate::node::Node;
use crate::protocol::Call;
use crate::topology::Redirect;

impl RedisBackend {
    /// [`LockBackend::extend_many`](dlm_core::backend::LockBackend::extend_many): see its
    /// description on the implementation.
    pub(super) fn renew_many(&self, renewals: &[Renewal<'_>], renewed: &mut Renewed<'_>) {
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, r) in renewals.iter().enumerate() {
            match self.node_of_renewal(r) {
                Ok(node) => match nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
                    Some(g) => groups[g].push(i),
                    None => {
                        nodes.push(node);
                        groups.push(vec![i]);
                    }
                },
                Err(e) => renewed(i, Err(e)),
            }
        }
        if nodes.is_empty() {
            return;
        }
        let wait = self.inner.options.replica_wait;
        let start = Instant::now();
        let options = &self.inner.options;
        // A round waits for a node at most a quarter of the shortest lease it renews (and
        // never past the request deadline): a stopped master then fails its own renewals
        // (retried sooner by the watchdog while their leases last) without holding up the
        // next round of every other master's.
        let budget = renewals
            .iter()
            .map(|r| r.ttl / 4)
            .min()
            .unwrap_or_default()
            .min(options.connect_timeout + options.io_timeout);
        // Reported from inside the fan-out, as each node's reply is read.
        let sink = std::cell::RefCell::new(renewed);
        let replies = self.inner.fanout.call_all(
            &nodes,
            start + budget,
            None,
            None,
            |g, node| {
                let calls = groups[g]
                    .iter()
                    .map(|&i| self.renewal_call(node, &renewals[i]));
                Call::batch(calls.chain(wait.map(Call::wait)))
            },
            |node, call, reply| {
                let mut values = node.reader().values(reply, call.len())?;
                let acked = match wait {
                    Some(_) => match values.pop() {
                        Some(redis::Value::Int(n)) => {
                            Some(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
                        }
                        _ => Some(0),
                    },
                    None => None,
                };
                let g = nodes
                    .iter()
                    .position(|n| std::ptr::eq(&**n, node))
                    .expect("a node of this round");
                for (&i, value) in groups[g].iter().zip(values) {
                    let result = self.renewal(node, &renewals[i], value, acked, start);
                    (sink.borrow_mut())(i, result);
                }
                Ok(())
            },
            // Every node's answer is needed: each serves its own holds.
            |_| false,
            Late::Drop,
        );
        let renewed = sink.into_inner();
        for ((node, group), reply) in nodes.iter().zip(&groups).zip(replies.replies) {
            if let Some(Ok(())) = reply {
                continue;
            }
            let e = reply.and_then(Result::err).unwrap_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    format!(
                        "{}: no answer to the renewals within {budget:?}",
                        node.endpoint,
                    ),
                )
            });
            for &i in group {
                renewed(i, Err(e.duplicate()));
            }
        }
    }

    /// The node that serves `r`'s hold now: the lock key's, or the group resource's hash's.
    fn node_of_renewal(&self, r: &Renewal<'_>) -> Result<Arc<Node>, BackendError> {
        match r.claim {
            Claim::Exclusive => self.node_of(r.name),
            claim => self
                .inner
                .target
                .node(|| self.inner.keys.claim_slot(r.name, claim)),
        }
    }

    /// The request that renews `r` (the mutex's extend script, or the claim script's).
    fn renewal_call(&self, node: &Node, r: &Renewal<'_>) -> Call {
        match r.claim {
            Claim::Exclusive => node.keys.extend_call(r.name, r.owner, r.ttl),
            claim => self.claim_extend_call(r.name, claim, r.owner, r.ttl),
        }
    }

    /// What one renewal of a batch came to, from its reply (`acked`: how many replicas
    /// acknowledged the batch, when `WAIT` was asked for). A renewal the node refused
    /// with a cluster redirection (its slot moved) is sent again on its own, where the
    /// cluster says.
    fn renewal(
        &self,
        node: &Node,
        r: &Renewal<'_>,
        value: redis::Value,
        acked: Option<u32>,
        start: Instant,
    ) -> Result<Option<Lease>, BackendError> {
        if Redirect::of_value(&value).is_some() {
            return match r.claim {
                Claim::Exclusive => self.extend(r.name, r.owner, r.ttl),
                claim => self.claim_extend(r.name, claim, r.owner, r.ttl),
            };
        }
        let value = value.extract_error().map_err(|e| node.endpoint.error(&e))?;
        let ok = match r.claim {
            Claim::Exclusive => node.reader().flag(value)?,
            claim => node.reader().claim(r.name, claim, value)?.code == 1,
        };
        if let Some(w) = self.inner.options.replica_wait
            && ok
            && acked.unwrap_or(0) < w.replicas
        {
            // Renewed on the master only: a failover now could bring back the previous
            // lease, which the front keeps until a renewal replicates.
            return Err(node.not_replicated(w, acked, "the renewal"));
        }
        Ok(ok.then(|| self.lease(start, r.ttl)).flatten())
    }
}
