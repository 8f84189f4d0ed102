//! TLS for `rediss://` servers, with rustls (ring provider): the settings users give
//! ([`TlsOptions`]), loaded once per backend into a rustls `ClientConfig`.
//!
//! Nothing of TLS is written here: the handshake, records and certificate checks are
//! rustls's and webpki's. This file reads PEM files, picks roots and maps errors.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dlm_core::InvalidArgument;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use std::io;
use std::net::TcpStream;
use std::time::Instant;

use redis::{ErrorKind, RedisError, RedisResult};
use rustls::{ClientConnection, StreamOwned};

/// How to reach servers given as `rediss://` URLs: which certificate authorities to trust,
/// the client's own certificate for mutual TLS, and the name to verify.
///
/// TLS is switched on by the URL's scheme (`rediss://`); these options only say how. With
/// none given, a `rediss://` server's certificate is checked against the system's root
/// certificates and the URL's host.
///
/// ```no_run
/// use dlm_redis::{RedisBackend, TlsOptions};
///
/// let backend = RedisBackend::builder("rediss://redis.internal:6380/")
///     .tls(
///         TlsOptions::new()
///             .ca_file("/etc/dlm/ca.pem")
///             .client_cert("/etc/dlm/client.pem", "/etc/dlm/client.key"),
///     )
///     .build()?;
/// # Ok::<(), dlm_core::Error>(())
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
    /// instead of the system's roots: what a private CA or a managed service's CA bundle
    /// needs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (a PEM file: the certificate, then any
    /// intermediates) with its private key (PEM: PKCS#8, PKCS#1 or SEC1), for servers that
    /// require mutual TLS (`tls-auth-clients yes`).
    pub fn client_cert(mut self, cert_chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert_chain.into(), key.into()));
        self
    }

    /// Verify the servers' certificates for this name instead of the URL's host: for
    /// servers reached through an address their certificate does not name (an IP address,
    /// a tunnel, a load balancer). Applies to every `rediss://` server of the backend.
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

    /// Reads the files and builds the rustls configuration. No network I/O.
    pub(crate) fn load(&self) -> Result<Arc<ClientConfig>, InvalidArgument> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("the TLS provider", &e))?;
        let builder = if self.skip_verification {
            log::warn!(
                "TLS certificate verification is OFF (TlsOptions::dangerously_skip_verification): anyone on the network path can pose as the Redis server"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(
                    provider.signature_verification_algorithms,
                )))
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

    /// The name to verify for a server at `host`.
    pub(crate) fn name_to_verify(
        &self,
        host: &str,
    ) -> Result<ServerName<'static>, InvalidArgument> {
        let name = self.server_name.as_deref().unwrap_or(host);
        ServerName::try_from(name.to_owned()).map_err(|_| {
            InvalidArgument::new(
                "tls",
                format!(
                    "{name:?} is not a DNS name or IP address a certificate can be checked for"
                ),
            )
        })
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

/// Whether the server at `addr` answers a TLS ClientHello with a TLS record: asked only
/// after a plain connection was dropped at its first request, to tell "this is a TLS
/// port" from any other reset. The hello is made by rustls (no certificate is checked:
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
    let probe = || -> std::io::Result<bool> {
        let mut tcp = std::net::TcpStream::connect_timeout(addr, timeout)?;
        tcp.set_read_timeout(Some(timeout))?;
        tcp.set_write_timeout(Some(timeout))?;
        let name = ServerName::try_from("redis.invalid").expect("a valid DNS name");
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

/// Whether the server at `addr` answers a plain `PING` with a RESP reply: asked only after
/// a TLS handshake timed out, to tell "this is a plain port" (a Redis plain port waits for
/// the end of a line that a TLS hello never sends) from a stopped server.
pub(crate) fn speaks_resp(addr: &std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    use std::io::{Read, Write};
    let probe = || -> std::io::Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut tcp = std::net::TcpStream::connect_timeout(addr, timeout)?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        tcp.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut first = [0u8; 1];
        Ok(tcp.read(&mut first)? == 1 && b"+-".contains(&first[0]))
    };
    probe().unwrap_or(false)
}

/// What a TLS failure means, in words, for an error message (certificate errors name
/// the problem; nothing secret is in them).
pub(crate) fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("the server did not answer with TLS (a plain-TCP port? use redis://): {e}")
        }
        _ => e.to_string(),
    }
}

/// Runs the TLS handshake on `tcp`, done by `deadline`. A server that has not said a
/// word by half the time left is asked, on a second connection within the rest, whether
/// it speaks plain RESP (a plain Redis port waits for the end of a line, so it never
/// answers a ClientHello): then the error says to use `redis://`, within the connect
/// timeout, instead of a timeout.
/// Where a TLS connection goes: the loaded configuration and the name to verify.
#[derive(Clone, Debug)]
pub(crate) struct TlsTarget {
    pub(crate) config: Arc<ClientConfig>,
    pub(crate) name: ServerName<'static>,
}

pub(crate) fn handshake(
    mut tcp: TcpStream,
    target: &TlsTarget,
    deadline: Instant,
) -> RedisResult<StreamOwned<ClientConnection, TcpStream>> {
    let mut conn = ClientConnection::new(target.config.clone(), target.name.clone())
        .map_err(|e| tls_error(&e))?;
    let first_word_by = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
    let mut heard = false;
    while conn.is_handshaking() {
        let until = if heard { deadline } else { first_word_by };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(handshake_timeout(&tcp, deadline));
        }
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        match conn.complete_io(&mut tcp) {
            Ok((read, _)) => heard |= read > 0,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "TLS",
                    "the server closed the connection during the TLS handshake (not a TLS port, or it refused our client certificate)".to_owned(),
                )));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(handshake_timeout(&tcp, deadline));
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// A handshake that got no answer: a plain Redis port (it waits for the end of a line),
/// or a server that answers nothing at all (stopped), which stays a timeout.
pub(crate) fn handshake_timeout(tcp: &TcpStream, deadline: Instant) -> RedisError {
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() && tcp.peer_addr().is_ok_and(|a| speaks_resp(&a, left)) {
        return RedisError::from((
            ErrorKind::Client,
            "TLS",
            "the server does not speak TLS on this port (it answers plain RESP): use a redis:// URL, or its TLS port".to_owned(),
        ));
    }
    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out").into()
}

/// A TLS failure as a `RedisError` that `conn::map_error` types as TLS.
pub(crate) fn tls_error(e: &rustls::Error) -> RedisError {
    RedisError::from((ErrorKind::Client, "TLS", describe(e)))
}

/// An I/O error, or the TLS failure inside it.
pub(crate) fn io_error(e: io::Error) -> RedisError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => tls_error(tls),
        None => e.into(),
    }
}
