//! HEADERS: more headers for an open stream (PROTOCOL.md §3.2). Unused by Kubernetes, but it
//! shares the connection's compression context, so it must still be inflated while that
//! context exists.
//!
//! ```text
//! control head (type 8, flags FIN=0x01) | stream id (4) | header block
//! ```

use bytes::BytesMut;

use super::stream_headers;
use super::{ControlType, FrameError, HeaderBlock, StreamId};

/// A HEADERS frame with its header block decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headers {
    /// The stream (never 0).
    pub stream_id: StreamId,
    /// The sender sends nothing more on this stream.
    pub fin: bool,
    /// The headers.
    pub headers: HeaderBlock,
}

impl Headers {
    const NAME: &'static str = "HEADERS";

    /// Decodes the payload; `decode_block` inflates the header block.
    pub(crate) fn decode(
        flags: u8,
        payload: &[u8],
        decode_block: impl FnOnce(&[u8]) -> Result<HeaderBlock, FrameError>,
    ) -> Result<Headers, FrameError> {
        let (stream_id, fin, headers) =
            stream_headers::decode(Self::NAME, flags, payload, decode_block)?;
        Ok(Headers {
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
            ControlType::Headers,
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
        let mut headers = HeaderBlock::new();
        headers.push("a", "b");
        let frame = Headers {
            stream_id: StreamId::new(5),
            fin: false,
            headers,
        };
        let mut out = BytesMut::new();
        frame.encode(&mut out, raw_block).unwrap();
        let expected: &[u8] = &[
            0x80, 0x03, 0x00, 0x08, 0x00, 0x00, 0x00, 0x12, // head, length 4 + 14
            0x00, 0x00, 0x00, 0x05, // stream id
            0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, b'a', 0x00, 0x00, 0x00, 0x01, b'b',
        ];
        assert_eq!(&out[..], expected);
        let decoded = Headers::decode(0, &out[8..], parse_raw(BlockKind::Headers)).unwrap();
        assert_eq!(decoded, frame);
    }

    #[test]
    fn rejects_bad_frames() {
        let never = |_: &[u8]| -> Result<HeaderBlock, FrameError> { unreachable!() };
        assert_eq!(
            Headers::decode(0, &[], never),
            Err(FrameError::BadLength {
                ty: "HEADERS",
                length: 0
            })
        );
        assert_eq!(
            Headers::decode(1, &[0, 0, 0, 0], never),
            Err(FrameError::ZeroStreamId("HEADERS"))
        );
    }
}
