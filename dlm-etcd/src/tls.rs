//! TLS for `https://` members: the settings ([`TlsOptions`](dlm_core::tls::TlsOptions))
//! and their loading into the rustls `ClientConfig` that the gateway's HTTP agent and the
//! watch stream share are dlm-core's (`dlm_core::tls`, shared with dlm-redis); here, the
//! watch stream's TLS connection and what a TLS failure means.

use std::io;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;

pub(crate) use dlm_core::tls::speaks_tls;

/// The rustls error somewhere in `e`'s chain of sources, if any.
pub(crate) fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(io) = err.downcast_ref::<io::Error>()
            && let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cur = err.source();
    }
    None
}

/// What a TLS failure means, in words, for an error message (certificate errors name
/// the problem; nothing secret is in them).
pub(crate) fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("the member did not answer with TLS (a plain-HTTP port? use http://): {e}")
        }
        _ => e.to_string(),
    }
}

/// A TLS client connection over `tcp` to `host` (`host:port` as in the member URL),
/// handshake not yet made (the first read or write makes it).
pub(crate) fn client(
    config: &Arc<ClientConfig>,
    host: &str,
    tcp: std::net::TcpStream,
) -> io::Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(name.to_owned()).map_err(io::Error::other)?;
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}
