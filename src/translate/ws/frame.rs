//! The RFC 6455 §5.2 frame header: parsing what a client sends, encoding what a server sends.
//!
//! ```text
//! FIN | RSV1-3 | opcode (4) | MASK | length (7) [+ 16 or 64 bit length] [+ 4 byte mask key]
//! ```

use super::Error;

/// The longest header: 2 bytes, a 64-bit length and a mask key.
pub const MAX_HEAD_LEN: usize = 14;

/// Longest payload of a control frame (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    /// The next fragment of a fragmented message.
    Continuation,
    /// A text message (or its first fragment).
    Text,
    /// A binary message (or its first fragment).
    Binary,
    /// The closing handshake.
    Close,
    /// A liveness check, to be answered with a pong.
    Ping,
    /// The answer to a ping (or a unilateral heartbeat).
    Pong,
}

impl OpCode {
    fn from_bits(bits: u8) -> Result<OpCode, Error> {
        Ok(match bits {
            0x0 => OpCode::Continuation,
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xA => OpCode::Pong,
            _ => return Err(Error::Protocol("reserved opcode")),
        })
    }

    fn bits(self) -> u8 {
        match self {
            OpCode::Continuation => 0x0,
            OpCode::Text => 0x1,
            OpCode::Binary => 0x2,
            OpCode::Close => 0x8,
            OpCode::Ping => 0x9,
            OpCode::Pong => 0xA,
        }
    }

    /// Close, ping and pong: never fragmented, at most 125 bytes.
    pub fn is_control(self) -> bool {
        matches!(self, OpCode::Close | OpCode::Ping | OpCode::Pong)
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Last fragment of its message.
    pub fin: bool,
    pub opcode: OpCode,
    /// The client's masking key (clients must mask; the reader enforces it).
    pub mask: Option<[u8; 4]>,
    /// Payload length.
    pub len: u64,
    /// Bytes the header itself took.
    pub head_len: usize,
}

impl FrameHead {
    /// Parses the header at the front of `buf`: `Ok(None)` while it is incomplete. Checks what
    /// can be checked without context: reserved bits (no extension is ever negotiated), reserved
    /// opcodes, control frames that are fragmented or too long, a 64-bit length with its top bit
    /// set.
    pub fn parse(buf: &[u8]) -> Result<Option<FrameHead>, Error> {
        let [b0, b1, ..] = *buf else {
            return Ok(None);
        };
        if b0 & 0x70 != 0 {
            return Err(Error::Protocol("reserved bits set"));
        }
        let fin = b0 & 0x80 != 0;
        let opcode = OpCode::from_bits(b0 & 0x0F)?;
        let masked = b1 & 0x80 != 0;
        let (len, mut at) = match b1 & 0x7F {
            126 => match buf.get(2..4) {
                Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
                None => return Ok(None),
            },
            127 => match buf.get(2..10) {
                Some(b) => {
                    let len = u64::from_be_bytes(b.try_into().expect("8 bytes"));
                    if len >> 63 != 0 {
                        return Err(Error::Protocol("payload length with the top bit set"));
                    }
                    (len, 10)
                }
                None => return Ok(None),
            },
            short => (u64::from(short), 2),
        };
        if opcode.is_control() {
            if !fin {
                return Err(Error::Protocol("fragmented control frame"));
            }
            if len > MAX_CONTROL_PAYLOAD as u64 {
                return Err(Error::Protocol("control frame longer than 125 bytes"));
            }
        }
        let mask = if masked {
            let Some(key) = buf.get(at..at + 4) else {
                return Ok(None);
            };
            at += 4;
            Some(key.try_into().expect("4 bytes"))
        } else {
            None
        };
        Ok(Some(FrameHead {
            fin,
            opcode,
            mask,
            len,
            head_len: at,
        }))
    }

    /// Encodes an unmasked, final frame header (what a server sends) into `out`; returns its
    /// length.
    pub fn encode_server(opcode: OpCode, len: usize, out: &mut [u8; MAX_HEAD_LEN]) -> usize {
        out[0] = 0x80 | opcode.bits();
        match len {
            0..=125 => {
                out[1] = len as u8;
                2
            }
            126..=0xFFFF => {
                out[1] = 126;
                out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                4
            }
            _ => {
                out[1] = 127;
                out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
                10
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> FrameHead {
        FrameHead::parse(bytes).unwrap().unwrap()
    }

    #[test]
    fn rfc6455_examples() {
        // §5.7: a single-frame unmasked text "Hello".
        let h = parse(&[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
        assert_eq!(
            (h.fin, h.opcode, h.mask, h.len, h.head_len),
            (true, OpCode::Text, None, 5, 2)
        );
        // A masked "Hello".
        let h = parse(&[
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ]);
        assert_eq!(h.mask, Some([0x37, 0xfa, 0x21, 0x3d]));
        assert_eq!((h.len, h.head_len), (5, 6));
        // A fragmented text: "Hel" (FIN clear), then continuation "lo".
        let h = parse(&[0x01, 0x03, 0x48, 0x65, 0x6c]);
        assert_eq!((h.fin, h.opcode), (false, OpCode::Text));
        let h = parse(&[0x80, 0x02, 0x6c, 0x6f]);
        assert_eq!((h.fin, h.opcode), (true, OpCode::Continuation));
        // 256 bytes binary: 16-bit length; 64 KiB: 64-bit length.
        let h = parse(&[0x82, 0x7E, 0x01, 0x00]);
        assert_eq!((h.len, h.head_len), (256, 4));
        let h = parse(&[0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!((h.len, h.head_len), (65536, 10));
        // Ping "Hello".
        assert_eq!(parse(&[0x89, 0x05]).opcode, OpCode::Ping);
    }

    #[test]
    fn incomplete_heads_wait() {
        let full = [0x82, 0xFE, 0x01, 0x00, 1, 2, 3, 4];
        for n in 0..full.len() {
            assert_eq!(FrameHead::parse(&full[..n]).unwrap(), None, "{n} bytes");
        }
        assert_eq!(parse(&full).head_len, 8);
    }

    #[test]
    fn violations() {
        let bad: [&[u8]; 6] = [
            &[0xC2, 0x00],                            // RSV1
            &[0x83, 0x00],                            // reserved data opcode
            &[0x8B, 0x00],                            // reserved control opcode
            &[0x09, 0x00],                            // fragmented ping
            &[0x88, 0x7E, 0x00, 0x7E],                // 126-byte close
            &[0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0], // top length bit
        ];
        for b in bad {
            assert!(
                matches!(FrameHead::parse(b), Err(Error::Protocol(_))),
                "{b:02x?}"
            );
        }
    }

    #[test]
    fn server_heads_round_trip() {
        for len in [0usize, 1, 125, 126, 0xFFFF, 0x10000, 1 << 24] {
            let mut out = [0u8; MAX_HEAD_LEN];
            let n = FrameHead::encode_server(OpCode::Binary, len, &mut out);
            let h = parse(&out[..n]);
            assert_eq!(
                (h.fin, h.opcode, h.mask, h.len, h.head_len),
                (true, OpCode::Binary, None, len as u64, n)
            );
        }
    }
}
