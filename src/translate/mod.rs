//! The Kubernetes WebSocket channel protocols and their mapping to SPDY streams.

pub mod remote_command;
pub mod tunnel;
