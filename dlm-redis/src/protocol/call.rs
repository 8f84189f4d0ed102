//! Requests prepared for one node (or a batch of them), sent in one write and read as
//! their replies arrive.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::keys::millis;
use super::refusal::Refusal;
use crate::transport::{Resp, Wire};

/// `WAIT replicas timeout` after each write of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: std::time::Duration,
}

/// `EVALSHA sha numkeys keys... args...`: the start of a script call with `keys` keys and
/// `args` further arguments.
pub(crate) fn evalsha(script: &Script, keys: usize, args: usize) -> Resp {
    let mut r = Resp::new();
    r.command(3 + keys + args)
        .arg(b"EVALSHA")
        .arg(script.get_hash().as_bytes())
        .arg_u64(keys as u64);
    r
}

/// How a call's replies are read and what they mean.
#[derive(Clone, Copy)]
pub(crate) enum Shape {
    /// One EVALSHA: one reply; NOSCRIPT is answered by loading the script and retrying.
    Script(&'static Script),
    /// `SET key token NX PX ms GET`: one reply.
    SetGet,
    /// `WAIT replicas timeout`: one reply, the number of replicas that acknowledged.
    Wait,
}

impl Shape {
    /// How many replies the request gets.
    fn replies(self) -> usize {
        match self {
            Shape::Script(_) | Shape::SetGet | Shape::Wait => 1,
        }
    }

    /// The request's value from its replies: the reply, or an array of them.
    fn value(self, replies: &mut impl Iterator<Item = redis::Value>) -> redis::Value {
        match self.replies() {
            1 => replies.next().unwrap_or_default(),
            n => redis::Value::Array(replies.take(n).collect()),
        }
    }
}

/// One request prepared for one node (or a batch of them, sent in one write): encoded
/// before it is sent, so that a caller can send it to several nodes before reading any
/// reply (Redlock's pipelined fan-out), and read its replies as they arrive.
pub(crate) struct Call {
    bytes: Bytes,
    parts: Parts,
}

/// A call's encoded bytes: its own, or shared with the calls of the same request to the
/// other nodes of a fan-out (see [`Call::duplicate`]).
enum Bytes {
    Own(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Own(b) => b,
            Bytes::Shared(b) => b,
        }
    }
}

#[derive(Clone)]
enum Parts {
    /// One request.
    One(Shape),
    /// Several requests, each with its shape and its bytes (to send it again after a
    /// NOSCRIPT).
    Batch(Vec<(Shape, Range<usize>)>),
}

impl Call {
    /// One request of `shape`, encoded in `r`.
    pub(crate) fn new(r: Resp, shape: Shape) -> Call {
        Call {
            bytes: Bytes::Own(r.0),
            parts: Parts::One(shape),
        }
    }

    /// The same request again, for another node: it shares this call's bytes (encoded
    /// once, whatever the number of nodes).
    pub(crate) fn duplicate(&mut self) -> Call {
        let shared = match &mut self.bytes {
            Bytes::Shared(b) => b.clone(),
            Bytes::Own(b) => {
                let b = Arc::new(std::mem::take(b));
                self.bytes = Bytes::Shared(b.clone());
                b
            }
        };
        Call {
            bytes: Bytes::Shared(shared),
            parts: self.parts.clone(),
        }
    }

    /// The bytes that are sent.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The shape of a single request (`None` for a batch).
    pub(crate) fn shape(&self) -> Option<Shape> {
        match &self.parts {
            Parts::One(shape) => Some(*shape),
            Parts::Batch(_) => None,
        }
    }

    /// The calls as one batch: written at once, read in order, one value per call.
    pub(crate) fn batch(calls: impl IntoIterator<Item = Call>) -> Call {
        let mut bytes = Vec::new();
        let mut parts = Vec::new();
        for call in calls {
            let shape = match call.parts {
                Parts::One(shape) => shape,
                Parts::Batch(_) => unreachable!("batches are not nested"),
            };
            let start = bytes.len();
            bytes.extend_from_slice(&call.bytes);
            parts.push((shape, start..bytes.len()));
        }
        Call {
            bytes: Bytes::Own(bytes),
            parts: Parts::Batch(parts),
        }
    }

    /// `WAIT replicas timeout`, to end a batch of writes: the reply counts the replicas
    /// that acknowledged every write made on the connection so far.
    pub(crate) fn wait(w: ReplicaWait) -> Call {
        let mut r = Resp::new();
        r.command(3)
            .arg(b"WAIT")
            .arg_u64(u64::from(w.replicas))
            .arg_u64(millis(w.timeout));
        Call {
            bytes: Bytes::Own(r.0),
            parts: Parts::One(Shape::Wait),
        }
    }

    /// How many calls a batch holds (1 for a single call).
    pub(crate) fn len(&self) -> usize {
        match &self.parts {
            Parts::One(_) => 1,
            Parts::Batch(parts) => parts.len(),
        }
    }

    /// How many replies the server sends.
    pub(crate) fn replies(&self) -> usize {
        match &self.parts {
            Parts::One(shape) => shape.replies(),
            Parts::Batch(parts) => parts.iter().map(|(s, _)| s.replies()).sum(),
        }
    }

    /// Writes the request.
    pub(crate) fn send(&self, con: &mut Wire) -> redis::RedisResult<()> {
        con.send(&self.bytes, self.replies())
    }

    /// Reads the replies to a request sent with [`send`](Self::send), blocking, and
    /// makes its value (see [`finish`](Self::finish)).
    pub(crate) fn receive(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        let mut replies = Vec::with_capacity(self.replies());
        while replies.len() < self.replies() {
            replies.push(con.receive()?);
        }
        self.finish(con, replies)
    }

    /// Reads the replies that have arrived; `true` once all are in `replies`. Takes the
    /// whole replies already buffered first, then reads the socket once (which returns
    /// at once after `poll` reported it readable). When it returns `false`, no whole
    /// reply is left in the buffer: the socket is the place to wait on.
    pub(crate) fn receive_some(
        &self,
        con: &mut Wire,
        replies: &mut Vec<redis::Value>,
    ) -> redis::RedisResult<bool> {
        self.receive_up_to(con, replies, None)
    }

    /// As [`receive_some`](Self::receive_some), but the read of the socket waits at most
    /// `within`; `false` too when nothing came in that time (the connection stays usable).
    pub(crate) fn receive_within(
        &self,
        con: &mut Wire,
        replies: &mut Vec<redis::Value>,
        within: Duration,
    ) -> redis::RedisResult<bool> {
        self.receive_up_to(con, replies, Some(within))
    }

    fn receive_up_to(
        &self,
        con: &mut Wire,
        replies: &mut Vec<redis::Value>,
        within: Option<Duration>,
    ) -> redis::RedisResult<bool> {
        let mut read = false;
        while replies.len() < self.replies() {
            match con.try_receive()? {
                Some(value) => replies.push(value),
                None if read => return Ok(false),
                None => {
                    match within {
                        None => con.read_some()?,
                        Some(within) => {
                            if !con.read_some_within(within)? {
                                return Ok(false);
                            }
                        }
                    }
                    read = true;
                }
            }
        }
        Ok(true)
    }

    /// The value of the call from all its replies: one value per request (server errors
    /// kept as values, so that every reply is read; a script's error is `Err` for a
    /// single call), and for a request of several commands an array of their replies; a
    /// batch gives an array of those. A script the server did not know is loaded and
    /// run again (blocking, on this connection: all replies have been read).
    pub(crate) fn finish(
        &self,
        con: &mut Wire,
        replies: Vec<redis::Value>,
    ) -> redis::RedisResult<redis::Value> {
        let mut replies = replies.into_iter();
        match &self.parts {
            Parts::One(shape) => {
                let value = shape.value(&mut replies);
                match shape {
                    Shape::Script(script) if is_noscript(&value) => {
                        script.load(con)?;
                        self.send(con)?;
                        con.receive().and_then(redis::Value::extract_error)
                    }
                    Shape::Script(_) => value.extract_error(),
                    _ => Ok(value),
                }
            }
            Parts::Batch(parts) => {
                let mut values: Vec<redis::Value> = parts
                    .iter()
                    .map(|(shape, _)| shape.value(&mut replies))
                    .collect();
                // Scripts the server did not know: each loaded once, then every refused
                // call sent again in one write.
                let refused: Vec<usize> = (0..parts.len())
                    .filter(|&k| matches!(parts[k].0, Shape::Script(_)) && is_noscript(&values[k]))
                    .collect();
                if refused.is_empty() {
                    return Ok(redis::Value::Array(values));
                }
                let mut loaded: Vec<&str> = Vec::new();
                let mut again = Vec::new();
                for &k in &refused {
                    if let (Shape::Script(script), bytes) = &parts[k] {
                        if !loaded.contains(&script.get_hash()) {
                            script.load(con)?;
                            loaded.push(script.get_hash());
                        }
                        again.extend_from_slice(&self.bytes[bytes.clone()]);
                    }
                }
                // A WAIT in the batch is sent again after them, so that it covers them.
                let wait = parts.iter().position(|(s, _)| matches!(s, Shape::Wait));
                if let Some(w) = wait {
                    again.extend_from_slice(&self.bytes[parts[w].1.clone()]);
                }
                con.send(&again, refused.len() + usize::from(wait.is_some()))?;
                for &k in &refused {
                    values[k] = con.receive()?;
                }
                if let Some(w) = wait {
                    values[w] = con.receive()?;
                }
                Ok(redis::Value::Array(values))
            }
        }
    }

    /// The server's refusal a reply keeps as a value (a refusal of the request's key: the
    /// whole request was refused, a transaction aborted), which a topology may send
    /// elsewhere (a cluster's redirection). `None` for a batch, whose requests can go to
    /// different slots: its caller looks at each.
    pub(crate) fn refusal_in(&self, value: &redis::Value) -> Option<Refusal> {
        match (&self.parts, value) {
            (Parts::Batch(_), _) => None,
            (Parts::One(_), value) => Refusal::of_value(value),
        }
    }

    /// Whether the reply says the request wrote the lock: a grant (a plain `SET` that
    /// found the key free, a transaction whose `SET` did, the acquire script's `1`, the
    /// fenced acquire script's `1`, `2` or `3`, the fence script's draw) or a
    /// renewal (the extend script's `1`; for a batch, any of them). What `WAIT` is for.
    pub(crate) fn wrote(&self, value: &redis::Value) -> bool {
        use redis::Value::{Array, Int, Nil};
        fn one(shape: Shape, v: &redis::Value) -> bool {
            match shape {
                Shape::SetGet => matches!(v, Nil),
                Shape::Wait => false,
                Shape::Script(_) => {
                    matches!(v, Int(1))
                        || matches!(v, Array(r) if matches!(r.first(), Some(Int(1..=3))))
                }
            }
        }
        match (&self.parts, value) {
            (Parts::One(shape), v) => one(*shape, v),
            (Parts::Batch(parts), Array(values)) => parts
                .iter()
                .zip(values)
                .any(|((shape, _), v)| one(*shape, v)),
            (Parts::Batch(_), _) => false,
        }
    }

    /// Sends the request and reads its replies.
    pub(crate) fn execute(&self, con: &mut Wire) -> redis::RedisResult<redis::Value> {
        self.send(con)?;
        self.receive(con)
    }
}

fn is_noscript(value: &redis::Value) -> bool {
    matches!(value, redis::Value::ServerError(e) if e.code() == "NOSCRIPT")
}
