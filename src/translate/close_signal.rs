//! The v5 CLOSE signal (PROTOCOL.md §1.4): a binary message of exactly two bytes `FF <channel>`
//! that half-closes one channel — `FF 00` is stdin EOF.

use super::channel::Channel;

/// The first byte of a CLOSE signal.
pub const CLOSE_SIGNAL_BYTE: u8 = 0xFF;

/// A decoded CLOSE signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseSignal(Channel);

/// A message starting with `FF` that is not a valid CLOSE signal. The reference server aborts
/// the connection; we close it with 1002 and this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloseSignalError {
    #[error("CLOSE signal must be 2 bytes, got {0}")]
    Length(usize),
    #[error("CLOSE signal for unknown channel {0}")]
    Channel(u8),
}

impl CloseSignal {
    /// A signal closing `channel`.
    pub fn new(channel: Channel) -> Self {
        CloseSignal(channel)
    }

    /// The channel being closed.
    pub fn channel(self) -> Channel {
        self.0
    }

    /// Decodes a whole message that starts with [`CLOSE_SIGNAL_BYTE`].
    pub fn decode(msg: &[u8]) -> Result<CloseSignal, CloseSignalError> {
        match msg {
            [CLOSE_SIGNAL_BYTE, ch] => Channel::from_byte(*ch)
                .map(CloseSignal)
                .ok_or(CloseSignalError::Channel(*ch)),
            _ => Err(CloseSignalError::Length(msg.len())),
        }
    }

    /// The two wire bytes.
    pub fn encode(self) -> [u8; 2] {
        [CLOSE_SIGNAL_BYTE, self.0.as_byte()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stdin_close_vector() {
        assert_eq!(CloseSignal::new(Channel::Stdin).encode(), [0xFF, 0x00]);
        assert_eq!(
            CloseSignal::decode(&[0xFF, 0x00]).unwrap().channel(),
            Channel::Stdin
        );
        assert_eq!(
            CloseSignal::decode(&[0xFF, 0x04]).unwrap().channel(),
            Channel::Resize
        );
    }

    #[test]
    fn malformed_signals() {
        assert_eq!(
            CloseSignal::decode(&[0xFF, 0x00, 0x00]),
            Err(CloseSignalError::Length(3))
        );
        assert_eq!(
            CloseSignal::decode(&[0xFF]),
            Err(CloseSignalError::Length(1))
        );
        assert_eq!(
            CloseSignal::decode(&[0xFF, 0x09]),
            Err(CloseSignalError::Channel(9))
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(msg in proptest::collection::vec(any::<u8>(), 0..8)) {
            let _ = CloseSignal::decode(&msg);
        }
    }
}
