//! Hash slots: the slot of a key (CRC16 and hash tags) and a key for a given slot.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// The hash slot of `key`, by Redis Cluster's rule (as `CLUSTER KEYSLOT`): CRC16 (XMODEM)
/// modulo 16384 of the key, or of its hash tag, the part between the first `{` and the
/// first `}` after it, when that part is not empty.
pub fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// A key in `slot`: `{tag}name`, with the first decimal tag that hashes to `slot`.
///
/// # Panics
/// When `slot` is not below [`SLOTS`].
pub fn key_in_slot(slot: u16, name: &str) -> String {
    assert!(slot < SLOTS, "slot {slot} out of range");
    let tag = (0u32..)
        .map(|n| n.to_string())
        .find(|tag| crc16(tag.as_bytes()) % SLOTS == slot)
        .expect("every slot has a decimal tag");
    format!("{{{tag}}}{name}")
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum of key slots.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (0..8).fold(crc ^ (u16::from(b) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{a}b"), slot_of(b"a"));
        assert_eq!(slot_of(b"a{b}{c}"), slot_of(b"b"));
        assert_eq!(slot_of(b"{{x}}"), slot_of(b"{x"));
        assert_ne!(slot_of(b"{}x"), slot_of(b"x"));
        assert_eq!(slot_of(b"{}x"), crc16(b"{}x") % SLOTS);
        for slot in [0, 1, 5460, 16383] {
            assert_eq!(slot_of(key_in_slot(slot, "k").as_bytes()), slot);
        }
    }
}
