//! The server side of a WebSocket (RFC 6455) once the 101 went out, for the translated and
//! tunnelled sessions. Every stdin and stdout byte crosses it, so it is built for that path:
//! a client's payloads are unmasked in the read buffer and handed on without a copy, reads are
//! sized to the traffic (an idle session parks on a small buffer), and a message to the client
//! is its head plus the payload's own buffer in one vectored write, batched with whatever else
//! is queued.
//!
//! [`WebSocket::split`] gives a [`WsReader`] and a [`WsWriter`], which can be driven from the
//! same task or different ones. Pings are answered by the writer: the reader passes the latest
//! ping on, and the writer's owner selects on [`WsWriter::control_due`] while it waits, which
//! is also when the writer's own keepalive pings go out ([`Keepalive`]). Whether the client is
//! still there is [`WsReader::liveness`]. No extensions are negotiated; a client's close frame
//! is answered by whoever owns the writer (the session decides what to say).

mod close;
pub(crate) mod frame;
mod keepalive;
pub(crate) mod mask;
mod reader;
mod writer;

pub use close::{CloseCode, CloseFrame};
pub use keepalive::{Held, Keepalive, Listening, Liveness};
pub use reader::{Incoming, WsReader};
pub use writer::WsWriter;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::sync::watch;

use crate::session_memory::{MemoryBudget, MemoryLane, Refused};

/// Why a WebSocket could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connection failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The client broke RFC 6455.
    #[error("{0}")]
    Protocol(&'static str),
    /// A frame or message above [`Config::max_message_size`].
    #[error("message of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: u64, max: usize },
    /// A text message or close reason that is not UTF-8.
    #[error("text that is not UTF-8")]
    InvalidUtf8,
    /// A message after our close frame.
    #[error("the WebSocket is closed")]
    Closed,
    /// A message the session's memory cannot hold (its lane's cap, or the shared budget).
    #[error(transparent)]
    Memory(#[from] Refused),
}

impl Error {
    /// The close code that tells the client what it did wrong (`None`: the connection itself
    /// failed, nothing can be said).
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            Error::Protocol(_) => Some(CloseCode::PROTOCOL),
            Error::TooLarge { .. } | Error::Memory(_) => Some(CloseCode::TOO_BIG),
            Error::InvalidUtf8 => Some(CloseCode::INVALID_DATA),
            Error::Io(_) | Error::Closed => None,
        }
    }
}

/// Limits and keepalive of a client WebSocket.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest message (and frame) accepted from the client.
    pub max_message_size: usize,
    /// Pings to the client, and how long it may stay silent; `None`: no pings, never lost.
    pub keepalive: Option<Keepalive>,
    /// The budget the session's memory lanes draw on; `None`: not counted.
    pub memory: Option<Arc<MemoryBudget>>,
}

/// An accepted WebSocket over `io`, before it is split.
pub struct WebSocket<S> {
    io: S,
    config: Config,
}

impl<S: AsyncRead + AsyncWrite> WebSocket<S> {
    /// A server WebSocket over a connection whose handshake is done.
    pub fn new(io: S, config: Config) -> Self {
        WebSocket { io, config }
    }

    /// A new memory lane of the session's budget, for what the session reads from its other
    /// side (the reader has its own); `None` when memory is not counted.
    pub fn memory_lane(&self) -> Option<MemoryLane> {
        self.config.memory.as_ref().map(MemoryBudget::lane)
    }

    /// The reading and the writing half; the reader holds what it reads from a lane of its own.
    pub fn split(self) -> (WsReader<ReadHalf<S>>, WsWriter<WriteHalf<S>>) {
        let lane = self.memory_lane();
        let (rd, wr) = tokio::io::split(self.io);
        let (ping_tx, ping_rx) = watch::channel(None);
        let keepalive = self.config.keepalive;
        let liveness = Liveness::new(keepalive);
        (
            WsReader::new(rd, self.config.max_message_size, ping_tx, liveness, lane),
            WsWriter::new(wr, ping_rx, keepalive.map(|k| k.interval)),
        )
    }
}

#[cfg(test)]
mod memory_tests;
#[cfg(test)]
pub(crate) mod test_client;
#[cfg(test)]
mod tests;
