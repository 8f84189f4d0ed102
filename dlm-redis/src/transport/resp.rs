//! RESP2, both ways: requests encoded straight into bytes, replies parsed from a buffer.

use redis::{ErrorKind, RedisError, RedisResult, Value};

/// The largest bulk reply accepted (Redis's own limit for a string).
const MAX_BULK: usize = 512 * 1024 * 1024;
/// Nesting deeper than any reply of ours is a protocol error, not a reason to recurse.
pub(crate) const MAX_DEPTH: usize = 8;

/// One request in the Redis protocol (RESP), written straight into bytes: no
/// intermediate argument lists or key strings.
pub(crate) struct Resp(pub(crate) Vec<u8>);

impl Resp {
    pub(crate) fn new() -> Resp {
        Resp(Vec::with_capacity(192))
    }

    /// Starts a command of `argc` arguments (its name included).
    pub(crate) fn command(&mut self, argc: usize) -> &mut Resp {
        self.0.push(b'*');
        self.decimal(argc as u64);
        self.0.extend_from_slice(b"\r\n");
        self
    }

    pub(crate) fn arg(&mut self, arg: &[u8]) -> &mut Resp {
        self.arg_parts(&[arg])
    }

    /// One argument made of several parts.
    pub(crate) fn arg_parts(&mut self, parts: &[&[u8]]) -> &mut Resp {
        self.0.push(b'$');
        self.decimal(parts.iter().map(|p| p.len() as u64).sum());
        self.0.extend_from_slice(b"\r\n");
        for p in parts {
            self.0.extend_from_slice(p);
        }
        self.0.extend_from_slice(b"\r\n");
        self
    }

    pub(crate) fn arg_u64(&mut self, n: u64) -> &mut Resp {
        self.arg(itoa::Buffer::new().format(n).as_bytes())
    }

    fn decimal(&mut self, n: u64) {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
}

pub(crate) fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::Parse, what))
}

/// One reply from the start of `b`, and the bytes it took; `None` when `b` holds only
/// part of it.
pub(crate) fn parse(b: &[u8], depth: usize) -> RedisResult<Option<(Value, usize)>> {
    // A line never holds a CR of its own: the first one ends it.
    let Some(eol) = b.iter().position(|&c| c == b'\r') else {
        return Ok(None);
    };
    match b.get(eol + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(protocol_error("CR without LF in a reply line")),
    }
    if eol == 0 {
        return Err(protocol_error("a reply line without a type"));
    }
    let line = &b[1..eol];
    let next = eol + 2;
    let value = match b[0] {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
        // The redis crate knows the error codes: let it build the error value.
        b'-' => redis::parse_redis_value(&b[..next])?,
        b':' => Value::Int(integer(line)?),
        b'$' => {
            let len = integer(line)?;
            if len == -1 {
                return Ok(Some((Value::Nil, next)));
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|n| *n <= MAX_BULK)
                .ok_or_else(|| protocol_error("invalid bulk string length"))?;
            if b.len() < next + len + 2 {
                return Ok(None);
            }
            if &b[next + len..next + len + 2] != b"\r\n" {
                return Err(protocol_error("bulk string not terminated by CRLF"));
            }
            return Ok(Some((
                Value::BulkString(b[next..next + len].to_vec()),
                next + len + 2,
            )));
        }
        b'*' => {
            let n = integer(line)?;
            if n == -1 {
                return Ok(Some((Value::Nil, next)));
            }
            let n = usize::try_from(n).map_err(|_| protocol_error("invalid array length"))?;
            if depth == 0 {
                return Err(protocol_error("reply nested too deeply"));
            }
            let mut items = Vec::with_capacity(n.min(16));
            let mut at = next;
            for _ in 0..n {
                match parse(&b[at..], depth - 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(protocol_error("unexpected reply type")),
    };
    Ok(Some((value, next)))
}

fn integer(digits: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol_error("invalid integer"))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(b: &[u8]) -> Value {
        let (v, used) = parse(b, MAX_DEPTH).unwrap().expect("complete");
        assert_eq!(used, b.len(), "consumed all of {b:?}");
        v
    }

    #[test]
    fn parses_every_reply_type_we_meet() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".into()));
        assert_eq!(whole(b":-42\r\n"), Value::Int(-42));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(vec![]));
        assert_eq!(
            whole(b"$4\r\na\r\nb\r\n"),
            Value::BulkString(b"a\r\nb".to_vec())
        );
        assert_eq!(
            whole(b"*2\r\n:1\r\n*1\r\n$1\r\nx\r\n"),
            Value::Array(vec![
                Value::Int(1),
                Value::Array(vec![Value::BulkString(b"x".to_vec())])
            ])
        );
        let e = whole(b"-NOSCRIPT No matching script\r\n")
            .extract_error()
            .unwrap_err();
        assert_eq!(e.code(), Some("NOSCRIPT"));
        let e = whole(b"-WRONGPASS invalid username-password pair\r\n")
            .extract_error()
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGPASS"));
    }

    #[test]
    fn a_partial_reply_asks_for_more_and_the_rest_is_left() {
        let full = b"*2\r\n$3\r\nabc\r\n:7\r\n+OK\r\n";
        for cut in 0..full.len() - 5 {
            assert!(
                parse(&full[..cut], MAX_DEPTH).unwrap().is_none(),
                "cut at {cut}"
            );
        }
        let (_, used) = parse(full, MAX_DEPTH).unwrap().unwrap();
        assert_eq!(&full[used..], b"+OK\r\n");
    }

    #[test]
    fn malformed_replies_are_errors() {
        for bad in [
            &b"?x\r\n"[..],
            b"\r\n",
            b"*1\r\n\r\n",
            b"+a\rb\r\n",
            b":12a\r\n",
            b"$-2\r\n",
            b"$3\r\nabcd\r\n",
            b"*-5\r\n",
            b"$99999999999\r\n",
        ] {
            assert!(parse(bad, MAX_DEPTH).is_err(), "{bad:?} accepted");
        }
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep, MAX_DEPTH).is_err(), "unbounded nesting");
    }
}
