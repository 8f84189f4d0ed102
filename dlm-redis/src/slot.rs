//! Cluster hash slots: which slot a key lives in ([`key_slot`], public: dlm-testkit uses
//! it too, so CRC16 is written once), and a short hash tag for every slot, so that a
//! lock's fencing stream (one per slot, see `protocol/keys.rs`) always shares the slot of
//! the lock key that uses it.

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The CRC of each byte value, for [`crc16`] (polynomial 0x1021).
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The Redis Cluster hash slot of `key`, as `CLUSTER KEYSLOT` gives it: CRC16 (XMODEM)
/// modulo 16,384 of the key's hash tag (the part between its first `{` and the first `}`
/// after it, when that part is not empty), or else of the whole key.
///
/// Every key of a lock called `n` has the hash tag `{n}` (`dlm:{n}`, its release channel,
/// its semaphore's or read-write lock's hash; see [`LockKeys`](crate::LockKeys)), so they
/// live in one slot, that of `n` for a name without braces:
///
/// ```
/// use dlm_redis::key_slot;
///
/// assert_eq!(key_slot(b"foo"), 12182);
/// assert_eq!(key_slot(b"dlm:{invoice-42}"), key_slot(b"invoice-42"));
/// assert_eq!(key_slot(b"dlm:{invoice-42}:released"), 13003);
/// // An empty tag is no tag: the whole key is hashed.
/// assert_eq!(key_slot(b"{}x"), 10595);
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    key_slot_of_tag(hashed)
}

/// The hash slot of a key whose hashed part (its hash tag, or the whole key) is `hashed`.
pub(crate) fn key_slot_of_tag(hashed: &[u8]) -> u16 {
    crc16(hashed) % SLOTS as u16
}

/// A short string (base 36, at most 4 characters) whose hash slot is `slot`: `{tag}` in a
/// key puts the key in that slot. Each slot's tag is the first base-36 number (0, 1, ...,
/// z, 10, ...) that hashes to it. The table of all 16,384 is made at compile time (one
/// pass over about 170,000 numbers): made on first use, it cost every short-lived program
/// (a `dlm run`) about 2 ms of CPU before its first lock.
pub(crate) fn tag(slot: u16) -> &'static str {
    let (bytes, len) = &TAGS[usize::from(slot) % SLOTS];
    std::str::from_utf8(&bytes[..usize::from(*len)]).expect("base-36 digits are ASCII")
}

/// The tag of each slot (see [`tag`]): its base-36 digits and their number.
static TAGS: [([u8; 4], u8); SLOTS] = tags();

const fn tags() -> [([u8; 4], u8); SLOTS] {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut tags = [([0u8; 4], 0u8); SLOTS];
    let mut missing = SLOTS;
    let mut n: u32 = 0;
    while missing > 0 {
        // n in base 36, most significant digit first (at most 4 digits: 36^4 > the
        // numbers needed, which the assertion below keeps true).
        let mut digits = [0u8; 4];
        let mut len = 0;
        let mut rest = n;
        loop {
            assert!(len < 4, "every slot has a tag of at most 4 characters");
            digits[len] = DIGITS[(rest % 36) as usize];
            len += 1;
            rest /= 36;
            if rest == 0 {
                break;
            }
        }
        let mut bytes = [0u8; 4];
        let mut crc: u16 = 0;
        let mut i = 0;
        while i < len {
            bytes[i] = digits[len - 1 - i];
            crc = (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ bytes[i]) as usize];
            i += 1;
        }
        let slot = crc as usize % SLOTS;
        if tags[slot].1 == 0 {
            tags[slot] = (bytes, len as u8);
            missing -= 1;
        }
        n += 1;
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // The reference vector of CRC16-XMODEM, and slots from the Redis Cluster spec and
        // `CLUSTER KEYSLOT` of a real cluster.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(
            key_slot(b"foo{}{bar}"),
            key_slot(b"bar"),
            "an empty tag hashes all"
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    /// The tags are the ones the table made on first use gave (streams already on
    /// servers keep their keys): for each slot, the first base-36 number that hashes to it.
    #[test]
    fn the_tags_are_the_first_base36_numbers_of_each_slot() {
        fn base36(mut n: u64) -> String {
            const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
            let mut out = Vec::new();
            loop {
                out.push(DIGITS[(n % 36) as usize]);
                n /= 36;
                if n == 0 {
                    break;
                }
            }
            out.reverse();
            String::from_utf8(out).expect("ASCII digits")
        }
        let mut expected: Vec<Option<String>> = vec![None; SLOTS];
        let mut missing = SLOTS;
        for n in 0u64.. {
            let t = base36(n);
            let slot = &mut expected[usize::from(crc16(t.as_bytes())) % SLOTS];
            if slot.is_none() {
                *slot = Some(t);
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        for (slot, t) in expected.iter().enumerate() {
            assert_eq!(
                tag(slot as u16),
                t.as_deref().expect("every slot"),
                "slot {slot}"
            );
        }
    }

    #[test]
    fn every_tag_lands_in_its_slot() {
        for slot in 0..SLOTS as u16 {
            let t = tag(slot);
            assert_eq!(key_slot(format!("dlm:fence:{{{t}}}").as_bytes()), slot);
            assert!(t.len() <= 4, "{t}");
        }
    }
}
