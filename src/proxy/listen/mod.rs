//! The listeners: where connections arrive and requests are handed to their sessions.
//!
//! - [`server`]: the main listener: client connections (HTTP/1.1 or HTTP/2, plain or TLS)
//!   within their clocks, each request classified once and handed to its session runner.
//! - [`front_door`]: what the listeners serve from: the shared state and the clusters.
//! - [`tls`]: TLS on the main listener, its certificate re-read when it rotates.
//! - [`extended_connect`]: WebSockets over HTTP/2 (RFC 8441) turned into the request an
//!   HTTP/1.1 upgrade would have been.
//! - [`admin`]: the admin listener (`/healthz`, `/readyz`, `/metrics`); operator endpoints on
//!   live sessions belong here.
//!
//! The top room: may use every other room of the proxy. Nothing in the proxy uses it; the
//! application (`app`) starts it.

pub mod admin;
pub mod extended_connect;
pub mod front_door;
pub mod server;
pub mod tls;
