//! The layout SYN_REPLY and HEADERS share (PROTOCOL.md §3.2): a stream id and a header block,
//! with FIN the only flag.
//!
//! ```text
//! control head (flags FIN=0x01) | stream id (4) | header block
//! ```

use bytes::BytesMut;

use super::wire::{put_with_block, split_fixed};
use super::{ControlType, FrameError, HeaderBlock, StreamId, FLAG_FIN};

/// Bytes before the header block.
const FIXED_LEN: usize = 4;

/// Decodes the payload of frame type `name` into its stream id (never 0), FIN and headers;
/// `decode_block` inflates the header block.
pub(super) fn decode(
    name: &'static str,
    flags: u8,
    payload: &[u8],
    decode_block: impl FnOnce(&[u8]) -> Result<HeaderBlock, FrameError>,
) -> Result<(StreamId, bool, HeaderBlock), FrameError> {
    let (fixed, block) = split_fixed(name, payload, FIXED_LEN)?;
    let stream_id = StreamId::read(fixed);
    if stream_id.is_zero() {
        return Err(FrameError::ZeroStreamId(name));
    }
    Ok((stream_id, flags & FLAG_FIN != 0, decode_block(block)?))
}

/// Appends a whole frame of type `ty`; `encode_block` appends the compressed block.
pub(super) fn encode(
    ty: ControlType,
    name: &'static str,
    (stream_id, fin, headers): (StreamId, bool, &HeaderBlock),
    dst: &mut BytesMut,
    encode_block: impl FnOnce(&HeaderBlock, &mut BytesMut) -> Result<(), FrameError>,
) -> Result<(), FrameError> {
    if stream_id.is_zero() {
        return Err(FrameError::ZeroStreamId(name));
    }
    let flags = if fin { FLAG_FIN } else { 0 };
    let fixed = stream_id.get().to_be_bytes();
    put_with_block(dst, ty, flags, &fixed, headers, encode_block)
}
