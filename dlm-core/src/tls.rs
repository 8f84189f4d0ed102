//! TLS settings shared by the backends that speak TLS (feature `tls`): what users give
//! ([`TlsOptions`]: CA, client certificate, name to verify), loaded into a rustls
//! `ClientConfig` (ring provider), written once for dlm-redis (`rediss://`) and dlm-etcd
//! (`https://`), which re-export [`TlsOptions`].
//!
//! Nothing of TLS is written here: the handshake, records and certificate checks are
//! rustls's and webpki's. This module reads PEM files, picks roots and maps errors. The
//! loading functions (`TlsOptions::load`, `TlsOptions::name_to_verify`, `speaks_tls`) are
//! for backends and hidden from the documentation: their rustls types follow the rustls
//! version of this crate, which is not part of dlm's semver.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::InvalidArgument;

/// How to reach servers given with a TLS scheme (`rediss://`, `https://`): which
/// certificate authorities to trust, the client's own certificate for mutual TLS, and the
/// name to verify.
///
/// TLS is switched on by the URL's scheme; these options only say how. With none given, a
/// server's certificate is checked against the system's root certificates and the URL's
/// host. The backends re-export this type (`dlm_redis::TlsOptions`,
/// `dlm_etcd::TlsOptions`) and take it in their builders' `tls` setting.
///
/// ```
/// use dlm_core::tls::TlsOptions;
///
/// let tls = TlsOptions::new()
///     .ca_file("/etc/dlm/ca.pem")
///     .client_cert("/etc/dlm/client.pem", "/etc/dlm/client.key");
/// // e.g. RedisBackend::builder("rediss://redis.internal:6380/").tls(tls)
/// # let _ = tls;
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
    /// usually signs the members' certificates) or a managed service's CA bundle needs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (a PEM file: the certificate, then any
    /// intermediates) with its private key (PEM: PKCS#8, PKCS#1 or SEC1), for servers that
    /// require mutual TLS (Redis's `tls-auth-clients yes`, etcd's `--client-cert-auth`).
    pub fn client_cert(mut self, cert_chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert_chain.into(), key.into()));
        self
    }

    /// Verify the servers' certificates for this name instead of the URL's host: for
    /// servers reached through an address their certificate does not name (an IP address,
    /// a tunnel, a load balancer). Applies to every TLS server of the backend.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = Some(name.to_owned());
        self
    }

    /// **Turns certificate verification off**: the connection is encrypted, but anyone on
    /// the path can pose as the server and read every lock request and password. For a
    /// test set-up only. Logged at `warn` when the backend is built.
    pub fn dangerously_skip_verification(mut self) -> Self {
        self.skip_verification = true;
        self
    }

    /// For backends (hidden: its rustls types follow this crate's rustls version, outside
    /// dlm's semver): reads the files and builds the rustls configuration (no network
    /// I/O). `server` names what a skipped verification lets anyone pose as, for the
    /// warning ("the Redis server", "an etcd member"). With [`server_name`](Self::server_name),
    /// certificates are verified for that name whatever name the connection is made with.
    #[doc(hidden)]
    pub fn load(&self, server: &str) -> Result<Arc<ClientConfig>, InvalidArgument> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("the TLS provider", &e))?;
        let algorithms = provider.signature_verification_algorithms;
        let builder = if self.skip_verification {
            log::warn!(
                "TLS certificate verification is OFF (TlsOptions::dangerously_skip_verification): anyone on the network path can pose as {server}"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(algorithms)))
        } else if let Some(name) = &self.server_name {
            let name = checked_name(name)?;
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

    /// For backends (hidden, as [`load`](Self::load)): the name to send (SNI) and verify
    /// for a server at `host`: the configured [`server_name`](Self::server_name), or `host`.
    #[doc(hidden)]
    pub fn name_to_verify(&self, host: &str) -> Result<ServerName<'static>, InvalidArgument> {
        checked_name(self.server_name.as_deref().unwrap_or(host))
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

/// For backends (hidden): whether the server at `addr` answers a TLS ClientHello with a TLS
/// record: asked only after a plain connection was dropped or closed without a reply, to
/// tell "this is a TLS port" from any other reset. The hello is made by rustls (no
/// certificate is checked: nothing is sent but the hello).
#[doc(hidden)]
pub fn speaks_tls(addr: &std::net::SocketAddr, timeout: Duration) -> bool {
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
    let probe = || -> std::io::Result<bool> {
        let mut tcp = std::net::TcpStream::connect_timeout(addr, timeout)?;
        tcp.set_read_timeout(Some(timeout))?;
        tcp.set_write_timeout(Some(timeout))?;
        let name = ServerName::try_from("dlm.invalid").expect("a valid DNS name");
        let mut conn =
            rustls::ClientConnection::new(PROBE.clone(), name).map_err(std::io::Error::other)?;
        while conn.wants_write() {
            conn.write_tls(&mut tcp)?;
        }
        let mut first = [0u8; 1];
        Ok(tcp.read(&mut first)? == 1 && first[0] == 0x16)
    };
    probe().unwrap_or(false)
}

fn checked_name(name: &str) -> Result<ServerName<'static>, InvalidArgument> {
    ServerName::try_from(name.to_owned()).map_err(|_| {
        InvalidArgument::new(
            "tls",
            format!("{name:?} is not a DNS name or IP address a certificate can be checked for"),
        )
    })
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
/// configured name instead of the one the connection was made with (an HTTP client
/// always passes the URL's host).
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
