//! DATA: a chunk of a stream's bytes (PROTOCOL.md §3.2).
//!
//! ```text
//! 0 | stream id (31) | flags (8) | length (24) | payload
//! ```
//!
//! The codec decodes DATA itself so the payload can be split off the read buffer without a
//! copy; this file only knows the header and the validation rules.

use bytes::{BufMut, Bytes};

use super::{FrameError, Head, StreamId, FLAG_FIN, MAX_FRAME_LEN};

/// A DATA frame. An empty payload with `fin` is how a sender half-closes its direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// The stream the bytes belong to (never 0).
    pub stream_id: StreamId,
    /// Last frame the sender sends on this stream.
    pub fin: bool,
    /// The bytes; up to [`MAX_FRAME_LEN`].
    pub payload: Bytes,
}

impl Data {
    /// Checks a received DATA header: stream id 0 is a protocol error. Unknown flag bits are
    /// ignored, as spdystream does.
    pub(crate) fn check_head(stream_id: StreamId) -> Result<(), FrameError> {
        if stream_id.is_zero() {
            return Err(FrameError::ZeroStreamId("DATA"));
        }
        Ok(())
    }

    /// Whether the flags byte of a received DATA frame carries FIN.
    pub(crate) fn fin_from_flags(flags: u8) -> bool {
        flags & FLAG_FIN != 0
    }

    /// Appends the 8-byte header of a DATA frame whose payload (`len` bytes) the caller writes
    /// separately.
    pub(crate) fn encode_head(
        stream_id: StreamId,
        fin: bool,
        len: usize,
        dst: &mut impl BufMut,
    ) -> Result<(), FrameError> {
        Data::check_head(stream_id)?;
        if len > MAX_FRAME_LEN {
            return Err(FrameError::FrameTooLarge(len));
        }
        Head::Data {
            stream_id,
            flags: if fin { FLAG_FIN } else { 0 },
            length: len as u32,
        }
        .encode(dst)
    }

    /// Appends the whole frame (header and a copy of the payload).
    pub(crate) fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        Data::encode_head(self.stream_id, self.fin, self.payload.len(), dst)?;
        dst.put_slice(&self.payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(data: &Data) -> Vec<u8> {
        let mut out = Vec::new();
        data.encode(&mut out).unwrap();
        out
    }

    #[test]
    fn encodes_payload() {
        let data = Data {
            stream_id: StreamId::new(3),
            fin: false,
            payload: Bytes::from_static(b"foo\n"),
        };
        assert_eq!(
            encoded(&data),
            [0, 0, 0, 3, 0, 0, 0, 4, b'f', b'o', b'o', b'\n']
        );
    }

    #[test]
    fn encodes_empty_fin() {
        let data = Data {
            stream_id: StreamId::new(3),
            fin: true,
            payload: Bytes::new(),
        };
        assert_eq!(encoded(&data), [0, 0, 0, 3, 1, 0, 0, 0]);
    }

    #[test]
    fn refuses_stream_zero_and_oversized_payloads() {
        let mut out = Vec::new();
        assert_eq!(
            Data::encode_head(StreamId::ZERO, false, 1, &mut out),
            Err(FrameError::ZeroStreamId("DATA"))
        );
        assert_eq!(
            Data::encode_head(StreamId::new(1), false, MAX_FRAME_LEN + 1, &mut out),
            Err(FrameError::FrameTooLarge(MAX_FRAME_LEN + 1))
        );
        assert!(out.is_empty());
        assert_eq!(
            Data::check_head(StreamId::ZERO),
            Err(FrameError::ZeroStreamId("DATA"))
        );
    }

    #[test]
    fn fin_flag_ignores_unknown_bits() {
        assert!(Data::fin_from_flags(0x01));
        assert!(Data::fin_from_flags(0x03));
        assert!(!Data::fin_from_flags(0x02));
    }
}
