//! Errors produced while decoding or encoding frames.

use crate::spdy::header_block::HeaderBlockError;

/// A frame could not be decoded or encoded.
///
/// Every decoding error is fatal for the connection: spdystream ends its read loop on any of
/// them (PROTOCOL.md §3.2), and the byte stream cannot be resynchronised afterwards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A control frame with a type this implementation does not know (e.g. 5 NOOP, 10 CREDENTIAL).
    #[error("unknown control frame type {0}")]
    UnknownControlType(u16),
    /// A control frame whose version is not 3.
    #[error("unsupported SPDY version {0}")]
    UnsupportedVersion(u16),
    /// Fewer than [`HEAD_LEN`](super::HEAD_LEN) bytes were given to [`Head::parse`](super::Head::parse).
    #[error("frame head needs 8 bytes, got {0}")]
    ShortHead(usize),
    /// A frame whose length field does not fit its type.
    #[error("{ty} frame has invalid length {length}")]
    BadLength {
        /// Frame type name, e.g. `"PING"`.
        ty: &'static str,
        /// The length field as received (or as it would have been sent).
        length: u32,
    },
    /// A frame type that must name a stream carried stream id 0.
    #[error("{0} frame with stream id 0")]
    ZeroStreamId(&'static str),
    /// A frame whose flags must be 0 had other flags.
    #[error("{ty} frame has invalid flags {flags:#04x}")]
    BadFlags {
        /// Frame type name.
        ty: &'static str,
        /// The flags byte.
        flags: u8,
    },
    /// A PING with id 0.
    #[error("PING with id 0")]
    ZeroPingId,
    /// An RST_STREAM with status 0.
    #[error("RST_STREAM with status 0")]
    ZeroRstStatus,
    /// A frame longer than the configured limit (decoding) or than the 24-bit length field
    /// allows (encoding).
    #[error("frame length {0} exceeds the limit")]
    FrameTooLarge(usize),
    /// A SYN_STREAM priority above 7 (it is a 3-bit field).
    #[error("SYN_STREAM priority {0} is above 7")]
    BadPriority(u8),
    /// A SETTINGS id that does not fit its 24-bit field.
    #[error("SETTINGS id {0:#x} does not fit 24 bits")]
    BadSettingId(u32),
    /// A WINDOW_UPDATE delta outside 1..=2^31-1 (encoding only; received deltas are ignored
    /// by Kubernetes peers, so they are not judged).
    #[error("WINDOW_UPDATE delta {0} is outside 1..=2^31-1")]
    BadWindowDelta(u32),
    /// The header block of a SYN_STREAM, SYN_REPLY or HEADERS frame was invalid.
    #[error("header block: {0}")]
    HeaderBlock(#[from] HeaderBlockError),
    /// A header-carrying frame met a codec whose zlib context was released.
    #[error("header compression context was released")]
    HeaderContextReleased,
}
