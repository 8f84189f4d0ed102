//! TLS for `https://` members, with rustls (ring provider, as dlm-redis): the settings
//! users give ([`TlsOptions`]), loaded once per backend into a rustls `ClientConfig` that
//! the gateway's HTTP agent and the watch stream share.
//!
//! Nothing of TLS is written here: the handshake, records and certificate checks are
//! rustls's and webpki's. This file reads PEM files, picks roots and maps errors.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dlm_core::InvalidArgument;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How to reach members given as `https://` URLs: which certificate authorities to trust,
/// the client's own certificate for mutual TLS, and the name to verify.
///
/// TLS is switched on by the URL's scheme (`https://`); these options only say how. With
/// none given, a member's certificate is checked against the system's root certificates
/// and the URL's host.
///
/// ```no_run
/// use dlm_etcd::{EtcdBackend, TlsOptions};
///
/// let backend = EtcdBackend::builder(&["https://etcd-1.internal:2379"])
///     .tls(
///         TlsOptions::new()
///             .ca_file("/etc/dlm/ca.pem")
///             .client_cert("/etc/dlm/client.pem", "/etc/dlm/client.key"),
///     )
///     .build()?;
/// # Ok::<(), dlm_core::InvalidArgument>(())
/// ```
#[derive(Clone, Default)]
pub struct TlsOptions {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    server_name: Option<String>,
    skip_verification: bool,
}

impl TlsOptions {
    /// The defaults: the system's root certificates, no client certificate, the URL's
    /// host as the name to verify.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the certificate authorities in this PEM file (one or more certificates)
    /// instead of the system's roots: what a private CA (etcd's `--trusted-ca-file`
    /// usually signs the members' certificates) needs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (a PEM file: the certificate, then any
    /// intermediates) with its private key (PEM: PKCS#8, PKCS#1 or SEC1), for members
    /// that require mutual TLS (`--client-cert-auth`).
    pub fn client_cert(mut self, cert_chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert_chain.into(), key.into()));
        self
    }

    /// Verify the members' certificates for this name instead of the URL's host: for
    /// members reached through an address their certificate does not name (an IP address,
    /// a tunnel, a load balancer). Applies to every `https://` member of the backend.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = Some(name.to_owned());
        self
    }

    /// **Turns certificate verification off**: the connection is encrypted, but anyone on
    /// the path can pose as a member and read every lock request and password. For a
    /// test set-up only. Logged at `warn` when the backend is built.
    pub fn dangerously_skip_verification(mut self) -> Self {
        self.skip_verification = true;
        self
    }

    /// Reads the files and builds the rustls configuration. No network I/O.
    pub(crate) fn load(&self) -> Result<Arc<ClientConfig>, InvalidArgument> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("the TLS provider", &e))?;
        let algorithms = provider.signature_verification_algorithms;
        let builder = if self.skip_verification {
            log::warn!(
                "TLS certificate verification is OFF (TlsOptions::dangerously_skip_verification): anyone on the network path can pose as an etcd member"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(algorithms)))
        } else if let Some(name) = &self.server_name {
            let name = ServerName::try_from(name.clone()).map_err(|_| {
                InvalidArgument::new(
                    "tls",
                    format!(
                        "{name:?} is not a DNS name or IP address a certificate can be checked for"
                    ),
                )
            })?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider)
                    .build()
                    .map_err(|e| invalid("ca_file", &e))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Renamed { webpki, name }))
        } else {
            builder.with_root_certificates(self.roots()?)
        };
        let config = match &self.client_cert {
            Some((chain, key)) => {
                let chain = certificates(chain, "client_cert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    InvalidArgument::new(
                        "client_cert",
                        format!("no private key read from {}: {e}", key.display()),
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid("client_cert", &e))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    fn roots(&self) -> Result<RootCertStore, InvalidArgument> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for cert in certificates(path, "ca_file")? {
                    roots
                        .add(cert)
                        .map_err(|e| invalid("ca_file", &format!("{}: {e}", path.display())))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(InvalidArgument::new(
                        "tls",
                        "no system root certificate found; give the CA with TlsOptions::ca_file",
                    ));
                }
            }
        }
        Ok(roots)
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert.as_ref().map(|(c, _)| c))
            .field("server_name", &self.server_name)
            .field("skip_verification", &self.skip_verification)
            .finish()
    }
}

/// The certificates of a PEM file; at least one.
fn certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, InvalidArgument> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| InvalidArgument::new(what, format!("reading {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(InvalidArgument::new(
            what,
            format!("{}: no PEM certificate in the file", path.display()),
        ));
    }
    Ok(certs)
}

fn invalid(what: &'static str, e: &dyn fmt::Display) -> InvalidArgument {
    InvalidArgument::new(what, e.to_string())
}

/// The verifier behind [`TlsOptions::server_name`]: webpki's own checks, for the
/// configured name instead of the URL's host (the HTTP client always passes the host).
#[derive(Debug)]
struct Renamed {
    webpki: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for Renamed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _host: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.webpki
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The verifier behind [`TlsOptions::dangerously_skip_verification`]: any certificate is
/// accepted; the handshake's signatures are still checked (by rustls's own functions), so
/// the connection is encrypted to whoever answered.
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

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

/// Whether the server at `addr` answers a TLS ClientHello with a TLS record: asked only
/// after a plain connection was closed without a reply, to tell "this is a TLS port"
/// from a member that went down. The hello is made by rustls (no certificate is checked:
/// nothing is sent but the hello).
pub(crate) fn speaks_tls(addr: &std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    use std::io::Read;
    static PROBE: std::sync::LazyLock<Arc<ClientConfig>> = std::sync::LazyLock::new(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(algorithms)))
                .with_no_client_auth(),
        )
    });
    let probe = || -> io::Result<bool> {
        let mut tcp = std::net::TcpStream::connect_timeout(addr, timeout)?;
        tcp.set_read_timeout(Some(timeout))?;
        tcp.set_write_timeout(Some(timeout))?;
        let name = ServerName::try_from("etcd.invalid").expect("a valid DNS name");
        let mut conn =
            rustls::ClientConnection::new(PROBE.clone(), name).map_err(io::Error::other)?;
        while conn.wants_write() {
            conn.write_tls(&mut tcp)?;
        }
        let mut first = [0u8; 1];
        Ok(tcp.read(&mut first)? == 1 && first[0] == 0x16)
    };
    probe().unwrap_or(false)
}
