//! Certificates for TLS tests, made when the test runs (rcgen): a test CA, server
//! certificates for `127.0.0.1` and `localhost` (a valid one, one for another name, an
//! expired one), a client certificate for mutual TLS, and a second CA that signed none of
//! them. Start a TLS server with
//! [`RedisServerBuilder::tls`](crate::redis_server::RedisServerBuilder::tls).
//!
//! ```no_run
//! use dlm_testkit::redis_server::RedisServer;
//! use dlm_testkit::tls::{ServerCert, TestPki};
//!
//! let pki = TestPki::new();
//! let server = RedisServer::builder().tls(&pki, ServerCert::Valid).spawn();
//! // server.tls_url() is rediss://127.0.0.1:<port>/; trust pki.ca_file().
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use tempfile::TempDir;

/// Which certificate a TLS test server presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerCert {
    /// Signed by the test CA for `127.0.0.1` and `localhost`, valid now.
    Valid,
    /// Signed by the test CA, but for `wrong.example` only.
    WrongName,
    /// Signed by the test CA for `127.0.0.1` and `localhost`, expired in 2020.
    Expired,
}

/// A test CA and the certificates it signed, as PEM files in a temp dir (removed on drop).
#[derive(Debug)]
pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    /// Generates every certificate and key (a few milliseconds).
    pub fn new() -> TestPki {
        let dir = crate::tempdirs::owned_tempdir("dlm-pki-")
            .expect("creating a temp dir for certificates");
        let path = dir.path();

        let ca_key = KeyPair::generate().expect("CA key");
        let params = ca_params("dlm test CA");
        let ca_cert = params.self_signed(&ca_key).expect("CA certificate");
        write(path, "ca.pem", &ca_cert.pem());
        let ca = Issuer::new(params, ca_key);

        let other_key = KeyPair::generate().expect("other CA key");
        let other = ca_params("another CA")
            .self_signed(&other_key)
            .expect("other CA");
        write(path, "other-ca.pem", &other.pem());

        let here = || vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        leaf(
            path,
            "server",
            here(),
            &ca,
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
        );
        leaf(
            path,
            "wrong-name",
            vec!["wrong.example".to_owned()],
            &ca,
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
        );
        leaf(
            path,
            "expired",
            here(),
            &ca,
            ExtendedKeyUsagePurpose::ServerAuth,
            true,
        );
        leaf(
            path,
            "client",
            vec!["dlm-client".to_owned()],
            &ca,
            ExtendedKeyUsagePurpose::ClientAuth,
            false,
        );
        TestPki { dir }
    }

    /// The test CA's certificate (PEM): trust it to accept the test servers.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA that signed none of the certificates here: trusting only it must fail.
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    /// The client certificate and its key (PEM), signed by the test CA.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        self.pair("client")
    }

    /// A server certificate and its key (PEM).
    pub fn server_cert(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        self.pair(match which {
            ServerCert::Valid => "server",
            ServerCert::WrongName => "wrong-name",
            ServerCert::Expired => "expired",
        })
    }

    fn pair(&self, name: &str) -> (PathBuf, PathBuf) {
        let dir = self.dir.path();
        (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        )
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params
}

/// Writes `name.pem` and `name.key`: a certificate for `names` signed by `ca`.
fn leaf(
    dir: &Path,
    name: &str,
    names: Vec<String>,
    ca: &Issuer<'_, KeyPair>,
    usage: ExtendedKeyUsagePurpose,
    expired: bool,
) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(names).expect("certificate parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    // A server certificate may also authenticate a client: an etcd member's gateway dials
    // the member's own TLS port with it when client certificates are required.
    params.extended_key_usages = match usage {
        ExtendedKeyUsagePurpose::ServerAuth => vec![usage, ExtendedKeyUsagePurpose::ClientAuth],
        _ => vec![usage],
    };
    if expired {
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    }
    let cert = params.signed_by(&key, ca).expect("signing a certificate");
    write(dir, &format!("{name}.pem"), &cert.pem());
    write(dir, &format!("{name}.key"), &key.serialize_pem());
}

fn write(dir: &Path, name: &str, contents: &str) {
    fs::write(dir.join(name), contents).unwrap_or_else(|e| panic!("writing {name}: {e}"));
}
