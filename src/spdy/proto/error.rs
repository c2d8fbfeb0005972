use std::time::Duration;

use crate::session_memory::Refused;
use crate::spdy::frame::{FrameError, GoAwayStatus, RstStatus};

/// Errors of the SPDY session and its streams.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The peer did not answer our SYN_STREAM in time.
    #[error("timed out waiting for SYN_REPLY")]
    SynReplyTimeout,
    /// The peer reset the stream (or refused to open it).
    #[error("stream reset by peer ({0:?})")]
    StreamReset(RstStatus),
    /// The peer sent GOAWAY; no new streams may be opened.
    #[error("session is going away ({0:?})")]
    GoingAway(GoAwayStatus),
    /// The session has ended; the reason is in [`SessionEnd`].
    #[error("session closed: {0}")]
    SessionClosed(SessionEnd),
    /// The peer sent something we could not parse; the session is over.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Stream ids are exhausted (2^31).
    #[error("no stream ids left")]
    StreamIdsExhausted,
    /// The stream was already half-closed or reset locally.
    #[error("stream already closed for sending")]
    StreamClosed,
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Self {
        Error::Protocol(e.to_string())
    }
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionEnd {
    /// We closed it (`Connection::close`).
    #[error("closed locally")]
    Local,
    /// The peer sent GOAWAY and closed the connection.
    #[error("peer sent GOAWAY ({0:?})")]
    GoAway(GoAwayStatus),
    /// The peer closed the TCP connection without GOAWAY.
    #[error("connection closed by peer")]
    Eof,
    /// Reading or writing the socket failed.
    #[error("i/o error: {0}")]
    Io(String),
    /// The peer violated the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Nothing came from the peer, not even the answer to a ping, for this long.
    #[error("the peer stopped answering: nothing heard for {0:?}")]
    PingTimeout(Duration),
    /// The peer sent a frame the session's memory could not hold whole (its lane's cap, or
    /// the budget all sessions share).
    #[error("the peer sent a frame its session cannot hold: {0}")]
    Memory(Refused),
}

impl SessionEnd {
    /// Whether the peer ended the session in an orderly way (GOAWAY or our own close).
    pub fn is_clean(&self) -> bool {
        matches!(self, SessionEnd::Local | SessionEnd::GoAway(_))
    }
}
