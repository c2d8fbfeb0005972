//! Close frames (RFC 6455 §5.5.1, §7.4): a status code and a UTF-8 reason.

use super::Error;

/// A close status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 1000: the purpose of the connection is fulfilled.
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// 1001: the server is going away (shutting down).
    pub const AWAY: CloseCode = CloseCode(1001);
    /// 1002: the peer broke the protocol.
    pub const PROTOCOL: CloseCode = CloseCode(1002);
    /// 1007: a text message that is not UTF-8.
    pub const INVALID_DATA: CloseCode = CloseCode(1007);
    /// A message (or here, an operator) ended it for a policy reason.
    pub const POLICY: CloseCode = CloseCode(1008);
    /// 1009: a message too big to process.
    pub const TOO_BIG: CloseCode = CloseCode(1009);

    /// Whether a peer may send this code: 1004–1006 and 1015 are reserved for local use and
    /// the rest below 3000 is unassigned.
    pub fn is_sendable(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

/// The body of a close frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// Why the connection is closing.
    pub code: CloseCode,
    /// Human-readable detail (at most 123 bytes go on the wire).
    pub reason: String,
}

impl CloseFrame {
    /// A close frame with `code` and `reason`.
    pub fn new(code: CloseCode, reason: impl Into<String>) -> Self {
        CloseFrame {
            code,
            reason: reason.into(),
        }
    }

    /// Decodes a close payload: empty (no code), or a sendable code and a UTF-8 reason.
    pub fn decode(payload: &[u8]) -> Result<Option<CloseFrame>, Error> {
        match payload {
            [] => Ok(None),
            [_] => Err(Error::Protocol("close frame with a one-byte body")),
            [hi, lo, reason @ ..] => {
                let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
                if !code.is_sendable() {
                    return Err(Error::Protocol("close frame with a reserved code"));
                }
                let reason = std::str::from_utf8(reason).map_err(|_| Error::InvalidUtf8)?;
                Ok(Some(CloseFrame::new(code, reason)))
            }
        }
    }

    /// The payload: the code, then the reason, cut to fit a control frame on a character
    /// boundary.
    pub fn encode(&self) -> Vec<u8> {
        let mut reason = self.reason.as_str();
        let room = super::frame::MAX_CONTROL_PAYLOAD - 2;
        if reason.len() > room {
            let mut end = room;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason = &reason[..end];
        }
        let mut out = Vec::with_capacity(2 + reason.len());
        out.extend_from_slice(&self.code.0.to_be_bytes());
        out.extend_from_slice(reason.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_and_encode() {
        assert_eq!(CloseFrame::decode(&[]).unwrap(), None);
        let f = CloseFrame::decode(b"\x03\xe8bye").unwrap().unwrap();
        assert_eq!(f, CloseFrame::new(CloseCode::NORMAL, "bye"));
        assert_eq!(f.encode(), b"\x03\xe8bye");
        assert!(matches!(CloseFrame::decode(&[3]), Err(Error::Protocol(_))));
        // 1005 and 1006 never appear on the wire.
        assert!(CloseFrame::decode(&[0x03, 0xed]).is_err());
        assert!(CloseFrame::decode(&[0x03, 0xee]).is_err());
        assert!(matches!(
            CloseFrame::decode(b"\x03\xe8\xff"),
            Err(Error::InvalidUtf8)
        ));
    }

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        let f = CloseFrame::new(CloseCode::PROTOCOL, "é".repeat(100));
        let body = f.encode();
        assert!(body.len() <= 125);
        assert!(std::str::from_utf8(&body[2..]).is_ok());
    }
}
