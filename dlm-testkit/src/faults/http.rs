//! HTTP/1.1 message boundaries in a byte stream, for the proxy's
//! [`drop_http_replies`](super::FaultProxy::drop_http_replies): which bytes belong to
//! which request or response, so that one whole response can be discarded.

/// Where a [`Framer`] is in the stream.
#[derive(Debug)]
enum State {
    /// Before or inside a message's head (start line and headers).
    Head,
    /// In a body of this many bytes still to come.
    Body(usize),
    /// Before a chunk's size line.
    ChunkSize,
    /// In a chunk: its data and the CRLF after it, this many bytes still to come.
    Chunk(usize),
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
}

/// Splits a stream of HTTP/1.1 messages (requests or responses) at their boundaries.
#[derive(Debug)]
pub(super) struct Framer {
    state: State,
    /// The head or line being read.
    line: Vec<u8>,
    /// Whether the current message is delivered.
    keep: bool,
}

impl Framer {
    pub(super) fn new() -> Self {
        Framer {
            state: State::Head,
            line: Vec::new(),
            keep: true,
        }
    }

    /// Feeds `bytes`; `start` is called with each message's head (start line and
    /// headers) as it is complete, and says whether that message is delivered. Returns
    /// the bytes to deliver. A head held back (incomplete) is delivered with the rest of
    /// its message.
    pub(super) fn feed(&mut self, bytes: &[u8], start: &mut dyn FnMut(&[u8]) -> bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            match self.state {
                State::Head => {
                    self.line.push(bytes[at]);
                    at += 1;
                    if self.line.ends_with(b"\r\n\r\n") {
                        let head = std::mem::take(&mut self.line);
                        self.keep = start(&head);
                        if self.keep {
                            out.extend_from_slice(&head);
                        }
                        self.state = body_of(&head);
                    }
                }
                State::Body(n) => {
                    let take = n.min(bytes.len() - at);
                    if self.keep {
                        out.extend_from_slice(&bytes[at..at + take]);
                    }
                    at += take;
                    self.state = if take == n {
                        State::Head
                    } else {
                        State::Body(n - take)
                    };
                }
                State::ChunkSize | State::Trailers => {
                    let b = bytes[at];
                    at += 1;
                    if self.keep {
                        out.push(b);
                    }
                    self.line.push(b);
                    if self.line.ends_with(b"\r\n") {
                        let line = std::mem::take(&mut self.line);
                        self.state = match self.state {
                            State::Trailers if line == b"\r\n" => State::Head,
                            State::Trailers => State::Trailers,
                            _ => match chunk_size(&line) {
                                Some(0) => State::Trailers,
                                Some(n) => State::Chunk(n + 2),
                                // Not HTTP as we know it: deliver the rest as it is.
                                None => State::Body(usize::MAX),
                            },
                        };
                    }
                }
                State::Chunk(n) => {
                    let take = n.min(bytes.len() - at);
                    if self.keep {
                        out.extend_from_slice(&bytes[at..at + take]);
                    }
                    at += take;
                    self.state = if take == n {
                        State::ChunkSize
                    } else {
                        State::Chunk(n - take)
                    };
                }
            }
        }
        out
    }
}

/// The path of a request head (`POST /v3/kv/txn HTTP/1.1 ...`).
pub(super) fn path_of(head: &[u8]) -> Option<&str> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    line.split(' ').nth(1)
}

/// How a message's body is framed, from its head.
fn body_of(head: &[u8]) -> State {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let header = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        return State::ChunkSize;
    }
    match header("content-length:").and_then(|v| v.parse::<usize>().ok()) {
        Some(0) | None => State::Head,
        Some(n) => State::Body(n),
    }
}

/// A chunk's size line: hexadecimal, maybe with extensions.
fn chunk_size(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?.trim_end();
    let hex = text.split(';').next()?.trim();
    usize::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_messages_are_kept_or_dropped_across_feeds() {
        let first: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let second: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
        let third: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let stream = [first, second, third].concat();
        let expected = [first, third].concat();
        for cut in 1..stream.len() {
            let mut f = Framer::new();
            let mut n = 0;
            let mut start = |_: &[u8]| {
                n += 1;
                n != 2
            };
            let mut out = f.feed(&stream[..cut], &mut start);
            out.extend(f.feed(&stream[cut..], &mut start));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_request_head_names_its_path() {
        assert_eq!(
            path_of(b"POST /v3/kv/txn HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/v3/kv/txn")
        );
    }
}
