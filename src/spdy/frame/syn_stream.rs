//! SYN_STREAM: opens a stream (PROTOCOL.md §3.2).
//!
//! ```text
//! control head (type 1, flags FIN=0x01 UNIDIRECTIONAL=0x02)
//! stream id (4) | associated stream id (4) | priority (3 bits) + 5 unused | slot (1) | header block
//! ```
//!
//! Kubernetes sends flags 0, priority 0, associated id 0 and slot 0.

use bytes::BytesMut;

use super::wire::{put_with_block, split_fixed};
use super::{ControlType, FrameError, HeaderBlock, StreamId, FLAG_FIN};

/// `FLAG_UNIDIRECTIONAL`: the receiver must not send on this stream.
const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// Bytes before the header block.
const FIXED_LEN: usize = 10;
/// Largest value of the 3-bit priority field.
const MAX_PRIORITY: u8 = 7;

/// A SYN_STREAM frame with its header block decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynStream {
    /// The new stream's id (never 0; odd when a client opens it).
    pub stream_id: StreamId,
    /// The stream this one is associated with (server push), usually 0.
    pub associated_stream_id: StreamId,
    /// 0 (highest) ..= 7 (lowest).
    pub priority: u8,
    /// Credential slot (SPDY/3), always 0 here.
    pub slot: u8,
    /// The opener sends nothing more on this stream.
    pub fin: bool,
    /// The receiver must not send on this stream.
    pub unidirectional: bool,
    /// The stream's headers, e.g. `streamtype`.
    pub headers: HeaderBlock,
}

impl SynStream {
    const NAME: &'static str = "SYN_STREAM";

    /// A stream opened as Kubernetes clients open theirs: no association, priority 0, no
    /// flags.
    pub fn new(stream_id: StreamId, headers: HeaderBlock) -> SynStream {
        SynStream {
            stream_id,
            associated_stream_id: StreamId::ZERO,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers,
        }
    }

    /// Decodes the payload; `decode_block` turns the compressed block into headers (it owns the
    /// connection's inflate context). Unknown flag bits and the unused priority bits are ignored.
    pub(crate) fn decode(
        flags: u8,
        payload: &[u8],
        decode_block: impl FnOnce(&[u8]) -> Result<HeaderBlock, FrameError>,
    ) -> Result<SynStream, FrameError> {
        let (fixed, block) = split_fixed(Self::NAME, payload, FIXED_LEN)?;
        let stream_id = StreamId::read(fixed);
        if stream_id.is_zero() {
            return Err(FrameError::ZeroStreamId(Self::NAME));
        }
        Ok(SynStream {
            stream_id,
            associated_stream_id: StreamId::read(&fixed[4..]),
            priority: fixed[8] >> 5,
            slot: fixed[9],
            fin: flags & FLAG_FIN != 0,
            unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
            headers: decode_block(block)?,
        })
    }

    /// Appends the whole frame; `encode_block` appends the compressed block. Checks run before
    /// the block is compressed, so a refused frame leaves the shared deflate context untouched.
    pub(crate) fn encode(
        &self,
        dst: &mut BytesMut,
        encode_block: impl FnOnce(&HeaderBlock, &mut BytesMut) -> Result<(), FrameError>,
    ) -> Result<(), FrameError> {
        if self.stream_id.is_zero() {
            return Err(FrameError::ZeroStreamId(Self::NAME));
        }
        if self.priority > MAX_PRIORITY {
            return Err(FrameError::BadPriority(self.priority));
        }
        let mut fixed = [0; FIXED_LEN];
        fixed[..4].copy_from_slice(&self.stream_id.get().to_be_bytes());
        fixed[4..8].copy_from_slice(&self.associated_stream_id.get().to_be_bytes());
        fixed[8] = self.priority << 5;
        fixed[9] = self.slot;
        let mut flags = 0;
        if self.fin {
            flags |= FLAG_FIN;
        }
        if self.unidirectional {
            flags |= FLAG_UNIDIRECTIONAL;
        }
        put_with_block(
            dst,
            ControlType::SynStream,
            flags,
            &fixed,
            &self.headers,
            encode_block,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::frame::wire::test_support::{parse_raw, raw_block};
    use crate::spdy::header_block::BlockKind;

    fn sample() -> SynStream {
        let mut headers = HeaderBlock::new();
        headers.push("streamtype", "error");
        SynStream {
            stream_id: StreamId::new(1),
            associated_stream_id: StreamId::ZERO,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers,
        }
    }

    #[test]
    fn encodes_layout_with_raw_block() {
        let mut out = BytesMut::new();
        sample().encode(&mut out, raw_block).unwrap();
        let expected: &[u8] = &[
            0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x25, // head, length 10 + 27
            0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // fixed fields
            0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0A, b's', b't', b'r', b'e', b'a', b'm',
            b't', b'y', b'p', b'e', 0x00, 0x00, 0x00, 0x05, b'e', b'r', b'r', b'o', b'r',
        ];
        assert_eq!(&out[..], expected);
        let decoded = SynStream::decode(0, &out[8..], parse_raw(BlockKind::SynStream)).unwrap();
        assert_eq!(decoded, sample());
    }

    #[test]
    fn flags_priority_and_ids() {
        let frame = SynStream {
            stream_id: StreamId::new(0x7FFF_FFFF),
            associated_stream_id: StreamId::new(2),
            priority: 7,
            slot: 9,
            fin: true,
            unidirectional: true,
            headers: HeaderBlock::new(),
        };
        let mut out = BytesMut::new();
        frame.encode(&mut out, raw_block).unwrap();
        assert_eq!(out[4], 0x03);
        assert_eq!(&out[8..18], &[0x7F, 0xFF, 0xFF, 0xFF, 0, 0, 0, 2, 0xE0, 9]);
        let decoded =
            SynStream::decode(out[4], &out[8..], parse_raw(BlockKind::SynStream)).unwrap();
        assert_eq!(decoded, frame);
    }

    #[test]
    fn rejects_bad_frames() {
        let never = |_: &[u8]| -> Result<HeaderBlock, FrameError> { unreachable!() };
        assert_eq!(
            SynStream::decode(0, &[0; 9], never),
            Err(FrameError::BadLength {
                ty: "SYN_STREAM",
                length: 9
            })
        );
        assert_eq!(
            SynStream::decode(0, &[0; 12], never),
            Err(FrameError::ZeroStreamId("SYN_STREAM"))
        );
        let mut out = BytesMut::new();
        let mut zero = sample();
        zero.stream_id = StreamId::ZERO;
        assert_eq!(
            zero.encode(&mut out, raw_block),
            Err(FrameError::ZeroStreamId("SYN_STREAM"))
        );
        let mut low = sample();
        low.priority = 8;
        assert_eq!(
            low.encode(&mut out, raw_block),
            Err(FrameError::BadPriority(8))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn failed_block_leaves_nothing_behind() {
        let mut out = BytesMut::from(&b"xy"[..]);
        let failing = |_: &HeaderBlock, dst: &mut BytesMut| {
            dst.extend_from_slice(b"partial");
            Err(FrameError::HeaderContextReleased)
        };
        assert_eq!(
            sample().encode(&mut out, failing),
            Err(FrameError::HeaderContextReleased)
        );
        assert_eq!(&out[..], b"xy");
    }
}
