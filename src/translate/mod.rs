//! The Kubernetes WebSocket channel protocols and their mapping to SPDY streams.
//!
//! Pure protocol logic (testable without sockets): [`channel`], [`protocol`], [`subprotocol`],
//! [`close_signal`], [`resize`], [`status`], [`status_mapping`], [`exec_options`].
//! The async bridges: [`remote_command`] (exec/attach) and [`tunnel`] (port-forward), over the
//! client's WebSocket ([`ws`]); [`reverse`]: SPDY clients to a WebSocket-only upstream.

pub mod channel;
pub mod close_signal;
pub mod exec_options;
pub mod observe;
pub mod protocol;
pub mod remote_command;
pub mod resize;
pub mod reverse;
pub mod status;
pub mod status_mapping;
pub mod subprotocol;
pub mod tunnel;
pub mod tunnel_stop;
pub mod ws;

/// How long a WebSocket's closing handshake may take at the end of a session (the tunnel's
/// with its client, the reverse translator's with its upstream) before the socket is dropped.
pub(crate) const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
