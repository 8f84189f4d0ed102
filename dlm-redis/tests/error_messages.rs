//! The exact text of the errors a user meets first: one clause per layer, the words of
//! whoever refused (the operating system, the resolver, the server), never one error's
//! text nested in another's. They used to read `unavailable: 127.0.0.1:7649/0: no
//! connection: unavailable: 127.0.0.1:7649/0: Io`, `authentication failed: ...:
//! AuthenticationFailed`, `TLS failure: TLS failure: ...`.
mod common;

use std::time::Duration;

use dlm_core::{Lock, LockClient};
use dlm_redis::RedisBackend;
use dlm_testkit::redis_server::RedisServer;

/// The text of the error of the first `try_lock` on `url`.
fn first_error(url: &str) -> String {
    let backend = RedisBackend::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.get_lock("error-text").unwrap();
    lock.try_lock().expect_err(url).to_string()
}

#[test]
fn a_refused_connection_says_connection_refused() {
    // A port nobody listens on: taken from the kernel, then given back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    assert_eq!(
        first_error(&format!("redis://127.0.0.1:{port}/")),
        format!("unavailable: 127.0.0.1:{port}/0: Connection refused (os error 111)")
    );
}

#[test]
fn refused_credentials_quote_the_server() {
    common::require();
    let server = RedisServer::builder().password("right").spawn();
    let port = server.port();
    assert_eq!(
        first_error(&format!("redis://:wrong@127.0.0.1:{port}/")),
        format!(
            "authentication failed: 127.0.0.1:{port}/0: WRONGPASS invalid username-password pair or user is disabled."
        )
    );
}

#[test]
fn an_unknown_host_quotes_the_resolver() {
    let text = first_error("redis://nosuchhost.invalid:6379/");
    // The resolver's own words differ between systems (glibc: "Name or service not
    // known"; without a network: "Temporary failure in name resolution").
    let prefix = "unavailable: nosuchhost.invalid:6379/0: failed to lookup address information: ";
    assert!(text.starts_with(prefix), "{text}");
    assert!(text.len() > prefix.len(), "{text}");
    assert!(!text.contains("Io"), "{text}");
}

#[test]
fn tls_to_a_plain_port_says_use_redis_urls() {
    common::require();
    let server = RedisServer::spawn();
    let port = server.port();
    assert_eq!(
        first_error(&format!("rediss://127.0.0.1:{port}/")),
        format!(
            "TLS failure: rediss://127.0.0.1:{port}/0: the server does not speak TLS on this port (it answers plain RESP): use a redis:// URL, or its TLS port"
        )
    );
}
