//! The exec/attach translator (PROTOCOL.md §4, §7): a client's `v5.channel.k8s.io` WebSocket on
//! one side, an SPDY remote-command session on the other.
//!
//! ```text
//! client WS ──► [client reader] ──stdin/CLOSE──► [stdin pump] ──► SPDY stdin
//!                      └──────── resize ───────► [resize pump] ─► SPDY resize
//!           ◄── [output pump] ◄── stdout/stderr ◄── SPDY
//!           ◄── status on channel 3 ◄── [error reader] ◄── SPDY error
//! ```
//! Every hop is bounded: a slow client slows the upstream, a stalled upstream stops the client
//! reader once a bounded amount of stdin is queued.
//!
//! How a session ended (`outcome`) and the ends the proxy puts to one, with their Statuses
//! (`end_status`), are the reverse translator's too: an exec session ends the same ways in
//! either direction.

mod client_reader;
mod end_status;
mod error_reader;
mod outcome;
mod output_pump;
mod session;
mod setup;
mod stdin_pump;

pub use end_status::{first_proxy_end, EndStatus};
pub use outcome::{Outcome, SessionEndKind, SessionRecording};
pub use session::{refuse, run, SessionLimits};
pub use setup::{open_streams, ExecStreams};

#[cfg(test)]
mod tests;
