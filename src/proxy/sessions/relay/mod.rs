//! The relay: byte-for-byte relays of upgrades the upstream serves natively (SPDY/3.1,
//! legacy WebSocket exec/port-forward, log streaming, and the WebSocket passed through under
//! `--upstream-streaming websocket|auto`), from the upstream's answer to the session's end.
//!
//! - [`run`]: the runner: the upstream asked, its answer carried to the client, the session
//!   started on a 101.
//! - [`answer`]: what the client is told when the upstream accepted.
//! - [`session`]: a relayed session from the 101 to its end.
//! - [`pump`]: the byte copy both ways.
//! - [`frames`]: where the frames going to the client begin and end, the one follower of them.
//! - [`pings`]: keepalive pings into a relayed WebSocket.
//! - [`recording`]: recording a relayed exec/attach.
//! - [`ending`]: the Status a relay ends a session with when its recording fails.
//!
//! May use, inside `sessions`, only [`lifecycle`](super::lifecycle) and
//! [`state`](super::state); used by the runners (`listen`'s front door, `pass_through`,
//! `spdy_auto`). `src/layering.rs` enforces it.

pub mod answer;
pub mod ending;
pub mod frames;
pub mod pings;
pub mod pump;
pub mod recording;
pub mod run;
pub mod session;
