//! RST_STREAM: aborts one stream in both directions (PROTOCOL.md §3.2).
//!
//! ```text
//! control head (type 3, length 8) | stream id (4) | status (4)
//! ```

use bytes::BufMut;

use super::wire::{expect_len, put_control, read_u32};
use super::{ControlType, FrameError, StreamId};

/// RST_STREAM status codes. Kubernetes only sends `Cancel` (and spdystream `ProtocolError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RstStatus {
    /// 1
    ProtocolError,
    /// 2
    InvalidStream,
    /// 3
    RefusedStream,
    /// 4
    UnsupportedVersion,
    /// 5: what every Kubernetes `Reset` sends.
    Cancel,
    /// 6
    InternalError,
    /// 7
    FlowControlError,
    /// 8
    StreamInUse,
    /// 9
    StreamAlreadyClosed,
    /// 10
    InvalidCredentials,
    /// 11
    FrameTooLarge,
    /// Any other code. `Unknown(0)` is not valid on the wire: it is refused on read and write.
    Unknown(u32),
}

impl RstStatus {
    /// Maps a wire code; codes without a name become `Unknown`.
    pub fn from_code(code: u32) -> RstStatus {
        match code {
            1 => RstStatus::ProtocolError,
            2 => RstStatus::InvalidStream,
            3 => RstStatus::RefusedStream,
            4 => RstStatus::UnsupportedVersion,
            5 => RstStatus::Cancel,
            6 => RstStatus::InternalError,
            7 => RstStatus::FlowControlError,
            8 => RstStatus::StreamInUse,
            9 => RstStatus::StreamAlreadyClosed,
            10 => RstStatus::InvalidCredentials,
            11 => RstStatus::FrameTooLarge,
            other => RstStatus::Unknown(other),
        }
    }

    /// The wire code.
    pub fn code(self) -> u32 {
        match self {
            RstStatus::ProtocolError => 1,
            RstStatus::InvalidStream => 2,
            RstStatus::RefusedStream => 3,
            RstStatus::UnsupportedVersion => 4,
            RstStatus::Cancel => 5,
            RstStatus::InternalError => 6,
            RstStatus::FlowControlError => 7,
            RstStatus::StreamInUse => 8,
            RstStatus::StreamAlreadyClosed => 9,
            RstStatus::InvalidCredentials => 10,
            RstStatus::FrameTooLarge => 11,
            RstStatus::Unknown(code) => code,
        }
    }
}

/// An RST_STREAM frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RstStream {
    /// The stream being reset (never 0).
    pub stream_id: StreamId,
    /// Why.
    pub status: RstStatus,
}

impl RstStream {
    const NAME: &'static str = "RST_STREAM";

    /// Decodes the payload of an RST_STREAM. Flags are not judged (spdystream does not either).
    pub(crate) fn decode(_flags: u8, payload: &[u8]) -> Result<RstStream, FrameError> {
        expect_len(Self::NAME, payload, 8)?;
        let frame = RstStream {
            stream_id: StreamId::read(payload),
            status: RstStatus::from_code(read_u32(&payload[4..])),
        };
        frame.check()?;
        Ok(frame)
    }

    /// Appends the whole frame.
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        self.check()?;
        let mut payload = [0; 8];
        payload[..4].copy_from_slice(&self.stream_id.get().to_be_bytes());
        payload[4..].copy_from_slice(&self.status.code().to_be_bytes());
        put_control(dst, ControlType::RstStream, 0, &payload)
    }

    fn check(&self) -> Result<(), FrameError> {
        if self.stream_id.is_zero() {
            return Err(FrameError::ZeroStreamId(Self::NAME));
        }
        if self.status.code() == 0 {
            return Err(FrameError::ZeroRstStatus);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANCEL_5: [u8; 16] = [
        0x80, 0x03, 0x00, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,
        0x05,
    ];

    #[test]
    fn encodes_cancel_vector() {
        let mut out = Vec::new();
        let frame = RstStream {
            stream_id: StreamId::new(5),
            status: RstStatus::Cancel,
        };
        frame.encode(&mut out).unwrap();
        assert_eq!(out, CANCEL_5);
        assert_eq!(RstStream::decode(0, &CANCEL_5[8..]).unwrap(), frame);
    }

    #[test]
    fn status_codes_round_trip() {
        for code in 0..=12 {
            assert_eq!(RstStatus::from_code(code).code(), code);
        }
        assert_eq!(RstStatus::from_code(5), RstStatus::Cancel);
        assert_eq!(RstStatus::from_code(99), RstStatus::Unknown(99));
    }

    #[test]
    fn rejects_bad_payloads() {
        assert_eq!(
            RstStream::decode(0, &[0, 0, 0, 5, 0, 0, 0]),
            Err(FrameError::BadLength {
                ty: "RST_STREAM",
                length: 7
            })
        );
        assert_eq!(
            RstStream::decode(0, &[0, 0, 0, 0, 0, 0, 0, 5]),
            Err(FrameError::ZeroStreamId("RST_STREAM"))
        );
        assert_eq!(
            RstStream::decode(0, &[0, 0, 0, 5, 0, 0, 0, 0]),
            Err(FrameError::ZeroRstStatus)
        );
    }

    #[test]
    fn refuses_to_encode_status_zero() {
        let frame = RstStream {
            stream_id: StreamId::new(1),
            status: RstStatus::Unknown(0),
        };
        let mut out = Vec::new();
        assert_eq!(frame.encode(&mut out), Err(FrameError::ZeroRstStatus));
        assert!(out.is_empty());
    }
}
