//! Sentinel at build: the settings checked and every sentinel asked once (an unknown
//! master name and sentinels that disagree are `InvalidArgument`), giving the master's
//! node.

use std::sync::Arc;

use dlm_core::InvalidArgument;
use redis::IntoConnectionInfo;

use super::discovery::{Addr, Discovery};
use crate::conn::Timeouts;
use crate::node::Node;
use crate::options::{Options, invalid};

/// The data nodes' credentials and database (the sentinels' own are in their URLs).
#[derive(Default)]
pub(crate) struct MasterAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: Option<i64>,
}

/// The node of the master of `master_name` that the `sentinels` (URLs) name, reached with
/// `master`'s credentials and database, and its [`Discovery`]: checks the settings and
/// asks every sentinel once (see [`check`]).
pub(super) fn master(
    master_name: &str,
    sentinels: &[String],
    master: &MasterAuth,
    options: &Options,
) -> dlm_core::Result<(Arc<Node>, Arc<Discovery>)> {
    let bad = |field: &'static str, why: &str| invalid(InvalidArgument::new(field, why));
    options.validate().map_err(invalid)?;
    if master_name.is_empty() || master_name.len() > 256 {
        return Err(bad("master_name", "must be 1 to 256 bytes"));
    }
    if sentinels.is_empty() {
        return Err(bad("sentinels", "no sentinel URL"));
    }
    let (endpoints, tls) = options.endpoints(sentinels).map_err(invalid)?;
    let tls_urls = sentinels
        .iter()
        .filter(|u| u.to_ascii_lowercase().starts_with("rediss://"))
        .count();
    if tls_urls != 0 && tls_urls != sentinels.len() {
        return Err(bad(
            "sentinels",
            "some sentinel URLs are rediss:// and some are not: a deployment uses TLS everywhere or nowhere",
        ));
    }
    let mut settings = "redis://127.0.0.1/"
        .into_connection_info()
        .expect("a valid URL")
        .redis_settings()
        .clone()
        .set_db(master.db.unwrap_or(0));
    if let Some(user) = &master.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &master.password {
        settings = settings.set_password(password);
    }
    let template = "redis://127.0.0.1/"
        .into_connection_info()
        .expect("a valid URL")
        .set_redis_settings(settings);
    let discovery = Arc::new(Discovery::new(
        master_name.to_owned(),
        endpoints,
        template,
        tls,
    ));
    check(&discovery, options.timeouts())?;
    Ok((
        Arc::new(Node::new(discovery.endpoint(), options)),
        discovery,
    ))
}

/// At build: at least one sentinel answers, they know the master's name, and those
/// that answer agree on its address.
fn check(discovery: &Discovery, t: Timeouts) -> Result<(), dlm_core::Error> {
    let answers = discovery.ask_all(t);
    let mut known: Vec<(Addr, Vec<String>)> = Vec::new();
    let mut unknown = Vec::new();
    let mut failed = Vec::new();
    for (sentinel, answer) in answers {
        match answer {
            Ok(Some(addr)) => match known.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, who)) => who.push(sentinel),
                None => known.push((addr, vec![sentinel])),
            },
            Ok(None) => unknown.push(sentinel),
            Err(e) => failed.push(e),
        }
    }
    if known.is_empty() && unknown.is_empty() {
        // Nobody answered: the first error says why (credentials, TLS, down).
        let first = failed.into_iter().next().expect("at least one sentinel");
        return Err(dlm_core::Error::Backend(first));
    }
    if known.is_empty() {
        return Err(InvalidArgument::new(
            "master_name",
            format!(
                "the sentinels ({}) do not know a master named {:?}",
                unknown.join(", "),
                discovery.master_name()
            ),
        )
        .into());
    }
    if known.len() > 1 || !unknown.is_empty() {
        let mut views: Vec<String> = known
            .iter()
            .map(|((h, p), who)| format!("{h}:{p} by {}", who.join(", ")))
            .collect();
        if !unknown.is_empty() {
            views.push(format!("unknown to {}", unknown.join(", ")));
        }
        return Err(InvalidArgument::new(
            "sentinels",
            format!(
                "the sentinels disagree about master {:?}: {}",
                discovery.master_name(),
                views.join("; ")
            ),
        )
        .into());
    }
    discovery.remember(known.remove(0).0);
    Ok(())
}
