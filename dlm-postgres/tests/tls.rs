//! TLS against a real PostgreSQL server with a certificate from the test CA: verified
//! against the CA given, with a client certificate the server sees, refused with another
//! CA, and with TLS required (`sslmode=require`) against a server without TLS.
mod common;

use std::path::Path;
use std::process::Command;

use dlm_core::{BackendErrorKind, Lock, LockClient};
use dlm_postgres::{PostgresBackend, TlsOptions};
use dlm_testkit::postgres::{PostgresOptions, PostgresServer};
use dlm_testkit::tls::{ServerCert, TestPki};

/// Copies `from` into `dir` as `name`, readable only by the server's OS user (PostgreSQL
/// refuses a key others may read), and returns its path.
fn server_file(dir: &Path, from: &Path, name: &str) -> String {
    let to = dir.join(name);
    std::fs::copy(from, &to).unwrap();
    let status = Command::new("chmod").arg("600").arg(&to).status().unwrap();
    assert!(status.success());
    if Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        let status = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&to)
            .status()
            .unwrap();
        assert!(status.success());
    }
    to.display().to_string()
}

/// A server with TLS (the test CA's certificate for 127.0.0.1), asking clients for a
/// certificate signed by that CA (`ssl_ca_file`). Keep the returned dir while it runs.
fn tls_server(pki: &TestPki) -> (PostgresServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    if Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        Command::new("chmod")
            .arg("755")
            .arg(dir.path())
            .status()
            .unwrap();
    }
    let (cert, key) = pki.server_cert(ServerCert::Valid);
    let mut options = PostgresOptions::default();
    options.settings = vec![
        ("ssl".into(), "on".into()),
        (
            "ssl_cert_file".into(),
            server_file(dir.path(), &cert, "server.crt"),
        ),
        (
            "ssl_key_file".into(),
            server_file(dir.path(), &key, "server.key"),
        ),
        (
            "ssl_ca_file".into(),
            server_file(dir.path(), &pki.ca_file(), "ca.crt"),
        ),
    ];
    (PostgresServer::spawn_with(options), dir)
}

#[test]
fn tls_verified_with_the_ca_and_a_client_certificate() {
    let pki = TestPki::new();
    let (server, _dir) = tls_server(&pki);
    let (cert, key) = pki.client_cert();
    let backend = PostgresBackend::builder(&server.url())
        .tls(
            TlsOptions::new()
                .ca_file(pki.ca_file())
                .client_cert(cert, key),
        )
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let guard = client.get_lock("tls").unwrap().try_lock().unwrap().unwrap();
    let seen = server.psql(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'dlm' AND s.ssl AND s.client_dn IS NOT NULL",
    );
    assert_ne!(
        seen, "0",
        "no TLS connection of dlm's with a client certificate"
    );
    guard.unlock().unwrap();
}

#[test]
fn another_ca_is_a_tls_error() {
    let pki = TestPki::new();
    let (server, _dir) = tls_server(&pki);
    let backend = PostgresBackend::builder(&server.url())
        .tls(TlsOptions::new().ca_file(pki.other_ca_file()))
        .build()
        .unwrap();
    let e = LockClient::new(backend)
        .get_lock("tls")
        .unwrap()
        .try_lock()
        .expect_err("an untrusted certificate");
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Tls), "{e}");
}

#[test]
fn tls_required_against_a_server_without_it_is_a_tls_error() {
    let server = PostgresServer::spawn();
    let backend = PostgresBackend::builder(&format!("{}?sslmode=require", server.url()))
        .build()
        .unwrap();
    let e = LockClient::new(backend)
        .get_lock("tls")
        .unwrap()
        .try_lock()
        .expect_err("no TLS there");
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Tls), "{e}");
}
