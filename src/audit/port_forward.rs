//! What a port-forward session carried, as its audit event says it: each forwarded
//! connection's port and bytes, filled in by the passive observers of `translate::observe`.
//! Defined here, with the events that write them, so that the audit log depends on no
//! protocol code: the observers depend on it.

use serde::Serialize;

/// One forwarded connection as the session carried it (and as the audit log writes it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForwardedConnection {
    /// The pod's port, `None` when the header did not hold a valid one.
    pub port: Option<u16>,
    /// The client's `requestid`, which pairs the error and data streams.
    pub request_id: String,
    /// Payload bytes of the data stream from the client towards the pod.
    pub bytes_in: u64,
    /// Payload bytes of the data stream from the pod towards the client.
    pub bytes_out: u64,
    /// What the error stream said, if anything (first KiB, trimmed).
    pub error: Option<String>,
}

/// The port-forward part of an observation, as it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortForwardReport {
    /// Every valid port a stream named, ascending, without repeats.
    pub ports: Vec<u16>,
    /// The first connections, in the order they were opened (as many as the observer keeps in
    /// detail).
    pub connections: Vec<ForwardedConnection>,
    /// Connections opened after those, counted only.
    pub omitted: u64,
    /// Why the observation stopped before the session ended, if it did.
    pub failure: Option<String>,
}
