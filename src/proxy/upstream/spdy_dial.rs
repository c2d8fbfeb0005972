//! Dialling the upstream with an `Upgrade: SPDY/3.1` request on behalf of a client request:
//! shared by the exec translator and the port-forward tunnel.

use std::net::SocketAddr;

use http::{header, HeaderMap, HeaderName, Method};

use super::endpoint::{Upstream, UpstreamError, UpstreamIo};
use super::error::{UpstreamFailure, TALKING_FAILED};
use crate::proxy::wire::headers::set_forwarding_headers;
use crate::spdy::upgrade::{upgrade, UpgradeError, UpgradeRequest, Upgraded};

/// Why the upstream SPDY session could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
    #[error("the upstream did not answer the upgrade within {0:?}")]
    Timeout(std::time::Duration),
}

impl DialError {
    /// The upstream's HTTP status when it refused the upgrade; 0 when there was no HTTP answer
    /// (dial, TLS or timeout failures). The label of the upgrade-failure metric.
    pub fn upstream_status(&self) -> u16 {
        match self {
            DialError::Upgrade(UpgradeError::Refused { status, .. }) => status.as_u16(),
            _ => 0,
        }
    }
}

impl UpstreamFailure for DialError {
    fn client_reason(&self) -> String {
        match self {
            DialError::Upstream(e) => e.client_reason().to_owned(),
            // An I/O error on a TLS connection may carry the alert the upstream sent.
            DialError::Upgrade(UpgradeError::Io(_)) => TALKING_FAILED.to_owned(),
            // The shape of the upstream's answer, or how long we waited: nothing internal.
            DialError::Upgrade(_) | DialError::Timeout(_) => self.to_string(),
        }
    }

    fn log_kind(&self) -> &'static str {
        match self {
            DialError::Upstream(e) => UpstreamFailure::log_kind(e),
            DialError::Upgrade(_) => "upstream_upgrade",
            DialError::Timeout(_) => "upstream_answer_timeout",
        }
    }
}

/// Client headers that describe the client's own connection or WebSocket handshake and must not
/// reach the upstream SPDY request.
const NOT_FORWARDED: &[HeaderName] = &[
    header::HOST,
    header::CONNECTION,
    header::UPGRADE,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::SEC_WEBSOCKET_ACCEPT,
];

/// The end-to-end headers to send upstream: everything the client sent except its connection
/// and handshake headers (Authorization, Impersonate-*, User-Agent … pass unchanged here; the
/// auth mode rewrites them next), and the origin headers (`X-Forwarded-For`, `X-Real-Ip`,
/// `Forwarded`; `trust_forwarded_for`: see [`set_forwarding_headers`]).
pub fn upstream_headers(
    client: &HeaderMap,
    peer: SocketAddr,
    trust_forwarded_for: bool,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len() + 1);
    let named_in_connection: Vec<String> = client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect();
    for (name, value) in client {
        if NOT_FORWARDED.contains(name)
            || name.as_str().eq_ignore_ascii_case("keep-alive")
            || name.as_str().eq_ignore_ascii_case("proxy-connection")
            || named_in_connection.iter().any(|n| n == name.as_str())
            || name
                .as_str()
                .eq_ignore_ascii_case("x-stream-protocol-version")
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    set_forwarding_headers(&mut out, peer.ip(), trust_forwarded_for);
    out
}

/// Dials the upstream and performs the SPDY upgrade for `path_and_query`; the upgrade answer
/// must arrive within `timeout` (the dial has its own timeout).
pub async fn dial_spdy(
    upstream: &Upstream,
    path_and_query: &str,
    headers: HeaderMap,
    protocols: Vec<String>,
    timeout: std::time::Duration,
) -> Result<Upgraded<UpstreamIo>, DialError> {
    let io = upstream.connect_raw().await?;
    let req = UpgradeRequest {
        method: Method::POST,
        path_and_query: upstream.join_path(path_and_query),
        host: upstream.authority(),
        headers,
        protocols,
    };
    match tokio::time::timeout(timeout, upgrade(io, &req)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(DialError::Timeout(timeout)),
    }
}
