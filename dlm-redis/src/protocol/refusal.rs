//! A server's refusal of a request, in its own words, for a topology that may send the
//! request elsewhere or later (a Redis Cluster reads `MOVED`, `ASK` and `TRYAGAIN` from
//! it: `topology/cluster/redirect.rs`). This layer only says what was refused and how.

/// A server's refusal of one request: its error code and the words after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The error code (`MOVED`, `ASK`, `TRYAGAIN`, `WRONGTYPE`, ...).
    pub(crate) code: String,
    /// The words after the code (`MOVED`'s slot and address), if any.
    pub(crate) detail: Option<String>,
    /// Whether it was kept as a reply's value (a request whose errors are read as values,
    /// as the plain `SET`'s) rather than returned as the request's error.
    pub(crate) in_value: bool,
}

impl Refusal {
    /// The refusal an error is, if the server made it (it has a code).
    pub(crate) fn of_error(e: &redis::RedisError) -> Option<Refusal> {
        Some(Refusal {
            code: e.code()?.to_owned(),
            detail: e.detail().map(str::to_owned),
            in_value: false,
        })
    }

    /// The refusal a reply is (a server error kept as a value), if it is one.
    pub(crate) fn of_value(v: &redis::Value) -> Option<Refusal> {
        match v {
            redis::Value::ServerError(e) => Some(Refusal {
                code: e.code().to_owned(),
                detail: e.details().map(str::to_owned),
                in_value: true,
            }),
            _ => None,
        }
    }
}
