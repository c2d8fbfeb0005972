//! Bytes to frames.

use bytes::{Buf, BytesMut};

use crate::spdy::frame::{
    ControlType, Data, Frame, FrameError, GoAway, Head, HeaderBlock, Headers, Ping, RstStream,
    Settings, SynReply, SynStream, WindowUpdate, HEAD_LEN,
};
use crate::spdy::header_block::{BlockKind, HeaderDecoder, DEFAULT_MAX_DECOMPRESSED};

/// Default largest control frame payload accepted (its length field): 1 MiB, the header-parse
/// limit the port-forward tunnel uses (PROTOCOL.md Appendix A).
pub const DEFAULT_MAX_CONTROL_FRAME: usize = 1 << 20;

/// Splits a byte stream into frames, inflating header blocks with the connection's single
/// inflate context.
///
/// After any error the connection must be abandoned: the stream cannot be resynchronised, and
/// spdystream would end the session the same way (PROTOCOL.md §3.2).
#[derive(Debug)]
pub struct FrameDecoder {
    max_control_frame: usize,
    /// `None` once released: no more streams will be accepted or opened.
    headers: Option<HeaderDecoder>,
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
        }
    }

    /// Drops the inflate context (its memory goes with it). Afterwards HEADERS frames decode
    /// with an empty block, and SYN_STREAM / SYN_REPLY fail with
    /// [`FrameError::HeaderContextReleased`]: their blocks could no longer be inflated.
    pub fn release_header_context(&mut self) {
        self.headers = None;
    }

    /// Whether the inflate context currently holds zlib state.
    pub fn header_context_allocated(&self) -> bool {
        self.headers.as_ref().is_some_and(HeaderDecoder::allocated)
    }

    /// Takes one frame off the front of `buf`.
    ///
    /// Returns `Ok(None)` without consuming anything while `buf` holds less than a whole frame
    /// (after reserving room for the rest of it, so the caller's next read can fill it). DATA
    /// payloads are split off `buf` without copying.
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
                Frame::Data(Data {
                    stream_id,
                    fin: Data::fin_from_flags(flags),
                    payload: buf.split_to(length).freeze(),
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
        Ok(decoder.decode(block, kind)?)
    }
}
