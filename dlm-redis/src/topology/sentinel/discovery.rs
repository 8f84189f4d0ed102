//! Finding a Sentinel deployment's master: the sentinels asked in turn, the answer
//! cached until something casts doubt on it, `ROLE` checked on each new connection, and a
//! generation bumped when the answer changes (see [`Discovery`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dlm_core::{BackendError, BackendErrorKind};
use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo};
use rustls::ClientConfig;

use crate::conn::{Endpoint, Locate, Timeouts};
use crate::transport::TlsOptions;
use crate::transport::{TlsTarget, Wire};

/// A master's address, as the sentinels give it.
pub(super) type Addr = (String, u16);

/// The sentinels of one master group, and what they last said.
pub(super) struct Discovery {
    master_name: String,
    sentinels: Vec<Endpoint>,
    /// The data nodes' credentials and database (the address is the sentinels' answer).
    template: ConnectionInfo,
    /// For a deployment behind TLS (the sentinels' URLs are `rediss://`): the data nodes
    /// are reached over TLS too, verified against the name the options give or the host
    /// the sentinels name.
    tls: Option<(Arc<ClientConfig>, TlsOptions)>,
    current: Mutex<Option<Addr>>,
    /// Set when the current answer is in doubt: the next connection asks again.
    suspect: AtomicBool,
    generation: AtomicU64,
}

impl Discovery {
    /// The sentinels of the group `master_name`, whose master is reached with
    /// `template`'s credentials and database (and over TLS with `tls`). Nothing is asked
    /// yet: the first connection asks.
    pub(super) fn new(
        master_name: String,
        sentinels: Vec<Endpoint>,
        template: ConnectionInfo,
        tls: Option<(Arc<ClientConfig>, TlsOptions)>,
    ) -> Discovery {
        Discovery {
            master_name,
            sentinels,
            template,
            tls,
            current: Mutex::new(None),
            suspect: AtomicBool::new(true),
            generation: AtomicU64::new(0),
        }
    }

    /// Changes whenever the master's address does: connections made before are stale.
    pub(super) fn current_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Something went wrong on a connection to the master: ask the sentinels again before
    /// the next connection.
    pub(super) fn suspect(&self) {
        self.suspect.store(true, Ordering::Release);
    }

    /// After a transient failure of a request made in `generation`: asks the sentinels
    /// again and says whether the master has moved since (the request can go to the new
    /// one).
    fn master_moved_since(&self, generation: u64, t: Timeouts) -> bool {
        if self.current_generation() == generation {
            self.suspect();
            let _ = self.lookup(t);
        }
        self.current_generation() != generation
    }

    /// The endpoint of the master, whichever server that is now: each new connection
    /// asks (or remembers) where it is.
    pub(super) fn endpoint(self: &Arc<Self>) -> Endpoint {
        Endpoint::located(
            self.template.clone(),
            format!("master {:?} (sentinel)", self.master_name),
            self.clone(),
        )
    }

    /// The name of the master group.
    pub(super) fn master_name(&self) -> &str {
        &self.master_name
    }

    /// Every sentinel's answer (for the check at build), with the sentinel's name.
    pub(super) fn ask_all(&self, t: Timeouts) -> Vec<(String, Result<Option<Addr>, BackendError>)> {
        self.sentinels
            .iter()
            .map(|s| (s.to_string(), self.ask(s, t)))
            .collect()
    }

    /// One sentinel's answer: the master's address, or `None` if it does not know the
    /// name.
    fn ask(&self, sentinel: &Endpoint, t: Timeouts) -> Result<Option<Addr>, BackendError> {
        let mut con = sentinel.connect(t)?;
        let reply: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query(&mut con)
            .map_err(|e| sentinel.error(&e))?;
        reply
            .map(|(host, port)| {
                port.parse().map(|p| (host, p)).map_err(|_| {
                    BackendError::new(
                        BackendErrorKind::Protocol,
                        format!("{sentinel}: the master's port is not a number"),
                    )
                })
            })
            .transpose()
    }

    /// The first answer of the sentinels in turn (a sentinel that is down or does not
    /// know the name is skipped).
    pub(super) fn lookup(&self, t: Timeouts) -> Result<Addr, BackendError> {
        let mut why = Vec::new();
        for sentinel in &self.sentinels {
            match self.ask(sentinel, t) {
                Ok(Some(addr)) => {
                    self.remember(addr.clone());
                    return Ok(addr);
                }
                Ok(None) => why.push(format!("{sentinel}: does not know it")),
                Err(e) => why.push(e.to_string()),
            }
        }
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "no sentinel names a master {:?} ({})",
                self.master_name,
                why.join("; ")
            ),
        ))
    }

    /// Takes `addr` as the master's address now (a new one bumps the generation), and
    /// no longer in doubt.
    pub(super) fn remember(&self, addr: Addr) {
        let mut current = self.current.lock();
        if current.as_ref() != Some(&addr) {
            if let Some((h, p)) = current.as_ref() {
                log::warn!(
                    "redis sentinel: master {:?} moved from {h}:{p} to {}:{}",
                    self.master_name,
                    addr.0,
                    addr.1
                );
            }
            *current = Some(addr);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.suspect.store(false, Ordering::Release);
    }

    /// A connection to the master, authenticated and checked with `ROLE`, and the
    /// generation it belongs to.
    fn connect_master(&self, t: Timeouts) -> Result<(Wire, u64), BackendError> {
        let mut asked = false;
        loop {
            let cached = (!self.suspect.load(Ordering::Acquire))
                .then(|| self.current.lock().clone())
                .flatten();
            let addr = match cached {
                Some(addr) => addr,
                None => {
                    asked = true;
                    self.lookup(t)?
                }
            };
            let generation = self.current_generation();
            match self.connect_to(&addr, t) {
                Ok(con) => return Ok((con, generation)),
                Err(e) => {
                    self.suspect();
                    // The cached answer may be old: ask once, then give up for now (the
                    // caller retries within its deadline).
                    if asked {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn connect_to(&self, (host, port): &Addr, t: Timeouts) -> Result<Wire, BackendError> {
        let display = format!("{host}:{port} (master {:?})", self.master_name);
        let info = self
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.clone(), *port));
        let tls = match &self.tls {
            Some((config, options)) => Some(TlsTarget {
                config: config.clone(),
                name: options.name_to_verify(host).map_err(|e| {
                    BackendError::new(BackendErrorKind::Tls, format!("{display}: {e}"))
                })?,
            }),
            None => None,
        };
        let mut con = Wire::connect(&info, tls.as_ref(), t.connect, t.io)
            .map_err(|e| crate::conn::map_error(&e, &display))?;
        let role: redis::Value = redis::cmd("ROLE")
            .query(&mut con)
            .map_err(|e| crate::conn::map_error(&e, &display))?;
        let is_master = matches!(&role, redis::Value::Array(parts)
            if matches!(parts.first(), Some(redis::Value::BulkString(r)) if r == b"master"));
        if !is_master {
            return Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("{display}: not a master (a failover under way?)"),
            ));
        }
        Ok(con)
    }
}

impl fmt::Debug for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Discovery")
            .field("master_name", &self.master_name)
            .field("sentinels", &self.sentinels)
            .field("current", &*self.current.lock())
            .finish_non_exhaustive()
    }
}

impl Locate for Discovery {
    fn connect(&self, t: Timeouts) -> Result<(Wire, u64), BackendError> {
        self.connect_master(t)
    }

    fn generation(&self) -> u64 {
        self.current_generation()
    }

    fn moved_since(&self, generation: u64, t: Timeouts) -> bool {
        self.master_moved_since(generation, t)
    }

    /// A failure casts doubt on the master's address (the next connection asks the
    /// sentinels again), and `READONLY` (the server was demoted) is `Unavailable`:
    /// retried, by then against the new master.
    fn failed(&self, err: BackendError) -> BackendError {
        match err.kind() {
            BackendErrorKind::ReadOnly => {
                self.suspect();
                BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!(
                        "{}: no longer the master; asking the sentinels again",
                        err.message()
                    ),
                )
            }
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout => {
                self.suspect();
                err
            }
            _ => err,
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::IntoConnectionInfo;

    use super::*;

    /// A `READONLY` refusal on a connection to the master (the server was demoted and
    /// the connection survived) is `Unavailable`, which the front retries, and makes the
    /// next connection ask the sentinels again; on a plain endpoint it stays `ReadOnly`.
    #[test]
    fn readonly_is_retried_and_casts_doubt_on_the_master() {
        let template = "redis://127.0.0.1/".into_connection_info().unwrap();
        let discovery = Arc::new(Discovery::new("m".into(), Vec::new(), template, None));
        discovery.remember(("127.0.0.1".into(), 6379));
        assert!(!discovery.suspect.load(Ordering::Acquire));
        let readonly =
            redis::parse_redis_value(b"-READONLY You can't write against a read only replica.\r\n")
                .unwrap()
                .extract_error()
                .unwrap_err();
        let endpoint = discovery.endpoint();
        let e = endpoint.error(&readonly);
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
        assert!(e.is_transient());
        assert!(discovery.suspect.load(Ordering::Acquire));

        let plain = Endpoint::new(
            crate::conn::ParsedUrl::parse("redis://127.0.0.1:6379/").unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(plain.error(&readonly).kind(), BackendErrorKind::ReadOnly);
    }
}
