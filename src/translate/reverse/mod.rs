//! The reverse translator (#16): kubectl ≤ 1.30 speaks SPDY/3.1 to the proxy, the upstream
//! only takes WebSockets (a cluster behind a gateway that drops SPDY). The proxy is the SPDY
//! *server* towards the client (the same session code the simulated kubelet uses) and a
//! WebSocket *client* towards the upstream:
//!
//! * exec/attach ([`exec_session`]): the remote-command streams of the negotiated version
//!   (v4 for every kubectl; v3/v2/v1 served too) mapped onto `v5.channel.k8s.io` channels —
//!   stdin and its half-close as `FF 00`, terminal sizes on channel 4, the Status of channel 3
//!   back on the SPDY `error` stream with its exit code;
//! * port-forward ([`port_forward`]): carried unchanged, SPDY inside the upstream's
//!   `SPDY/3.1+portforward.k8s.io` tunnel.
//!
//! Pure parts, testable without sockets: [`negotiation`], [`v5_message`], [`client_status`].

pub mod client_status;
pub mod client_streams;
pub mod exec_session;
pub mod negotiation;
pub mod port_forward;
pub mod v5_message;

pub use client_streams::{accept_streams, AcceptError, ClientStreams};
pub use exec_session::{run, ReverseLimits};

#[cfg(test)]
mod tests;
