//! SYN_REPLY: accepts a stream (PROTOCOL.md §3.2). Kubernetes servers reply with an empty
//! header block and flags 0.
//!
//! ```text
//! control head (type 2, flags FIN=0x01) | stream id (4) | header block
//! ```

use bytes::BytesMut;

use super::stream_headers;
use super::{ControlType, FrameError, HeaderBlock, StreamId};

/// A SYN_REPLY frame with its header block decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynReply {
    /// The stream being accepted (never 0).
    pub stream_id: StreamId,
    /// The acceptor sends nothing on this stream.
    pub fin: bool,
    /// Reply headers (empty from Kubernetes).
    pub headers: HeaderBlock,
}

impl SynReply {
    const NAME: &'static str = "SYN_REPLY";

    /// Decodes the payload; `decode_block` inflates the header block.
    pub(crate) fn decode(
        flags: u8,
        payload: &[u8],
        decode_block: impl FnOnce(&[u8]) -> Result<HeaderBlock, FrameError>,
    ) -> Result<SynReply, FrameError> {
        let (stream_id, fin, headers) =
            stream_headers::decode(Self::NAME, flags, payload, decode_block)?;
        Ok(SynReply {
            stream_id,
            fin,
            headers,
        })
    }

    /// Appends the whole frame; `encode_block` appends the compressed block.
    pub(crate) fn encode(
        &self,
        dst: &mut BytesMut,
        encode_block: impl FnOnce(&HeaderBlock, &mut BytesMut) -> Result<(), FrameError>,
    ) -> Result<(), FrameError> {
        stream_headers::encode(
            ControlType::SynReply,
            Self::NAME,
            (self.stream_id, self.fin, &self.headers),
            dst,
            encode_block,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::frame::wire::test_support::{parse_raw, raw_block};
    use crate::spdy::header_block::BlockKind;

    #[test]
    fn encodes_layout_with_raw_block() {
        let frame = SynReply {
            stream_id: StreamId::new(3),
            fin: true,
            headers: HeaderBlock::new(),
        };
        let mut out = BytesMut::new();
        frame.encode(&mut out, raw_block).unwrap();
        let expected: &[u8] = &[
            0x80, 0x03, 0x00, 0x02, 0x01, 0x00, 0x00, 0x08, // head, FIN, length 4 + 4
            0x00, 0x00, 0x00, 0x03, // stream id
            0x00, 0x00, 0x00, 0x00, // empty block
        ];
        assert_eq!(&out[..], expected);
        let decoded = SynReply::decode(1, &out[8..], parse_raw(BlockKind::SynReply)).unwrap();
        assert_eq!(decoded, frame);
    }

    #[test]
    fn rejects_bad_frames() {
        let never = |_: &[u8]| -> Result<HeaderBlock, FrameError> { unreachable!() };
        assert_eq!(
            SynReply::decode(0, &[0, 0, 1], never),
            Err(FrameError::BadLength {
                ty: "SYN_REPLY",
                length: 3
            })
        );
        assert_eq!(
            SynReply::decode(0, &[0x80, 0, 0, 0, 0, 0, 0, 0], never),
            Err(FrameError::ZeroStreamId("SYN_REPLY"))
        );
        let zero = SynReply {
            stream_id: StreamId::ZERO,
            fin: false,
            headers: HeaderBlock::new(),
        };
        assert_eq!(
            zero.encode(&mut BytesMut::new(), raw_block),
            Err(FrameError::ZeroStreamId("SYN_REPLY"))
        );
    }
}
