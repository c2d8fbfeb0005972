//! The SPDY/3.1 session (PROTOCOL.md §3.4): stream ids, SYN_STREAM/SYN_REPLY, half-close, reset,
//! pings and GOAWAY, as Kubernetes peers (spdystream) expect them.
//!
//! One reader task and one writer task own the two halves of the socket; stream handles talk to
//! them through bounded queues and never touch the socket. The tasks live as long as a handle
//! on the session does (the connection's clones, its streams): the last one to drop closes
//! the session and releases the socket (`life.rs`). There are deliberately **no
//! flow-control windows**: Kubernetes peers never send WINDOW_UPDATE, so honouring the 64 KiB
//! initial window would stall every transfer. Backpressure comes from bounded queues instead:
//! each stream's inbox holds a bounded number of bytes, and the outgoing data lane holds a few
//! frames, so a slow reader slows the peer through TCP and memory never grows.

mod config;
mod connection;
mod error;
mod inbox;
mod life;
mod reader;
mod shared;
mod stream;
mod writer;

pub use config::{Config, Role};
pub use connection::{Connection, Incoming};
pub use error::{Error, SessionEnd};
pub use stream::{IncomingStream, RecvStream, SendStream, Stream};

#[cfg(test)]
mod memory_tests;
#[cfg(test)]
mod tests;
