//! The gateway's JSON encodings: base64 keys and values, 64-bit integers as strings.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

/// Base64 of `bytes` (keys and values in the gateway's JSON).
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The bytes of a base64 field.
pub(crate) fn unb64(v: &Value) -> Option<Vec<u8>> {
    STANDARD.decode(v.as_str()?).ok()
}

/// A 64-bit integer field (a string in the gateway's JSON; a missing field is 0).
pub(crate) fn int(v: &Value, field: &str) -> Result<i64, BackendError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s.parse().map_err(|_| bad_reply(field)),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad_reply(field)),
        Some(_) => Err(bad_reply(field)),
    }
}

/// A reply without the field a request needs.
pub(crate) fn bad_reply(field: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("etcd's reply has no valid `{field}`"),
    )
}

/// The header's revision of a reply.
pub(crate) fn revision(reply: &Value) -> Result<i64, BackendError> {
    int(
        reply.get("header").ok_or_else(|| bad_reply("header"))?,
        "revision",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_are_read_from_strings_and_missing_ones_are_zero() {
        let v = json!({"a": "42", "b": 7, "c": "x"});
        assert_eq!(int(&v, "a").unwrap(), 42);
        assert_eq!(int(&v, "b").unwrap(), 7);
        assert_eq!(int(&v, "missing").unwrap(), 0);
        assert!(int(&v, "c").is_err());
    }
}
