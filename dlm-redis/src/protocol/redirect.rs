//! Redis Cluster's redirections, read from errors and replies.

/// What a cluster node's refusal asks the client to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The slot is served by `addr` now.
    Moved { slot: u16, addr: String },
    /// This one request goes to `addr`, after `ASKING` (the slot is being migrated there).
    Ask { addr: String },
    /// `TRYAGAIN` (a multi-key request during a migration) or `CLUSTERDOWN`: later.
    Retry,
}

impl Redirect {
    fn of(code: &str, detail: Option<&str>) -> Option<Redirect> {
        match code {
            "MOVED" | "ASK" => {
                let mut words = detail?.split_ascii_whitespace();
                let slot: u16 = words.next()?.parse().ok()?;
                let addr = words.next()?.to_owned();
                Some(if code == "MOVED" {
                    Redirect::Moved { slot, addr }
                } else {
                    Redirect::Ask { addr }
                })
            }
            "TRYAGAIN" | "CLUSTERDOWN" => Some(Redirect::Retry),
            _ => None,
        }
    }

    /// The redirection an error asks for, if any.
    pub(crate) fn of_error(e: &redis::RedisError) -> Option<Redirect> {
        Redirect::of(e.code()?, e.detail())
    }

    /// The redirection a reply (a server error kept as a value) asks for, if any.
    pub(crate) fn of_value(v: &redis::Value) -> Option<Redirect> {
        match v {
            redis::Value::ServerError(e) => Redirect::of(e.code(), e.details()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_read_from_errors_and_values() {
        assert_eq!(
            Redirect::of("MOVED", Some("3999 127.0.0.1:6381")),
            Some(Redirect::Moved {
                slot: 3999,
                addr: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            Redirect::of("ASK", Some("3999 :6381")),
            Some(Redirect::Ask {
                addr: ":6381".into()
            })
        );
        assert_eq!(Redirect::of("TRYAGAIN", None), Some(Redirect::Retry));
        assert_eq!(
            Redirect::of("CLUSTERDOWN", Some("The cluster is down")),
            Some(Redirect::Retry)
        );
        assert_eq!(Redirect::of("MOVED", Some("nonsense")), None);
        assert_eq!(Redirect::of("ERR", Some("3999 127.0.0.1:6381")), None);
    }
}
