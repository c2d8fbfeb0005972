//! GOAWAY: the sender will start no more streams and process none above the given id
//! (PROTOCOL.md §3.2, §3.4).
//!
//! ```text
//! control head (type 7, flags 0, length 8) | last good stream id (4) | status (4)
//! ```

use bytes::BufMut;

use super::wire::{expect_len, expect_no_flags, put_control, read_u32};
use super::{ControlType, FrameError, StreamId};

/// GOAWAY status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoAwayStatus {
    /// 0: a normal shutdown (what Kubernetes sends).
    Ok,
    /// 1
    ProtocolError,
    /// 2
    InternalError,
    /// Any other code.
    Unknown(u32),
}

impl GoAwayStatus {
    /// Maps a wire code; codes without a name become `Unknown`.
    pub fn from_code(code: u32) -> GoAwayStatus {
        match code {
            0 => GoAwayStatus::Ok,
            1 => GoAwayStatus::ProtocolError,
            2 => GoAwayStatus::InternalError,
            other => GoAwayStatus::Unknown(other),
        }
    }

    /// The wire code.
    pub fn code(self) -> u32 {
        match self {
            GoAwayStatus::Ok => 0,
            GoAwayStatus::ProtocolError => 1,
            GoAwayStatus::InternalError => 2,
            GoAwayStatus::Unknown(code) => code,
        }
    }
}

/// A GOAWAY frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoAway {
    /// Highest peer-initiated stream the sender accepted (0 if none).
    pub last_good_stream_id: StreamId,
    /// Why the session ends.
    pub status: GoAwayStatus,
}

impl GoAway {
    const NAME: &'static str = "GOAWAY";

    /// Decodes the payload of a GOAWAY: flags must be 0 and the length exactly 8.
    pub(crate) fn decode(flags: u8, payload: &[u8]) -> Result<GoAway, FrameError> {
        expect_no_flags(Self::NAME, flags)?;
        expect_len(Self::NAME, payload, 8)?;
        Ok(GoAway {
            last_good_stream_id: StreamId::read(payload),
            status: GoAwayStatus::from_code(read_u32(&payload[4..])),
        })
    }

    /// Appends the whole frame.
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        let mut payload = [0; 8];
        payload[..4].copy_from_slice(&self.last_good_stream_id.get().to_be_bytes());
        payload[4..].copy_from_slice(&self.status.code().to_be_bytes());
        put_control(dst, ControlType::GoAway, 0, &payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOAWAY_OK: [u8; 16] = [
        0x80, 0x03, 0x00, 0x07, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn encodes_and_decodes_vector() {
        let frame = GoAway {
            last_good_stream_id: StreamId::ZERO,
            status: GoAwayStatus::Ok,
        };
        let mut out = Vec::new();
        frame.encode(&mut out).unwrap();
        assert_eq!(out, GOAWAY_OK);
        assert_eq!(GoAway::decode(0, &GOAWAY_OK[8..]).unwrap(), frame);
    }

    #[test]
    fn decodes_status_and_masks_reserved_bit() {
        let frame = GoAway::decode(0, &[0x80, 0, 0, 7, 0, 0, 0, 2]).unwrap();
        assert_eq!(frame.last_good_stream_id, StreamId::new(7));
        assert_eq!(frame.status, GoAwayStatus::InternalError);
        for code in 0..5 {
            assert_eq!(GoAwayStatus::from_code(code).code(), code);
        }
    }

    #[test]
    fn rejects_bad_lengths_and_flags() {
        assert_eq!(
            GoAway::decode(0, &[0, 0, 0, 0]),
            Err(FrameError::BadLength {
                ty: "GOAWAY",
                length: 4
            })
        );
        assert_eq!(
            GoAway::decode(0, &[0; 12]),
            Err(FrameError::BadLength {
                ty: "GOAWAY",
                length: 12
            })
        );
        assert_eq!(
            GoAway::decode(2, &[0; 8]),
            Err(FrameError::BadFlags {
                ty: "GOAWAY",
                flags: 2
            })
        );
    }
}
