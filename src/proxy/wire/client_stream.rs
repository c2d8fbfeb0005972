//! Where a streaming session's client side runs: on which client connection, and in which
//! form the client asked for it (an HTTP/1.1 upgrade, or an HTTP/2 extended CONNECT). The form
//! decides only the answer; everything after the handshake is the same.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::audit::HttpVersion;

/// How a client asked for its WebSocket (or other upgrade).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HandshakeForm {
    /// HTTP/1.1 `Upgrade` (RFC 6455 §4): answered with 101 and `Sec-WebSocket-Accept`; the
    /// connection is handed over to the session.
    #[default]
    Http1Upgrade,
    /// HTTP/2 `CONNECT` with `:protocol websocket` (RFC 8441): answered with 200; the session
    /// is one stream of a connection that carries others.
    ExtendedConnect,
}

impl HandshakeForm {
    /// The HTTP version the session's client side speaks: a metric label and a log field.
    pub fn http_version(self) -> &'static str {
        match self {
            HandshakeForm::Http1Upgrade => "1.1",
            HandshakeForm::ExtendedConnect => "2",
        }
    }
}

impl From<HandshakeForm> for HttpVersion {
    /// What the session's audit events say of it.
    fn from(form: HandshakeForm) -> HttpVersion {
        match form {
            HandshakeForm::Http1Upgrade => HttpVersion::Http11,
            HandshakeForm::ExtendedConnect => HttpVersion::Http2,
        }
    }
}

/// One client connection, numbered (within the process) for logs: the sessions of one HTTP/2
/// connection share it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionId(pub u64);

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

impl ConnectionId {
    /// A fresh id for an accepted connection.
    pub fn next() -> ConnectionId {
        ConnectionId(NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed))
    }
}

impl std::fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A session's client side: its connection and its handshake form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStream {
    /// The client connection the session runs on.
    pub connection: ConnectionId,
    /// How the client asked for it.
    pub form: HandshakeForm,
}
