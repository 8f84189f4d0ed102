//! Hash slots: the slot of a key (CRC16 and hash tags, as dlm-redis computes them) and a
//! key for a given slot.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// The hash slot of `key`, by Redis Cluster's rule (as `CLUSTER KEYSLOT`): CRC16 (XMODEM)
/// modulo 16384 of the key, or of its hash tag, the part between the first `{` and the
/// first `}` after it, when that part is not empty. The same as
/// [`dlm_redis::key_slot`], which computes it.
pub fn slot_of(key: &[u8]) -> u16 {
    dlm_redis::key_slot(key)
}

/// A key in `slot`: `{tag}name`, with the first decimal tag that hashes to `slot`.
///
/// # Panics
/// When `slot` is not below [`SLOTS`].
pub fn key_in_slot(slot: u16, name: &str) -> String {
    assert!(slot < SLOTS, "slot {slot} out of range");
    // A tag of digits has no braces: its slot is that of the whole tag.
    let tag = (0u32..)
        .map(|n| n.to_string())
        .find(|tag| slot_of(tag.as_bytes()) == slot)
        .expect("every slot has a decimal tag");
    format!("{{{tag}}}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // CRC16-XMODEM's check value is 0x31C3 for "123456789", and 0 for nothing.
        assert_eq!(slot_of(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot_of(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{a}b"), slot_of(b"a"));
        assert_eq!(slot_of(b"a{b}{c}"), slot_of(b"b"));
        assert_eq!(slot_of(b"{{x}}"), slot_of(b"{x"));
        assert_ne!(slot_of(b"{}x"), slot_of(b"x"));
        assert_eq!(slot_of(b"{}x"), 10595, "an empty tag hashes the whole key");
        for slot in [0, 1, 5460, 16383] {
            assert_eq!(slot_of(key_in_slot(slot, "k").as_bytes()), slot);
        }
    }
}
