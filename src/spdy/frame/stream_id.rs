//! The 31-bit stream identifier.

use std::fmt;

/// A 31-bit SPDY stream id. The top bit of the 32-bit field is reserved: it is ignored on
/// read and never set on write.
///
/// Clients open odd ids, servers even ones (PROTOCOL.md §3.4); 0 means "no stream" and is only
/// valid where a frame refers to the session (WINDOW_UPDATE, GOAWAY, an unset associated id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(u32);

impl StreamId {
    /// The reserved "no stream" id.
    pub const ZERO: StreamId = StreamId(0);
    /// The largest representable id, 2^31 - 1.
    pub const MAX: StreamId = StreamId(MASK);

    /// Makes an id from a 32-bit value, dropping the reserved top bit.
    pub const fn new(id: u32) -> StreamId {
        StreamId(id & MASK)
    }

    /// The id as a number (always below 2^31).
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Whether this is the reserved id 0.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether a client opened this stream (odd ids).
    pub const fn is_client_initiated(self) -> bool {
        self.0 & 1 == 1
    }

    /// Reads a stream id from the first four bytes of `src` (big-endian), ignoring the
    /// reserved bit. Callers have checked the length.
    pub(crate) fn read(src: &[u8]) -> StreamId {
        StreamId::new(super::wire::read_u32(src))
    }
}

/// The mask of the 31 bits that carry the id.
const MASK: u32 = 0x7FFF_FFFF;

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<StreamId> for u32 {
    fn from(id: StreamId) -> u32 {
        id.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_masks_reserved_bit() {
        assert_eq!(StreamId::new(0x8000_0003).get(), 3);
        assert_eq!(StreamId::new(0xFFFF_FFFF), StreamId::MAX);
        assert!(StreamId::new(0x8000_0000).is_zero());
    }

    #[test]
    fn read_ignores_reserved_bit() {
        assert_eq!(StreamId::read(&[0x80, 0, 0, 5]).get(), 5);
        assert_eq!(StreamId::read(&[0x7F, 0xFF, 0xFF, 0xFF]), StreamId::MAX);
    }

    #[test]
    fn parity_and_display() {
        assert!(StreamId::new(1).is_client_initiated());
        assert!(!StreamId::new(2).is_client_initiated());
        assert!(!StreamId::ZERO.is_client_initiated());
        assert_eq!(StreamId::new(42).to_string(), "42");
        assert!(StreamId::new(3) < StreamId::new(5));
    }
}
