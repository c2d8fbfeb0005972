//! WINDOW_UPDATE: flow-control credit (PROTOCOL.md §3.2). Kubernetes peers neither send nor
//! honour it; it is parsed so a peer that does send it does not kill the session.
//!
//! ```text
//! control head (type 9, flags 0, length 8) | stream id (4, 0 = session) | delta (4, 31 bits)
//! ```

use bytes::BufMut;

use super::wire::{expect_len, expect_no_flags, put_control, read_u32};
use super::{ControlType, FrameError, StreamId};

/// Largest legal delta, 2^31 - 1.
const MAX_DELTA: u32 = 0x7FFF_FFFF;

/// A WINDOW_UPDATE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowUpdate {
    /// The stream whose window grows; 0 means the session window (SPDY/3.1).
    pub stream_id: StreamId,
    /// Bytes of credit, 1..=2^31-1.
    pub delta: u32,
}

impl WindowUpdate {
    const NAME: &'static str = "WINDOW_UPDATE";

    /// Decodes the payload: flags must be 0 and the length exactly 8. The delta's reserved bit
    /// is dropped; its value is not judged because nobody acts on it.
    pub(crate) fn decode(flags: u8, payload: &[u8]) -> Result<WindowUpdate, FrameError> {
        expect_no_flags(Self::NAME, flags)?;
        expect_len(Self::NAME, payload, 8)?;
        Ok(WindowUpdate {
            stream_id: StreamId::read(payload),
            delta: read_u32(&payload[4..]) & MAX_DELTA,
        })
    }

    /// Appends the whole frame; a delta of 0 or above 2^31 - 1 is refused.
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        if self.delta == 0 || self.delta > MAX_DELTA {
            return Err(FrameError::BadWindowDelta(self.delta));
        }
        let mut payload = [0; 8];
        payload[..4].copy_from_slice(&self.stream_id.get().to_be_bytes());
        payload[4..].copy_from_slice(&self.delta.to_be_bytes());
        put_control(dst, ControlType::WindowUpdate, 0, &payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPDATE_1_65536: [u8; 16] = [
        0x80, 0x03, 0x00, 0x09, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 1, 0, 1, 0, 0,
    ];

    #[test]
    fn encodes_and_decodes_vector() {
        let frame = WindowUpdate {
            stream_id: StreamId::new(1),
            delta: 65536,
        };
        let mut out = Vec::new();
        frame.encode(&mut out).unwrap();
        assert_eq!(out, UPDATE_1_65536);
        assert_eq!(
            WindowUpdate::decode(0, &UPDATE_1_65536[8..]).unwrap(),
            frame
        );
    }

    #[test]
    fn session_window_is_allowed() {
        let frame = WindowUpdate::decode(0, &[0, 0, 0, 0, 0x80, 0, 0, 9]).unwrap();
        assert!(frame.stream_id.is_zero());
        assert_eq!(frame.delta, 9);
    }

    #[test]
    fn rejects_bad_frames() {
        assert_eq!(
            WindowUpdate::decode(0, &[0; 9]),
            Err(FrameError::BadLength {
                ty: "WINDOW_UPDATE",
                length: 9
            })
        );
        assert_eq!(
            WindowUpdate::decode(1, &[0; 8]),
            Err(FrameError::BadFlags {
                ty: "WINDOW_UPDATE",
                flags: 1
            })
        );
        let zero = WindowUpdate {
            stream_id: StreamId::new(1),
            delta: 0,
        };
        assert_eq!(
            zero.encode(&mut Vec::new()),
            Err(FrameError::BadWindowDelta(0))
        );
    }
}
