//! The transport: a socket (TCP, unix or TLS over TCP) that speaks RESP2, the bottom
//! layer of every connection dlm opens. It knows nothing of locks, pools or topologies.

mod resp;
mod tls;
mod wire;

pub(crate) use resp::Resp;
pub use tls::TlsOptions;
pub(crate) use wire::{TlsTarget, Wire, is_tls_error};

/// What a redis error says, in the words of whoever said it: a server's error code and
/// text (cut at 120 characters; server errors do not echo arguments), the operating
/// system's words for an I/O error (`Connection refused (os error 111)`, the resolver's
/// `failed to lookup address information: ...`), or the description dlm's transport
/// gave (the server's own words for refused credentials). Never the redis crate's
/// decorations (` - Io`, the kind's name).
pub(crate) fn words(e: &redis::RedisError) -> String {
    if let Some(code) = e.code() {
        let detail: String = e.detail().unwrap_or_default().chars().take(120).collect();
        return format!("{code} {detail}").trim_end().to_owned();
    }
    if e.is_io_error() || e.is_timeout() {
        return e.to_string();
    }
    // "description - Kind" or "description - Kind: detail".
    let text = e.to_string();
    let description = text.split(" - ").next().unwrap_or_default();
    match e.detail() {
        Some(detail) if !detail.is_empty() => detail.to_owned(),
        _ => description.to_owned(),
    }
}
