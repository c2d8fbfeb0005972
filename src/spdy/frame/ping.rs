//! PING: a liveness check the receiver echoes unchanged (PROTOCOL.md §3.2, §3.4).
//!
//! ```text
//! control head (type 6, flags 0, length 4) | id (4)
//! ```

use std::fmt;

use bytes::BufMut;

use super::wire::{expect_len, expect_no_flags, put_control, read_u32};
use super::{ControlType, FrameError};

/// A ping id. Clients use odd ids, servers even ones; 0 is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PingId(pub u32);

impl fmt::Display for PingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A PING frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ping {
    /// The id, echoed back by the peer.
    pub id: PingId,
}

impl Ping {
    const NAME: &'static str = "PING";

    /// Decodes the payload of a PING: spdystream refuses flags and id 0.
    pub(crate) fn decode(flags: u8, payload: &[u8]) -> Result<Ping, FrameError> {
        expect_no_flags(Self::NAME, flags)?;
        expect_len(Self::NAME, payload, 4)?;
        match read_u32(payload) {
            0 => Err(FrameError::ZeroPingId),
            id => Ok(Ping { id: PingId(id) }),
        }
    }

    /// Appends the whole frame.
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        if self.id.0 == 0 {
            return Err(FrameError::ZeroPingId);
        }
        put_control(dst, ControlType::Ping, 0, &self.id.0.to_be_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PING_1: [u8; 12] = [0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 1];

    #[test]
    fn encodes_and_decodes_vector() {
        let mut out = Vec::new();
        let ping = Ping { id: PingId(1) };
        ping.encode(&mut out).unwrap();
        assert_eq!(out, PING_1);
        assert_eq!(Ping::decode(0, &PING_1[8..]).unwrap(), ping);
    }

    #[test]
    fn rejects_bad_pings() {
        assert_eq!(Ping::decode(0, &[0, 0, 0, 0]), Err(FrameError::ZeroPingId));
        assert_eq!(
            Ping::decode(1, &[0, 0, 0, 1]),
            Err(FrameError::BadFlags {
                ty: "PING",
                flags: 1
            })
        );
        assert_eq!(
            Ping::decode(0, &[0, 0, 0, 1, 0]),
            Err(FrameError::BadLength {
                ty: "PING",
                length: 5
            })
        );
        assert_eq!(
            Ping { id: PingId(0) }.encode(&mut Vec::new()),
            Err(FrameError::ZeroPingId)
        );
    }
}
