//! Fencing tokens as stream IDs.

/// How many sequence numbers one millisecond of a stream ID may hold in a token:
/// `token = ms << SEQ_BITS | seq`. The fence script never gives a larger sequence number:
/// a draw that would carries to the next millisecond (`(ms+1)-0`); one read anyway (a
/// stream raised by something else) is refused, never wrapped.
const SEQ_BITS: u32 = 20;

const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The fencing token of a stream ID `ms-seq`: `ms << 20 | seq`. The order of tokens is the
/// order of the IDs, which a stream only ever increases.
pub(crate) fn token_of_id(id: &[u8]) -> Option<u64> {
    let id = std::str::from_utf8(id).ok()?;
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    if seq > SEQ_MASK || ms >= 1 << (64 - SEQ_BITS) {
        return None;
    }
    Some(ms << SEQ_BITS | seq)
}

/// The stream ID of a token (the inverse of [`token_of_id`]).
pub(crate) fn id_of_token(token: u64) -> String {
    format!("{}-{}", token >> SEQ_BITS, token & SEQ_MASK)
}
