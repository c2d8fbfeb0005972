//! The client's connection and request, before and as its session starts.
//!
//! - [`connection_deadline`]: the two clocks of a client connection (to the first request
//!   head, and idle between requests).
//! - [`request_layers`]: the layers every request passes before it is routed (panics to 500,
//!   sensitive headers, `Audit-ID`).
//! - [`upgrade_request`]: an upgrade request made ready before it takes a session slot.
//! - [`waiting_connections`]: the cap on connections waiting for a request head, all
//!   together (`--max-pending-connections`; the longest waiting is shed).
//! - [`write_timeout`]: the third clock, a plain response whose client takes nothing of it
//!   for `--response-write-timeout` is cut.
//! - [`websocket`]: accepting the client's WebSocket ourselves (validation, the 101 or the
//!   HTTP/2 200, the socket).
//!
//! May use `observability` and `wire`; used by `sessions` and `listen`.

pub mod connection_deadline;
pub mod request_layers;
pub mod upgrade_request;
pub mod waiting_connections;
pub mod websocket;
pub mod write_timeout;
