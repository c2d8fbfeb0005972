//! Accepting a client's WebSocket upgrade ourselves (for the translated and tunnelled paths):
//! RFC 6455 validation, the 101 answer, and the [`WebSocket`] over hyper's upgraded
//! connection.

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::translate::ws::{Config, WebSocket};

/// The client's WebSocket once the 101 went out.
pub type ClientSocket = WebSocket<TokioIo<hyper::upgrade::Upgraded>>;

/// Why a WebSocket handshake was refused (before any upgrade).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("WebSocket upgrades must use GET")]
    Method,
    #[error("unsupported Sec-WebSocket-Version (only 13)")]
    Version,
    #[error("missing or invalid Sec-WebSocket-Key")]
    Key,
}

impl HandshakeError {
    /// The HTTP status the reference server answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            HandshakeError::Method => StatusCode::METHOD_NOT_ALLOWED,
            HandshakeError::Version | HandshakeError::Key => StatusCode::BAD_REQUEST,
        }
    }
}

/// Checks the parts of the handshake the routing did not: method, version and key. Returns
/// the `Sec-WebSocket-Accept` value.
pub fn validate<B>(req: &Request<B>) -> Result<String, HandshakeError> {
    if req.method() != Method::GET {
        return Err(HandshakeError::Method);
    }
    let version = req.headers().get(header::SEC_WEBSOCKET_VERSION);
    if version.map(|v| v.as_bytes()) != Some(b"13") {
        return Err(HandshakeError::Version);
    }
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or(HandshakeError::Key)?;
    // A key is 16 random bytes in base64: 24 characters.
    if key.len() != 24 {
        return Err(HandshakeError::Key);
    }
    Ok(derive_accept_key(key.as_bytes()))
}

/// The 101 answer choosing `protocol`.
pub fn switching_protocols<B: Default>(accept: &str, protocol: Option<&str>) -> Response<B> {
    let mut resp = Response::new(B::default());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = protocol.and_then(|p| HeaderValue::from_str(p).ok()) {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    resp
}

/// WebSocket settings for client connections (buffers size themselves to the traffic).
pub fn socket_config(max_message_size: usize) -> Config {
    Config { max_message_size }
}

/// Why the client's side of an upgrade did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ClientUpgradeError {
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    #[error("the client's upgrade did not complete within {0:?}")]
    Timeout(std::time::Duration),
}

/// Waits (at most `timeout`) for hyper to hand over the upgraded connection and wraps it as a
/// server WebSocket.
pub async fn upgraded(
    on_upgrade: OnUpgrade,
    config: Config,
    timeout: std::time::Duration,
) -> Result<ClientSocket, ClientUpgradeError> {
    let upgraded = tokio::time::timeout(timeout, on_upgrade)
        .await
        .map_err(|_| ClientUpgradeError::Timeout(timeout))??;
    Ok(WebSocket::new(TokioIo::new(upgraded), config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, version: &str, key: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/default/pods/p/exec")
            .header("Sec-WebSocket-Version", version)
            .header("Sec-WebSocket-Key", key)
            .body(())
            .unwrap()
    }

    #[test]
    fn rfc6455_accept_vector() {
        let r = req(Method::GET, "13", "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(validate(&r).unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn refusals_follow_the_reference_server() {
        let post = req(Method::POST, "13", "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(
            validate(&post).unwrap_err().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let v8 = req(Method::GET, "8", "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(validate(&v8).unwrap_err(), HandshakeError::Version);
        let nokey = req(Method::GET, "13", "short");
        assert_eq!(validate(&nokey).unwrap_err(), HandshakeError::Key);
    }
}
