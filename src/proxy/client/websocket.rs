//! Accepting a client's WebSocket upgrade ourselves (for the translated and tunnelled paths):
//! RFC 6455 validation, the answer (101 on HTTP/1.1, 200 on HTTP/2, RFC 8441), and the
//! [`WebSocket`] over hyper's upgraded connection or HTTP/2 stream.

use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::proxy::wire::client_stream::HandshakeForm;
use crate::translate::ws::{Config, WebSocket};

/// The client's WebSocket once the 101 (or, on HTTP/2, the 200) went out.
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

/// How the client's WebSocket is accepted, once its handshake checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAnswer {
    /// HTTP/1.1: 101 with this `Sec-WebSocket-Accept`.
    SwitchingProtocols { accept: String },
    /// HTTP/2 extended CONNECT: 200; RFC 8441 has no key and no accept.
    ConnectOk,
}

impl ClientAnswer {
    /// The answer choosing `protocol` (the `Sec-WebSocket-Protocol` of either form).
    pub fn response<B: Default>(&self, protocol: Option<&str>) -> Response<B> {
        match self {
            ClientAnswer::SwitchingProtocols { accept } => switching_protocols(accept, protocol),
            ClientAnswer::ConnectOk => connect_ok(protocol),
        }
    }
}

/// Checks the parts of the handshake the routing did not: method, version and key, and says
/// how to answer (`form`: how the client asked).
pub fn validate_handshake(
    method: &Method,
    headers: &HeaderMap,
    form: HandshakeForm,
) -> Result<ClientAnswer, HandshakeError> {
    // An extended CONNECT arrives here rewritten to the HTTP/1.1 form, with a key of our own
    // (extended_connect.rs): the same checks apply, `Sec-WebSocket-Version: 13` included
    // (RFC 8441 §5).
    let accept = validate(method, headers)?;
    Ok(match form {
        HandshakeForm::Http1Upgrade => ClientAnswer::SwitchingProtocols { accept },
        HandshakeForm::ExtendedConnect => ClientAnswer::ConnectOk,
    })
}

/// Checks the parts of an HTTP/1.1 handshake the routing did not: method, version and key.
/// Returns the `Sec-WebSocket-Accept` value.
pub fn validate(method: &Method, headers: &HeaderMap) -> Result<String, HandshakeError> {
    if method != Method::GET {
        return Err(HandshakeError::Method);
    }
    let version = headers.get(header::SEC_WEBSOCKET_VERSION);
    if version.map(|v| v.as_bytes()) != Some(b"13") {
        return Err(HandshakeError::Version);
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or(HandshakeError::Key)?;
    if !is_valid_key(key.as_bytes()) {
        return Err(HandshakeError::Key);
    }
    Ok(derive_accept_key(key.as_bytes()))
}

/// RFC 6455 §4.1: the key is 16 bytes in base64, padded: 24 characters.
pub fn is_valid_key(key: &[u8]) -> bool {
    use base64::Engine;
    let mut decoded = [0u8; 18];
    key.len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode_slice(key, &mut decoded)
            .is_ok_and(|n| n == 16)
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

/// The 200 that opens a WebSocket on an HTTP/2 stream, choosing `protocol` (RFC 8441 §5).
pub fn connect_ok<B: Default>(protocol: Option<&str>) -> Response<B> {
    let mut resp = Response::new(B::default());
    if let Some(p) = protocol.and_then(|p| HeaderValue::from_str(p).ok()) {
        resp.headers_mut().insert(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    resp
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

    fn req(method: Method, version: &str, key: &str) -> (Method, HeaderMap) {
        let mut h = HeaderMap::new();
        h.insert("Sec-WebSocket-Version", version.parse().unwrap());
        h.insert("Sec-WebSocket-Key", key.parse().unwrap());
        (method, h)
    }

    fn validate((method, headers): &(Method, HeaderMap)) -> Result<String, HandshakeError> {
        super::validate(method, headers)
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

    #[test]
    fn the_answer_follows_the_form() {
        let (method, headers) = req(Method::GET, "13", "dGhlIHNhbXBsZSBub25jZQ==");
        let h1 = validate_handshake(&method, &headers, HandshakeForm::Http1Upgrade).unwrap();
        let resp: Response<()> = h1.response(Some("v5.channel.k8s.io"));
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            resp.headers()[header::SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let h2 = validate_handshake(&method, &headers, HandshakeForm::ExtendedConnect).unwrap();
        let resp: Response<()> = h2.response(Some("v5.channel.k8s.io"));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()[header::SEC_WEBSOCKET_PROTOCOL],
            "v5.channel.k8s.io"
        );
        for hop in [
            header::SEC_WEBSOCKET_ACCEPT,
            header::UPGRADE,
            header::CONNECTION,
        ] {
            assert!(!resp.headers().contains_key(&hop), "{hop} on an h2 answer");
        }
        // The version is checked on HTTP/2 too.
        let (method, headers) = req(Method::GET, "8", "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(
            validate_handshake(&method, &headers, HandshakeForm::ExtendedConnect).unwrap_err(),
            HandshakeError::Version
        );
    }

    #[test]
    fn the_key_is_base64_of_16_bytes() {
        // 24 characters, but not base64 / not 16 bytes / padding in the wrong place.
        for bad in [
            "!!!!!!!!!!!!!!!!!!!!!!==",
            "AAAAAAAAAAAAAAAAAAAAAAAA",
            "AAAAAAAAAAAAAAAAAAAAA===",
            "AAAAAAAAAAAAAAAAAAAAAA=A",
        ] {
            assert_eq!(
                validate(&req(Method::GET, "13", bad)).unwrap_err(),
                HandshakeError::Key,
                "{bad}"
            );
        }
        assert!(is_valid_key(b"AAAAAAAAAAAAAAAAAAAAAA=="));
    }
}
