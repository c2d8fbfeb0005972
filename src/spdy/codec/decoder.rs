//! Bytes to frames.

use bytes::{Buf, Bytes, BytesMut};

use crate::spdy::frame::{
    ControlType, Data, Frame, FrameError, GoAway, Head, HeaderBlock, Headers, Ping, RstStream,
    Settings, SynReply, SynStream, WindowUpdate, HEAD_LEN,
};
use crate::spdy::header_block::{BlockKind, HeaderDecoder, DEFAULT_MAX_DECOMPRESSED};

/// DATA payloads up to this size are copied out of the read buffer (one small allocation), so
/// the buffer stays unshared and is reused by the next read; larger ones are split off it.
pub const COPY_UP_TO: usize = 256;

/// Default largest control frame payload accepted (its length field): 1 MiB, the header-parse
/// limit the port-forward tunnel uses (PROTOCOL.md Appendix A).
pub const DEFAULT_MAX_CONTROL_FRAME: usize = 1 << 20;

/// Splits a byte stream into frames, inflating header blocks with the connection's single
/// inflate context.
///
/// After any error the connection must be abandoned: the stream cannot be resynchronised, and
/// spdystream would end the session the same way (PROTOCOL.md §3.2).
///
/// Header blocks are read as spdystream reads them. A decoder for our own sessions refuses a
/// frame where spdystream refuses it; one that [follows](FrameDecoder::following) a session
/// between two other ends reads what the receiving end reads and refuses nothing a receiver
/// could read.
#[derive(Debug)]
pub struct FrameDecoder {
    max_control_frame: usize,
    /// `None` once released: no more streams will be accepted or opened.
    headers: Option<HeaderDecoder>,
    /// Whether header blocks spdystream refuses are read all the same.
    following: bool,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new()
    }
}

impl FrameDecoder {
    /// A decoder with the default limits: 1 MiB control frames, 64 KiB decompressed blocks.
    pub fn new() -> FrameDecoder {
        FrameDecoder::with_limits(DEFAULT_MAX_CONTROL_FRAME, DEFAULT_MAX_DECOMPRESSED)
    }

    /// A decoder refusing control frames whose payload exceeds `max_control_frame` bytes and
    /// header blocks inflating to more than `max_header_block` bytes.
    pub fn with_limits(max_control_frame: usize, max_header_block: usize) -> FrameDecoder {
        FrameDecoder {
            max_control_frame,
            headers: Some(HeaderDecoder::with_limit(max_header_block)),
            following: false,
        }
    }

    /// A decoder with the limits of [`FrameDecoder::with_limits`] for an observer of a session
    /// between two other ends: a header block that spdystream refuses is read all the same,
    /// as spdystream read it before refusing (the refusal ends the receiver's session, so
    /// nothing it carried takes effect; and a receiver that accepts it reads it this way).
    pub fn following(max_control_frame: usize, max_header_block: usize) -> FrameDecoder {
        FrameDecoder {
            following: true,
            ..FrameDecoder::with_limits(max_control_frame, max_header_block)
        }
    }

    /// Drops the inflate context (its memory goes with it). Afterwards HEADERS frames decode
    /// with an empty block, and SYN_STREAM / SYN_REPLY fail with
    /// [`FrameError::HeaderContextReleased`]: their blocks could no longer be inflated.
    pub fn release_header_context(&mut self) {
        self.headers = None;
    }

    /// Whether [`release_header_context`](Self::release_header_context) was called.
    pub fn header_context_released(&self) -> bool {
        self.headers.is_none()
    }

    /// Whether the inflate context currently holds zlib state.
    pub fn header_context_allocated(&self) -> bool {
        self.headers.as_ref().is_some_and(HeaderDecoder::allocated)
    }

    /// How many bytes the frame at the front of `buf` still lacks, once its head is complete
    /// (`None` while the head itself is incomplete or the frame is whole). A reader that asks
    /// for exactly this much ends its read on the frame boundary, so the payload is completed in
    /// the buffer it started in instead of being moved to a new one.
    pub fn bytes_missing(buf: &[u8]) -> Option<usize> {
        let head = buf.get(..HEAD_LEN)?;
        let total = HEAD_LEN + u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        total.checked_sub(buf.len()).filter(|&missing| missing > 0)
    }

    /// Takes one frame off the front of `buf`.
    ///
    /// Returns `Ok(None)` without consuming anything while `buf` holds less than a whole frame
    /// (after reserving room for the rest of it, so the caller's next read can fill it). DATA
    /// payloads are split off `buf` without copying, except small ones (up to 256 bytes).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < HEAD_LEN {
            return Ok(None);
        }
        let head = Head::parse(buf)?;
        let length = head.length() as usize;
        // Refuse early, before buffering a frame we would refuse anyway.
        match head {
            Head::Data { stream_id, .. } => Data::check_head(stream_id)?,
            Head::Control { .. } if length > self.max_control_frame => {
                return Err(FrameError::FrameTooLarge(length));
            }
            Head::Control { .. } => {}
        }
        let total = HEAD_LEN + length;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        let frame = match head {
            Head::Data {
                stream_id, flags, ..
            } => {
                buf.advance(HEAD_LEN);
                let payload = if length <= COPY_UP_TO {
                    let copy = Bytes::copy_from_slice(&buf[..length]);
                    buf.advance(length);
                    copy
                } else {
                    buf.split_to(length).freeze()
                };
                Frame::Data(Data {
                    stream_id,
                    fin: Data::fin_from_flags(flags),
                    payload,
                })
            }
            Head::Control { ty, flags, .. } => {
                let frame = self.decode_control(ty, flags, &buf[HEAD_LEN..total]);
                buf.advance(total);
                frame?
            }
        };
        Ok(Some(frame))
    }

    fn decode_control(
        &mut self,
        ty: ControlType,
        flags: u8,
        payload: &[u8],
    ) -> Result<Frame, FrameError> {
        Ok(match ty {
            ControlType::SynStream => {
                Frame::SynStream(SynStream::decode(flags, payload, |block| {
                    self.inflate(block, BlockKind::SynStream)
                })?)
            }
            ControlType::SynReply => Frame::SynReply(SynReply::decode(flags, payload, |block| {
                self.inflate(block, BlockKind::SynReply)
            })?),
            ControlType::Headers => Frame::Headers(Headers::decode(flags, payload, |block| {
                match self.headers {
                    // Kubernetes never uses HEADERS, and after release nothing depends on the
                    // peer's context any more: the block is skipped rather than failing.
                    None => Ok(HeaderBlock::new()),
                    Some(_) => self.inflate(block, BlockKind::Headers),
                }
            })?),
            ControlType::RstStream => Frame::RstStream(RstStream::decode(flags, payload)?),
            ControlType::Settings => Frame::Settings(Settings::decode(flags, payload)?),
            ControlType::Ping => Frame::Ping(Ping::decode(flags, payload)?),
            ControlType::GoAway => Frame::GoAway(GoAway::decode(flags, payload)?),
            ControlType::WindowUpdate => Frame::WindowUpdate(WindowUpdate::decode(flags, payload)?),
        })
    }

    fn inflate(&mut self, block: &[u8], kind: BlockKind) -> Result<HeaderBlock, FrameError> {
        let decoder = self
            .headers
            .as_mut()
            .ok_or(FrameError::HeaderContextReleased)?;
        if self.following {
            return Ok(decoder.read(block, kind)?.headers);
        }
        Ok(decoder.decode(block, kind)?)
    }
}
