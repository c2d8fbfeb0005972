//! Bearer tokens on both sides of the proxy: the WebSocket subprotocol entry browsers send
//! (PROTOCOL.md §1.2), and how a request the simulated cluster saw carried the token.

use base64::Engine;
use kube_ws_proxy::sim::SeenRequest;

/// Prefix of the subprotocol entry that carries a bearer token.
pub const PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// The subprotocol entry for `token`: base64url of its UTF-8 bytes, unpadded.
pub fn entry(token: &str) -> String {
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
    )
}

/// How an upstream request carried the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// `Authorization: Bearer <token>`.
    Header,
    /// The subprotocol entry, passed on as the client sent it.
    Subprotocol,
    /// Not at all.
    Missing,
}

/// How `req` carried `token` (the header wins when both are there).
pub fn carrier(req: &SeenRequest, token: &str) -> Carrier {
    let header = req
        .headers
        .iter()
        .filter(|(n, _)| n == "authorization")
        .any(|(_, v)| v.strip_prefix("Bearer ") == Some(token));
    if header {
        return Carrier::Header;
    }
    let wanted = entry(token);
    let in_protocols = req
        .headers
        .iter()
        .filter(|(n, _)| n == "sec-websocket-protocol")
        .flat_map(|(_, v)| v.split(','))
        .any(|p| p.trim() == wanted);
    if in_protocols {
        Carrier::Subprotocol
    } else {
        Carrier::Missing
    }
}

/// Whether `req` offered a bearer subprotocol entry at all (any token).
pub fn offers_entry(req: &SeenRequest) -> bool {
    req.headers
        .iter()
        .filter(|(n, _)| n == "sec-websocket-protocol")
        .flat_map(|(_, v)| v.split(','))
        .any(|p| p.trim().starts_with(PREFIX))
}
