//! The WebSocket subprotocols a client offers, and the entry that carries a bearer token.

use http::HeaderMap;

/// The WebSocket subprotocol entry that carries a bearer token (PROTOCOL.md §1.2).
pub(crate) const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Comma-split, trimmed values of every `Sec-WebSocket-Protocol` line, in order.
pub(crate) fn offered_subprotocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}
