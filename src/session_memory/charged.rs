//! Bytes that carry the memory they hold: given back when the last piece of them drops.

use bytes::Bytes;

use super::lane::Held;

/// The owner behind charged bytes.
struct Charged {
    bytes: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// `bytes`, holding `held` until they and every slice or clone of them are dropped (one small
/// allocation; none when nothing is held). Nothing is copied.
pub fn charged(bytes: Bytes, held: Held) -> Bytes {
    if held.is_empty() {
        return bytes;
    }
    Bytes::from_owner(Charged { bytes, _held: held })
}
