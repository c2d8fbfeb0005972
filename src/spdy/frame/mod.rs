//! SPDY/3.1 frames (PROTOCOL.md §3.2). Each frame type lives in its own file and knows how to
//! encode its body and decode it from a complete frame. Header blocks are carried *decoded*
//! ([`HeaderBlock`]); compressing them is the codec's job because the zlib contexts belong to the
//! connection, not to a frame.

mod data;
mod error;
mod goaway;
mod head;
mod headers;
mod ping;
mod rst_stream;
mod settings;
mod stream_headers;
mod stream_id;
mod syn_reply;
mod syn_stream;
mod window_update;
mod wire;

pub use data::Data;
pub use error::FrameError;
pub use goaway::{GoAway, GoAwayStatus};
pub use head::{ControlType, Head, HEAD_LEN, SPDY_VERSION};
pub use headers::Headers;
pub use ping::{Ping, PingId};
pub use rst_stream::{RstStatus, RstStream};
pub use settings::{Setting, Settings};
pub use stream_id::StreamId;
pub use syn_reply::SynReply;
pub use syn_stream::SynStream;
pub use window_update::WindowUpdate;

pub use crate::spdy::header_block::HeaderBlock;

/// Largest payload a frame's 24-bit length field can describe.
pub const MAX_FRAME_LEN: usize = 0x00FF_FFFF;

/// `FLAG_FIN`, shared by DATA, SYN_STREAM, SYN_REPLY and HEADERS.
pub const FLAG_FIN: u8 = 0x01;

/// One decoded SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Stream bytes.
    Data(Data),
    /// Opens a stream.
    SynStream(SynStream),
    /// Accepts a stream.
    SynReply(SynReply),
    /// Aborts a stream.
    RstStream(RstStream),
    /// Session parameters.
    Settings(Settings),
    /// Liveness check.
    Ping(Ping),
    /// Session end.
    GoAway(GoAway),
    /// More headers for a stream.
    Headers(Headers),
    /// Flow-control credit.
    WindowUpdate(WindowUpdate),
}

impl Frame {
    /// The frame type's name as the specification spells it (for logs and errors).
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Data(_) => "DATA",
            Frame::SynStream(_) => ControlType::SynStream.name(),
            Frame::SynReply(_) => ControlType::SynReply.name(),
            Frame::RstStream(_) => ControlType::RstStream.name(),
            Frame::Settings(_) => ControlType::Settings.name(),
            Frame::Ping(_) => ControlType::Ping.name(),
            Frame::GoAway(_) => ControlType::GoAway.name(),
            Frame::Headers(_) => ControlType::Headers.name(),
            Frame::WindowUpdate(_) => ControlType::WindowUpdate.name(),
        }
    }

    /// The stream a frame belongs to, for the frame types that name one.
    pub fn stream_id(&self) -> Option<StreamId> {
        match self {
            Frame::Data(f) => Some(f.stream_id),
            Frame::SynStream(f) => Some(f.stream_id),
            Frame::SynReply(f) => Some(f.stream_id),
            Frame::RstStream(f) => Some(f.stream_id),
            Frame::Headers(f) => Some(f.stream_id),
            Frame::WindowUpdate(f) => Some(f.stream_id),
            Frame::Settings(_) | Frame::Ping(_) | Frame::GoAway(_) => None,
        }
    }
}
