//! An upgrade request made ready before it may take a session slot: its body (if it declares
//! one) read in full, within a time limit, and the connection's upgrade handle taken out.
//!
//! Reading first matters: a slot taken before the body is read could be held for ever by a
//! caller that declares a body and never sends it, with no credentials checked.

use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use super::client_stream::{ClientStream, ConnectionId, HandshakeForm};

/// Largest request body accepted with an upgrade request (they normally have none).
pub const MAX_UPGRADE_BODY: usize = 1024 * 1024;

/// An upgrade request whose body has been read.
#[derive(Debug)]
pub struct UpgradeRequest {
    /// Method, URI and headers.
    pub parts: Parts,
    /// The request body (empty for WebSocket handshakes and kubectl's SPDY upgrades).
    pub body: Bytes,
    /// Resolves to the client's connection (or HTTP/2 stream) once the 101 (or 200) has gone
    /// out.
    pub on_upgrade: OnUpgrade,
    /// The client connection it came on, and how it asked (HTTP/1.1 upgrade or HTTP/2
    /// extended CONNECT).
    pub client: ClientStream,
}

/// Why an upgrade request was refused before anything else happened.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeRequestError {
    #[error("connection cannot be upgraded")]
    NotUpgradable,
    #[error("upgrade request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("the upgrade request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("error reading the upgrade request body: {0}")]
    Read(String),
}

impl UpgradeRequestError {
    /// The HTTP status and Kubernetes Status reason for the client.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            UpgradeRequestError::NotUpgradable | UpgradeRequestError::Read(_) => {
                (StatusCode::BAD_REQUEST, "BadRequest")
            }
            UpgradeRequestError::TooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge")
            }
            UpgradeRequestError::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "Timeout"),
        }
    }
}

impl UpgradeRequest {
    /// Reads the body of `req` (at most `limit` bytes, within `timeout`), which came on
    /// `connection`.
    pub async fn read(
        req: Request<Incoming>,
        connection: ConnectionId,
        limit: usize,
        timeout: Duration,
    ) -> Result<UpgradeRequest, UpgradeRequestError> {
        let (mut parts, body) = req.into_parts();
        let client = ClientStream {
            connection,
            // Marked by extended_connect::normalize; anything else is an HTTP/1.1 upgrade.
            form: parts
                .extensions
                .get::<HandshakeForm>()
                .copied()
                .unwrap_or_default(),
        };
        let on_upgrade = parts
            .extensions
            .remove::<OnUpgrade>()
            .ok_or(UpgradeRequestError::NotUpgradable)?;
        let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect())
            .await
            .map_err(|_| UpgradeRequestError::Timeout(timeout))?;
        let body = match collected {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(UpgradeRequestError::TooLarge(limit))
            }
            Err(e) => return Err(UpgradeRequestError::Read(e.to_string())),
        };
        Ok(UpgradeRequest {
            parts,
            body,
            on_upgrade,
            client,
        })
    }

    /// The request's path and query (the target upstream).
    pub fn path_and_query(&self) -> String {
        self.parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .unwrap_or_else(|| self.parts.uri.path().to_owned())
    }
}
