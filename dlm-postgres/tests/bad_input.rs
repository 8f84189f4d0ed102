//! Bad input: settings refused before any I/O, and servers that cannot serve dlm (not
//! PostgreSQL, a wrong password, a missing database, a read-only server, a role without
//! the rights dlm needs), each a typed error at first use within the connect timeout.
mod common;

use std::time::{Duration, Instant};

use dlm_core::{BackendErrorKind, Error, Lock, LockClient};
use dlm_postgres::PostgresBackend;
use dlm_testkit::postgres::{PostgresOptions, PostgresServer};
use dlm_testkit::redis_server::RedisServer;

const CONNECT: Duration = Duration::from_secs(2);

/// The error of a first `try_lock` against `url`, and how long it took.
fn first_use(url: &str) -> (Error, Duration) {
    let backend = PostgresBackend::builder(url)
        .connect_timeout(CONNECT)
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let t = Instant::now();
    let e = client
        .get_lock("job")
        .unwrap()
        .try_lock()
        .expect_err("it cannot work");
    (e, t.elapsed())
}

fn kind(e: &Error) -> Option<BackendErrorKind> {
    e.backend_kind()
}

#[test]
fn settings_are_checked_before_any_io() {
    for (url, what) in [
        ("redis://127.0.0.1:6379", "redis://"),
        ("http://127.0.0.1:2379", "http://"),
        ("127.0.0.1:5432", "postgresql://"),
        ("postgresql://127.0.0.1:5432/db", "USER"),
        ("postgresql://u@127.0.0.1:notaport/db", "libpq"),
        // Several ports, or hostaddr values, that do not match the hosts one for one.
        ("postgresql://u@h1,h2,h3/db?port=1,2", "3 hosts"),
        (
            "postgresql://u@h1,h2:1/db?hostaddr=127.0.0.1,127.0.0.2,127.0.0.3",
            "2 hosts",
        ),
    ] {
        let e = PostgresBackend::new(url).expect_err(url);
        assert_eq!(e.argument(), "url", "{url}");
        assert!(e.reason().contains(what), "{url}: {}", e.reason());
    }
    let b = || PostgresBackend::builder("postgresql://u@127.0.0.1:1/db");
    assert_eq!(
        b().schema("Bad-Name").build().unwrap_err().argument(),
        "schema"
    );
    assert_eq!(b().schema("").build().unwrap_err().argument(), "schema");
    assert_eq!(
        b().pool_size(0).build().unwrap_err().argument(),
        "pool_size"
    );
    assert_eq!(
        b().io_timeout(Duration::ZERO)
            .build()
            .unwrap_err()
            .argument(),
        "timeout"
    );
    assert_eq!(
        b().drift_factor(0.7).build().unwrap_err().argument(),
        "drift_factor"
    );
    assert_eq!(
        b().password_file("/nonexistent/dlm-password")
            .build()
            .unwrap_err()
            .argument(),
        "password_file"
    );
    assert_eq!(
        PostgresBackend::builder("postgresql://u@127.0.0.1:1/db?sslmode=disable")
            .tls(dlm_postgres::TlsOptions::new())
            .build()
            .unwrap_err()
            .argument(),
        "tls"
    );
    let empty = std::env::temp_dir().join(format!("dlm-pg-empty-{}", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let e = b().password_file(&empty).build().unwrap_err();
    std::fs::remove_file(&empty).unwrap();
    assert_eq!(e.argument(), "password_file");
    // A secret never shows.
    let shown = format!("{:?}", b().password("hunter2"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn a_redis_port_is_a_protocol_error() {
    let redis = RedisServer::spawn();
    let (e, took) = first_use(&format!(
        "postgresql://postgres@127.0.0.1:{}/postgres",
        redis.port()
    ));
    assert_eq!(kind(&e), Some(BackendErrorKind::Protocol), "{e}");
    assert!(e.to_string().contains("does not speak PostgreSQL"), "{e}");
    assert!(took <= CONNECT + Duration::from_millis(500), "{took:?}");
}

#[test]
fn nothing_listening_is_unavailable_within_the_connect_timeout() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (e, took) = first_use(&format!("postgresql://postgres@127.0.0.1:{port}/postgres"));
    assert_eq!(kind(&e), Some(BackendErrorKind::Unavailable), "{e}");
    assert!(e.is_transient());
    assert!(took <= CONNECT + Duration::from_millis(500), "{took:?}");
}

#[test]
fn a_wrong_password_a_missing_database_and_a_missing_role_are_told_apart() {
    let mut options = PostgresOptions::default();
    options.password = Some("right-password".into());
    let server = PostgresServer::spawn_with(options);
    let (e, _) = first_use(&server.url_for("postgres", Some("wrong-password"), "postgres"));
    assert_eq!(kind(&e), Some(BackendErrorKind::Auth), "{e}");
    assert!(!e.to_string().contains("wrong-password"), "{e}");
    let (e, _) = first_use(&server.url_for("nobody", Some("x"), "postgres"));
    assert_eq!(kind(&e), Some(BackendErrorKind::Auth), "{e}");
    let (e, _) = first_use(&server.url_for("postgres", Some("right-password"), "nodb"));
    assert!(e.to_string().contains("\"nodb\" does not exist"), "{e}");
    assert!(!e.is_transient(), "{e}");
    // The password from a file, and the right one works.
    let file = std::env::temp_dir().join(format!("dlm-pg-password-{}", std::process::id()));
    std::fs::write(&file, "right-password\n").unwrap();
    let backend = PostgresBackend::builder(&server.url_for("postgres", None, "postgres"))
        .password_file(&file)
        .build()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    let client = LockClient::new(backend);
    assert!(
        client
            .get_lock("job")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some()
    );
}

/// The only server given does not accept writes (here a server whose sessions are
/// read-only, as a standby's are).
#[test]
fn a_read_only_server_is_refused() {
    let mut options = PostgresOptions::default();
    options.settings = vec![("default_transaction_read_only".into(), "on".into())];
    let server = PostgresServer::spawn_with(options);
    let (e, _) = first_use(&server.url());
    assert_eq!(kind(&e), Some(BackendErrorKind::ReadOnly), "{e}");
}

/// A role that may not create dlm's schema is told what an administrator must do; once
/// the administrator has run the schema's SQL and granted the rights, it works.
#[test]
fn a_role_without_rights_is_told_what_to_grant() {
    let server = PostgresServer::spawn();
    server.psql("CREATE ROLE app LOGIN");
    let url = server.url_for("app", None, "postgres");
    let (e, _) = first_use(&url);
    assert_eq!(kind(&e), Some(BackendErrorKind::Permission), "{e}");
    assert!(e.to_string().contains("schema_sql"), "{e}");
    let backend = PostgresBackend::new(&url).unwrap();
    assert!(e.to_string().contains(&backend.grants_sql("app")), "{e}");
    // What the error says to run, run by the administrator.
    server.psql(backend.schema_sql());
    let (e, _) = first_use(&url);
    assert_eq!(kind(&e), Some(BackendErrorKind::Permission), "{e}");
    server.psql(&backend.grants_sql("app"));
    let client = LockClient::new(common::backend(&url));
    let guard = client.get_lock("job").unwrap().try_lock().unwrap().unwrap();
    assert!(guard.fencing_token().is_ok());
    guard.unlock().unwrap();
}
