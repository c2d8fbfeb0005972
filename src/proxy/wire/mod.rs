//! The vocabulary both sides of the proxy speak.
//!
//! - [`body`]: the body type of every response the proxy sends.
//! - [`status_response`]: Kubernetes `Status` bodies as HTTP responses.
//! - [`headers`]: header hygiene: hop-by-hop headers and the `X-Forwarded-*` family.
//! - [`client_stream`]: where a session's client side runs and in which handshake form.
//! - [`maybe_tls`]: a TCP connection that may carry TLS, for the listener and the upstream.
//! - [`tcp_keepalive`]: TCP keepalive on the proxy's sockets.
//!
//! The bottom room: uses no other room, and every room may use it.

pub mod body;
pub mod client_stream;
pub mod headers;
pub mod maybe_tls;
pub mod status_response;
pub mod tcp_keepalive;
