//! Frames to bytes.

use bytes::BytesMut;

use crate::spdy::frame::{Data, Frame, FrameError, HeaderBlock, StreamId, MAX_FRAME_LEN};
use crate::spdy::header_block::{BlockKind, HeaderEncoder};

/// Serialises frames, compressing header blocks with the connection's single deflate context.
#[derive(Debug)]
pub struct FrameEncoder {
    /// `None` once released: no more header blocks will be sent.
    headers: Option<HeaderEncoder>,
}

impl Default for FrameEncoder {
    fn default() -> Self {
        FrameEncoder::new()
    }
}

impl FrameEncoder {
    /// An encoder whose deflate context is allocated on the first header block.
    pub fn new() -> FrameEncoder {
        FrameEncoder {
            headers: Some(HeaderEncoder::new()),
        }
    }

    /// Drops the deflate context. Encoding SYN_STREAM, SYN_REPLY or HEADERS afterwards fails
    /// with [`FrameError::HeaderContextReleased`].
    pub fn release_header_context(&mut self) {
        self.headers = None;
    }

    /// Whether the deflate context currently holds zlib state.
    pub fn header_context_allocated(&self) -> bool {
        self.headers.as_ref().is_some_and(HeaderEncoder::allocated)
    }

    /// Appends one whole frame to `dst`, so the caller can send a control frame with a single
    /// write (PROTOCOL.md §3.3 recommends it: a peer's inflater may rely on it).
    ///
    /// Frames the peer would refuse (zero stream ids, PING id 0, RST status 0, forbidden header
    /// names, ...) are refused here, before the deflate context sees their block. On error
    /// nothing is appended.
    pub fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        match frame {
            Frame::Data(f) => f.encode(dst),
            Frame::SynStream(f) => {
                let headers = Self::context(&mut self.headers)?;
                f.encode(dst, |block, dst| {
                    deflate(headers, block, BlockKind::SynStream, dst)
                })
            }
            Frame::SynReply(f) => {
                let headers = Self::context(&mut self.headers)?;
                f.encode(dst, |block, dst| {
                    deflate(headers, block, BlockKind::SynReply, dst)
                })
            }
            Frame::Headers(f) => {
                let headers = Self::context(&mut self.headers)?;
                f.encode(dst, |block, dst| {
                    deflate(headers, block, BlockKind::Headers, dst)
                })
            }
            Frame::RstStream(f) => f.encode(dst),
            Frame::Settings(f) => f.encode(dst),
            Frame::Ping(f) => f.encode(dst),
            Frame::GoAway(f) => f.encode(dst),
            Frame::WindowUpdate(f) => f.encode(dst),
        }
    }

    /// Appends just the 8-byte header of a DATA frame carrying `len` bytes, for a caller that
    /// writes the payload from its own buffer (a vectored write) instead of copying it.
    ///
    /// # Panics
    ///
    /// If `stream_id` is zero or `len` exceeds [`MAX_FRAME_LEN`]: both are caller bugs that
    /// would otherwise put a frame on the wire that kills the session or desynchronises it.
    pub fn encode_data_head(stream_id: StreamId, fin: bool, len: usize, dst: &mut BytesMut) {
        assert!(
            len <= MAX_FRAME_LEN,
            "DATA payload of {len} bytes exceeds the 24-bit length"
        );
        assert!(!stream_id.is_zero(), "DATA frame on stream 0");
        Data::encode_head(stream_id, fin, len, dst).expect("checked above");
    }

    fn context(headers: &mut Option<HeaderEncoder>) -> Result<&mut HeaderEncoder, FrameError> {
        headers.as_mut().ok_or(FrameError::HeaderContextReleased)
    }
}

/// Checks `block` against what the peer refuses for `kind`, then compresses it into `dst`.
fn deflate(
    encoder: &mut HeaderEncoder,
    block: &HeaderBlock,
    kind: BlockKind,
    dst: &mut BytesMut,
) -> Result<(), FrameError> {
    block.check_outgoing(kind)?;
    encoder.encode(block, dst)?;
    Ok(())
}
