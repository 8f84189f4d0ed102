//! Redis Cluster's redirections: read from a node's refusals (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`), and followed for every request of a master's node (the cluster is
//! their [`Router`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::{BackendError, BackendErrorKind};

use super::Cluster;
use crate::node::{Node, Router, Try};

/// The most redirections one request follows.
const MAX_REDIRECTS: usize = 16;

/// What a cluster node's refusal asks the client to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The slot is served by `addr` now.
    Moved { slot: u16, addr: String },
    /// This one request goes to `addr`, after `ASKING` (the slot is being migrated there).
    Ask { addr: String },
    /// `TRYAGAIN` (a multi-key request during a migration) or `CLUSTERDOWN`: later.
    Retry,
}

impl Redirect {
    /// The redirection a refusal with error `code` and the words `detail` asks for, if
    /// any.
    fn of(code: &str, detail: Option<&str>) -> Option<Redirect> {
        match code {
            "MOVED" | "ASK" => {
                let mut words = detail?.split_ascii_whitespace();
                let slot: u16 = words.next()?.parse().ok()?;
                let addr = words.next()?.to_owned();
                Some(if code == "MOVED" {
                    Redirect::Moved { slot, addr }
                } else {
                    Redirect::Ask { addr }
                })
            }
            "TRYAGAIN" | "CLUSTERDOWN" => Some(Redirect::Retry),
            _ => None,
        }
    }

    /// The redirection a reply (a server error kept as a value) asks for, if any.
    pub(crate) fn of_value(v: &redis::Value) -> Option<Redirect> {
        match v {
            redis::Value::ServerError(e) => Redirect::of(e.code(), e.details()),
            _ => None,
        }
    }
}

impl Router for Cluster {
    /// Runs `attempt` on `first` (the slot's master when the request was made), following
    /// the redirections it reports: `MOVED` updates the map, `ASK` goes once to the
    /// importing node after `ASKING`, `TRYAGAIN` and `CLUSTERDOWN` are retried after a
    /// short pause within the I/O timeout (without `retry`, they fail the request at
    /// once). Any other refusal is the request's answer.
    fn route(
        &self,
        first: &Node,
        retry: bool,
        attempt: &mut dyn FnMut(&Node, bool) -> Try,
    ) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.options.io_timeout;
        let mut pause = Duration::from_millis(2);
        let mut other: Option<Arc<Node>> = None;
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let node = other.as_deref().unwrap_or(first);
            let refusal = match attempt(node, asking) {
                Try::Answered(None) => return Ok(()),
                Try::Answered(Some(refusal)) => refusal,
                Try::Unreachable(e) => {
                    // Down or unreachable: a failover may have moved its slots.
                    if e.is_transient() {
                        self.refresh();
                    }
                    return Err(e);
                }
            };
            let Some(redirect) = Redirect::of(&refusal.code, refusal.detail.as_deref()) else {
                return Ok(());
            };
            // How the refusal is named in errors: by its code, except one kept as a
            // reply's value (a plain `SET`'s), named by its kind; so such a `CLUSTERDOWN`
            // does not read the map again below.
            let said = if refusal.in_value {
                "TRYAGAIN or CLUSTERDOWN"
            } else {
                refusal.code.as_str()
            };
            if redirect == Redirect::Retry && !retry {
                return Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("{}: {said}", node.endpoint),
                ));
            }
            if matches!(redirect, Redirect::Moved { .. } | Redirect::Ask { .. }) {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!(
                            "redis cluster: more than {MAX_REDIRECTS} redirections for one request"
                        ),
                    ));
                }
            }
            match redirect {
                Redirect::Moved { slot, addr } => {
                    log::debug!("{}: slot {slot} moved to {addr}", node.endpoint);
                    other = Some(self.moved(node, slot, &addr)?);
                    asking = false;
                    self.refresh();
                }
                Redirect::Ask { addr } => {
                    other = Some(self.node_at(node, &addr)?);
                    asking = true;
                }
                // The same request again, to the same node, the same way (with `ASKING`
                // if it was asked there).
                Redirect::Retry => {
                    let now = Instant::now();
                    if now + pause > deadline {
                        return Err(BackendError::new(
                            BackendErrorKind::Unavailable,
                            format!(
                                "{}: still refused after {:?} ({said})",
                                node.endpoint, self.options.io_timeout,
                            ),
                        ));
                    }
                    if said == "CLUSTERDOWN" {
                        self.refresh();
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_read_from_errors_and_values() {
        assert_eq!(
            Redirect::of("MOVED", Some("3999 127.0.0.1:6381")),
            Some(Redirect::Moved {
                slot: 3999,
                addr: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            Redirect::of("ASK", Some("3999 :6381")),
            Some(Redirect::Ask {
                addr: ":6381".into()
            })
        );
        assert_eq!(Redirect::of("TRYAGAIN", None), Some(Redirect::Retry));
        assert_eq!(
            Redirect::of("CLUSTERDOWN", Some("The cluster is down")),
            Some(Redirect::Retry)
        );
        assert_eq!(Redirect::of("MOVED", Some("nonsense")), None);
        assert_eq!(Redirect::of("ERR", Some("3999 127.0.0.1:6381")), None);
    }
}
