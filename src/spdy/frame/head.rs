//! The 8-byte header that starts every frame (PROTOCOL.md §3.2).
//!
//! ```text
//! control: 1 | version (15) | type (16) | flags (8) | length (24)
//! data:    0 | stream id (31)           | flags (8) | length (24)
//! ```

use bytes::BufMut;

use super::{FrameError, StreamId, MAX_FRAME_LEN};

/// Length of every frame header.
pub const HEAD_LEN: usize = 8;

/// The only protocol version spoken here (SPDY/3 framing, with SPDY/3.1 semantics).
pub const SPDY_VERSION: u16 = 3;

/// The top bit of the first byte tells control frames from DATA frames.
const CONTROL_BIT: u8 = 0x80;

/// The control frame types this implementation understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ControlType {
    /// Opens a stream.
    SynStream = 1,
    /// Accepts a stream.
    SynReply = 2,
    /// Aborts a stream.
    RstStream = 3,
    /// Session parameters (ignored by Kubernetes peers).
    Settings = 4,
    /// Liveness check, echoed by the peer.
    Ping = 6,
    /// Ends the session.
    GoAway = 7,
    /// More headers for an open stream (unused by Kubernetes).
    Headers = 8,
    /// Flow-control credit (ignored by Kubernetes peers).
    WindowUpdate = 9,
}

impl ControlType {
    /// Maps a wire type code; unknown codes (5 NOOP, 10 CREDENTIAL, ...) are an error because
    /// spdystream ends the session on them.
    pub fn from_code(code: u16) -> Result<ControlType, FrameError> {
        Ok(match code {
            1 => ControlType::SynStream,
            2 => ControlType::SynReply,
            3 => ControlType::RstStream,
            4 => ControlType::Settings,
            6 => ControlType::Ping,
            7 => ControlType::GoAway,
            8 => ControlType::Headers,
            9 => ControlType::WindowUpdate,
            other => return Err(FrameError::UnknownControlType(other)),
        })
    }

    /// The wire type code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The name used in the specification and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ControlType::SynStream => "SYN_STREAM",
            ControlType::SynReply => "SYN_REPLY",
            ControlType::RstStream => "RST_STREAM",
            ControlType::Settings => "SETTINGS",
            ControlType::Ping => "PING",
            ControlType::GoAway => "GOAWAY",
            ControlType::Headers => "HEADERS",
            ControlType::WindowUpdate => "WINDOW_UPDATE",
        }
    }
}

/// A parsed frame header. `length` counts the bytes that follow the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// A control frame header (version already checked to be 3).
    Control {
        /// Frame type.
        ty: ControlType,
        /// Type-specific flags.
        flags: u8,
        /// Payload length (24 bits).
        length: u32,
    },
    /// A DATA frame header.
    Data {
        /// The stream the payload belongs to (not checked for zero here).
        stream_id: StreamId,
        /// `FLAG_FIN` and any unknown bits, as received.
        flags: u8,
        /// Payload length (24 bits).
        length: u32,
    },
}

impl Head {
    /// Parses the first [`HEAD_LEN`] bytes of `src`.
    ///
    /// Fails on fewer than 8 bytes, a control version other than 3, or an unknown control type.
    pub fn parse(src: &[u8]) -> Result<Head, FrameError> {
        let Some(head) = src.get(..HEAD_LEN) else {
            return Err(FrameError::ShortHead(src.len()));
        };
        let flags = head[4];
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]);
        if head[0] & CONTROL_BIT == 0 {
            return Ok(Head::Data {
                stream_id: StreamId::read(head),
                flags,
                length,
            });
        }
        let version = u16::from_be_bytes([head[0] & !CONTROL_BIT, head[1]]);
        if version != SPDY_VERSION {
            return Err(FrameError::UnsupportedVersion(version));
        }
        let ty = ControlType::from_code(u16::from_be_bytes([head[2], head[3]]))?;
        Ok(Head::Control { ty, flags, length })
    }

    /// The payload length that follows the header.
    pub fn length(&self) -> u32 {
        match *self {
            Head::Control { length, .. } | Head::Data { length, .. } => length,
        }
    }

    /// The flags byte.
    pub fn flags(&self) -> u8 {
        match *self {
            Head::Control { flags, .. } | Head::Data { flags, .. } => flags,
        }
    }

    /// The header's wire bytes; fails if `length` does not fit the 24-bit field.
    pub fn to_bytes(&self) -> Result<[u8; HEAD_LEN], FrameError> {
        let length = self.length();
        if length as usize > MAX_FRAME_LEN {
            return Err(FrameError::FrameTooLarge(length as usize));
        }
        let [_, l0, l1, l2] = length.to_be_bytes();
        let [b0, b1, b2, b3] = match *self {
            Head::Control { ty, .. } => {
                let [v0, v1] = SPDY_VERSION.to_be_bytes();
                let [t0, t1] = ty.code().to_be_bytes();
                [v0 | CONTROL_BIT, v1, t0, t1]
            }
            Head::Data { stream_id, .. } => stream_id.get().to_be_bytes(),
        };
        Ok([b0, b1, b2, b3, self.flags(), l0, l1, l2])
    }

    /// Appends the header's wire bytes to `dst`; fails if `length` does not fit 24 bits.
    pub fn encode(&self, dst: &mut impl BufMut) -> Result<(), FrameError> {
        dst.put_slice(&self.to_bytes()?);
        Ok(())
    }
}

/// Overwrites the 24-bit length field of a header already written at the start of `head`.
/// Header-carrying frames learn their length only after the block is compressed in place.
pub(crate) fn patch_length(head: &mut [u8], length: usize) -> Result<(), FrameError> {
    if length > MAX_FRAME_LEN {
        return Err(FrameError::FrameTooLarge(length));
    }
    head[5..HEAD_LEN].copy_from_slice(&(length as u32).to_be_bytes()[1..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_control_head() {
        let head = Head::parse(&[0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04]).unwrap();
        assert_eq!(
            head,
            Head::Control {
                ty: ControlType::Ping,
                flags: 0,
                length: 4
            }
        );
    }

    #[test]
    fn parses_data_head_and_ignores_extra_bytes() {
        let head = Head::parse(&[0x00, 0x00, 0x00, 0x03, 0x01, 0x01, 0x02, 0x03, 0xAA]).unwrap();
        assert_eq!(
            head,
            Head::Data {
                stream_id: StreamId::new(3),
                flags: 1,
                length: 0x010203
            }
        );
    }

    #[test]
    fn rejects_short_input() {
        assert_eq!(Head::parse(&[0x80, 3, 0, 6]), Err(FrameError::ShortHead(4)));
    }

    #[test]
    fn rejects_other_versions() {
        let err = Head::parse(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4]).unwrap_err();
        assert_eq!(err, FrameError::UnsupportedVersion(2));
    }

    #[test]
    fn rejects_unknown_types() {
        for code in [0u16, 5, 10, 0xFFFF] {
            let [t0, t1] = code.to_be_bytes();
            let err = Head::parse(&[0x80, 0x03, t0, t1, 0, 0, 0, 0]).unwrap_err();
            assert_eq!(err, FrameError::UnknownControlType(code));
        }
    }

    #[test]
    fn encodes_both_kinds() {
        let control = Head::Control {
            ty: ControlType::WindowUpdate,
            flags: 0,
            length: 8,
        };
        assert_eq!(control.to_bytes().unwrap(), [0x80, 3, 0, 9, 0, 0, 0, 8]);
        let data = Head::Data {
            stream_id: StreamId::new(0x0102_0304),
            flags: 1,
            length: MAX_FRAME_LEN as u32,
        };
        let mut out = Vec::new();
        data.encode(&mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 1, 0xFF, 0xFF, 0xFF]);
        assert_eq!(Head::parse(&out).unwrap(), data);
    }

    #[test]
    fn refuses_lengths_above_24_bits() {
        let data = Head::Data {
            stream_id: StreamId::new(1),
            flags: 0,
            length: 1 << 24,
        };
        assert_eq!(data.to_bytes(), Err(FrameError::FrameTooLarge(1 << 24)));
    }

    #[test]
    fn patches_length() {
        let mut head = [0x80, 3, 0, 1, 0, 0, 0, 0];
        patch_length(&mut head, 0x2A).unwrap();
        assert_eq!(head, [0x80, 3, 0, 1, 0, 0, 0, 0x2A]);
        assert!(patch_length(&mut head, 1 << 24).is_err());
    }
}
