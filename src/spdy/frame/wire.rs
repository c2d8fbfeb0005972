//! Byte-level helpers shared by the frame files.

use bytes::{BufMut, BytesMut};

use super::head::patch_length;
use super::{ControlType, FrameError, Head, HeaderBlock, HEAD_LEN};

/// Reads a big-endian `u32` from the first four bytes; callers have checked the length.
pub(crate) fn read_u32(src: &[u8]) -> u32 {
    u32::from_be_bytes([src[0], src[1], src[2], src[3]])
}

/// Fails unless a fixed-size payload has exactly `len` bytes.
pub(crate) fn expect_len(ty: &'static str, payload: &[u8], len: usize) -> Result<(), FrameError> {
    if payload.len() != len {
        return Err(FrameError::BadLength {
            ty,
            length: payload.len() as u32,
        });
    }
    Ok(())
}

/// Fails unless `flags` is 0 (PING, GOAWAY, WINDOW_UPDATE).
pub(crate) fn expect_no_flags(ty: &'static str, flags: u8) -> Result<(), FrameError> {
    if flags != 0 {
        return Err(FrameError::BadFlags { ty, flags });
    }
    Ok(())
}

/// Splits a header-carrying payload into its fixed fields (`fixed` bytes) and the compressed
/// header block.
pub(crate) fn split_fixed<'a>(
    ty: &'static str,
    payload: &'a [u8],
    fixed: usize,
) -> Result<(&'a [u8], &'a [u8]), FrameError> {
    if payload.len() < fixed {
        return Err(FrameError::BadLength {
            ty,
            length: payload.len() as u32,
        });
    }
    Ok(payload.split_at(fixed))
}

/// Appends a control frame whose whole payload is known up front.
pub(crate) fn put_control(
    dst: &mut impl BufMut,
    ty: ControlType,
    flags: u8,
    payload: &[u8],
) -> Result<(), FrameError> {
    Head::Control {
        ty,
        flags,
        length: payload.len() as u32,
    }
    .encode(dst)?;
    dst.put_slice(payload);
    Ok(())
}

/// Appends a header-carrying control frame: head, `fixed` fields, then whatever `encode_block`
/// appends (the compressed block, written in place to avoid a copy). The length field is
/// patched afterwards. On error nothing is left appended to `dst`.
pub(crate) fn put_with_block(
    dst: &mut BytesMut,
    ty: ControlType,
    flags: u8,
    fixed: &[u8],
    block: &HeaderBlock,
    encode_block: impl FnOnce(&HeaderBlock, &mut BytesMut) -> Result<(), FrameError>,
) -> Result<(), FrameError> {
    let start = dst.len();
    let result = put_control(dst, ty, flags, fixed)
        .and_then(|()| encode_block(block, dst))
        .and_then(|()| {
            // Cannot fail for blocks the header encoder accepts (it bounds their size), but a
            // wrong length field would desynchronise the peer, so it is checked anyway.
            let length = dst.len() - start - HEAD_LEN;
            patch_length(&mut dst[start..], length)
        });
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A stand-in for the zlib codec: frame files test their layout with the raw block.

    use bytes::BytesMut;

    use crate::spdy::frame::{FrameError, HeaderBlock};
    use crate::spdy::header_block::BlockKind;

    /// Appends the uncompressed block.
    pub(crate) fn raw_block(block: &HeaderBlock, dst: &mut BytesMut) -> Result<(), FrameError> {
        let mut raw = Vec::new();
        block.write_raw(&mut raw)?;
        dst.extend_from_slice(&raw);
        Ok(())
    }

    /// Parses an uncompressed block.
    pub(crate) fn parse_raw(
        kind: BlockKind,
    ) -> impl FnOnce(&[u8]) -> Result<HeaderBlock, FrameError> {
        move |raw| Ok(HeaderBlock::parse_raw(raw, kind)?)
    }
}
