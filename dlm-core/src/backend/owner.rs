//! Owner tokens: who holds a lock, as a backend stores it.

use std::fmt;

/// Identifies who holds a lock: 128 random bits drawn from the OS CSPRNG once per
/// [`LockClient`](crate::LockClient), the holding thread, and a sequence number: every
/// acquisition that reaches the backend has a token of its own (re-entry is counted by the
/// front and never reaches the backend).
///
/// It is a secret: whoever knows it can release or extend the lock. `Debug` redacts it;
/// only backends see it, through [`OwnerToken::encode`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken {
    client: [u8; 16],
    thread: u64,
    seq: u64,
}

impl OwnerToken {
    pub(crate) fn new(client: [u8; 16], thread: u64, seq: u64) -> Self {
        OwnerToken {
            client,
            thread,
            seq,
        }
    }

    /// A token for tests of backends: random client bits, the given thread number.
    pub fn random_for_tests(thread: u64) -> Self {
        OwnerToken::new(random_client_id(), thread, 0)
    }

    /// The token as the string a backend stores: 32 hex digits, `:`, the thread number,
    /// `:`, the sequence number. Never log it.
    pub fn encode(&self) -> String {
        self.encoded().as_str().to_owned()
    }

    /// [`encode`](OwnerToken::encode) without allocating: the same text in a buffer on the
    /// stack (backends write it into every request).
    pub fn encoded(&self) -> EncodedOwnerToken {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = EncodedOwnerToken {
            buf: [0; ENCODED_MAX],
            len: 0,
        };
        for (i, b) in self.client.iter().enumerate() {
            out.buf[2 * i] = HEX[usize::from(b >> 4)];
            out.buf[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        let mut len = 32;
        for n in [self.thread, self.seq] {
            out.buf[len] = b':';
            len += 1;
            let mut digits = itoa::Buffer::new();
            let d = digits.format(n).as_bytes();
            out.buf[len..len + d.len()].copy_from_slice(d);
            len += d.len();
        }
        out.len = len;
        out
    }
}

/// 32 hex digits, two colons, two 20-digit numbers at most.
const ENCODED_MAX: usize = 32 + 2 * (1 + 20);

/// An [`OwnerToken`] encoded for a backend (see [`OwnerToken::encoded`]). A secret like the
/// token: `Debug` redacts it.
#[derive(Clone, Copy)]
pub struct EncodedOwnerToken {
    buf: [u8; ENCODED_MAX],
    len: usize,
}

impl EncodedOwnerToken {
    /// The encoded token.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The encoded token as text (ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("hex digits, colons and decimal digits")
    }
}

impl fmt::Debug for EncodedOwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncodedOwnerToken(<redacted>)")
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

/// 128 bits from the operating system's CSPRNG: the client part of every owner token.
///
/// # Panics
/// If the operating system cannot provide random bytes.
pub(crate) fn random_client_id() -> [u8; 16] {
    use rand::TryRngCore;
    let mut id = [0u8; 16];
    rand::rngs::OsRng
        .try_fill_bytes(&mut id)
        .expect("the operating system's random number generator failed");
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_is_hex_then_thread_then_sequence() {
        let t = OwnerToken::new([0xab; 16], 7, 1234567890123);
        assert_eq!(t.encode(), format!("{}:7:1234567890123", "ab".repeat(16)));
        assert_eq!(
            OwnerToken::new([0; 16], 0, u64::MAX).encode(),
            format!("{}:0:{}", "00".repeat(16), u64::MAX)
        );
        assert_eq!(format!("{t:?}"), "OwnerToken(<redacted>)");
        assert_eq!(t.encoded().as_bytes(), t.encode().as_bytes());
        assert_eq!(
            format!("{:?}", t.encoded()),
            "EncodedOwnerToken(<redacted>)"
        );
    }
}
