//! Channel numbers of the Kubernetes remote-command WebSocket protocols (PROTOCOL.md §1.3).

/// A remote-command channel: the first byte of every binary message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    Stdin = 0,
    Stdout = 1,
    Stderr = 2,
    /// The status channel (`error` stream upstream).
    Error = 3,
    Resize = 4,
}

impl Channel {
    /// The channel for a wire byte, if it is one of the five.
    pub fn from_byte(b: u8) -> Option<Channel> {
        Some(match b {
            0 => Channel::Stdin,
            1 => Channel::Stdout,
            2 => Channel::Stderr,
            3 => Channel::Error,
            4 => Channel::Resize,
            _ => return None,
        })
    }

    /// The wire byte.
    pub fn as_byte(self) -> u8 {
        self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        for b in 0..=4u8 {
            assert_eq!(Channel::from_byte(b).unwrap().as_byte(), b);
        }
        assert_eq!(Channel::from_byte(5), None);
        assert_eq!(Channel::from_byte(255), None);
    }
}
