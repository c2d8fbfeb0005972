//! Dialling the upstream as a WebSocket client on behalf of a client request (the reverse
//! translator: kubectl ≤ 1.30's SPDY towards a WebSocket-only upstream). The handshake is sent
//! with hyper on a fresh upstream connection, so bytes the upstream sends right after its 101
//! stay with the upgraded connection; a refusal comes back whole (status, headers, a capped
//! body) so the caller can replay it to the client.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use super::endpoint::{Upstream, UpstreamError};
use super::error::{UpstreamFailure, TALKING_FAILED};

/// The upstream's side of a WebSocket the proxy dialled.
pub type UpstreamSocket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The upstream socket's read buffer.
const READ_BUFFER: usize = 16 * 1024;
/// Largest message or frame taken from the upstream, whatever `--max-message-size` says for
/// clients: kube-apiserver and the kubelets write each output chunk (32 KiB at most, and a
/// channel byte) as one message, and a session holds a few of them at most (one being read,
/// the SPDY stream's outgoing frames).
pub const MAX_UPSTREAM_MESSAGE: usize = 1024 * 1024;
/// Largest refusal body kept for the client (room for a Kubernetes `Status` of any realistic
/// size; `auto` replays it whole).
const MAX_REFUSAL_BODY: usize = 1024 * 1024;

/// A WebSocket the upstream accepted.
pub struct DialedWebSocket {
    pub socket: UpstreamSocket,
    /// The subprotocol it chose, if any.
    pub protocol: Option<String>,
}

impl std::fmt::Debug for DialedWebSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DialedWebSocket")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// Why the upstream WebSocket was not opened.
#[derive(Debug, thiserror::Error)]
pub enum WebSocketDialError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("error talking to the upstream: {0}")]
    Http(#[from] hyper::Error),
    #[error("the upstream did not answer the upgrade within {0:?}")]
    Timeout(std::time::Duration),
    #[error("invalid upgrade request: {0}")]
    Request(String),
    /// Any answer other than 101.
    #[error("upgrade refused with HTTP {status}")]
    Refused {
        status: StatusCode,
        headers: Box<HeaderMap>,
        body: Bytes,
    },
    /// A 101 that is not a valid WebSocket handshake answer.
    #[error("invalid WebSocket handshake answer: {0}")]
    BadHandshake(&'static str),
}

impl WebSocketDialError {
    /// The upstream's HTTP status when it refused; 0 when there was no HTTP answer.
    pub fn upstream_status(&self) -> u16 {
        match self {
            WebSocketDialError::Refused { status, .. } => status.as_u16(),
            _ => 0,
        }
    }
}

impl UpstreamFailure for WebSocketDialError {
    fn client_reason(&self) -> String {
        match self {
            WebSocketDialError::Upstream(e) => e.client_reason().to_owned(),
            // hyper's error may wrap an I/O error carrying a TLS alert.
            WebSocketDialError::Http(_) => TALKING_FAILED.to_owned(),
            WebSocketDialError::Timeout(_)
            | WebSocketDialError::Request(_)
            | WebSocketDialError::Refused { .. }
            | WebSocketDialError::BadHandshake(_) => self.to_string(),
        }
    }

    fn log_kind(&self) -> &'static str {
        match self {
            WebSocketDialError::Upstream(e) => UpstreamFailure::log_kind(e),
            WebSocketDialError::Http(_) => "upstream_connection",
            WebSocketDialError::Timeout(_) => "upstream_answer_timeout",
            WebSocketDialError::Request(_)
            | WebSocketDialError::Refused { .. }
            | WebSocketDialError::BadHandshake(_) => "upstream_upgrade",
        }
    }
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64.
fn new_key() -> String {
    use base64::Engine;
    let mut raw = [0u8; 16];
    // The key only has to differ between handshakes; a failing source leaves it fixed.
    let _ = getrandom::fill(&mut raw);
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// Opens a WebSocket to `path_and_query` on the upstream, offering `protocols`, with the
/// end-to-end `headers` (credentials included). The answer must come within `timeout` (the
/// dial has its own). Messages from the upstream may be up to `max_message` bytes, and never
/// more than [`MAX_UPSTREAM_MESSAGE`].
pub async fn dial_websocket(
    upstream: &Upstream,
    path_and_query: &str,
    headers: HeaderMap,
    protocols: &[&str],
    timeout: std::time::Duration,
    max_message: usize,
) -> Result<DialedWebSocket, WebSocketDialError> {
    let key = new_key();
    let req = handshake_request(upstream, path_and_query, headers, protocols, &key)?;
    let mut resp = send_handshake(upstream, req, timeout).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(refused(resp, timeout).await);
    }
    let protocol = check_answer(resp.headers(), &key, protocols)?;
    let upgraded = match tokio::time::timeout(timeout, hyper::upgrade::on(&mut resp)).await {
        Ok(upgraded) => upgraded?,
        Err(_) => return Err(WebSocketDialError::Timeout(timeout)),
    };
    // tungstenite allocates its read buffer up front (128 KiB by default): an idle session
    // should not hold that; reads of a busy one still take 16 KiB at a time.
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(max_message.min(MAX_UPSTREAM_MESSAGE)))
        .max_frame_size(Some(max_message.min(MAX_UPSTREAM_MESSAGE)));
    let socket =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config)).await;
    Ok(DialedWebSocket { socket, protocol })
}

/// The WebSocket handshake for the upstream: `headers` with the upstream's Host, the upgrade,
/// `key` and the `protocols` offered.
fn handshake_request(
    upstream: &Upstream,
    path_and_query: &str,
    mut headers: HeaderMap,
    protocols: &[&str],
    key: &str,
) -> Result<Request<Empty<Bytes>>, WebSocketDialError> {
    let uri: Uri = upstream
        .join_path(path_and_query)
        .parse()
        .map_err(|e: http::uri::InvalidUri| WebSocketDialError::Request(e.to_string()))?;
    let host = HeaderValue::from_str(&upstream.authority())
        .map_err(|e| WebSocketDialError::Request(e.to_string()))?;
    headers.insert(header::HOST, host);
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_KEY,
        HeaderValue::from_str(key).expect("base64 is a valid header value"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_str(&protocols.join(", "))
            .map_err(|e| WebSocketDialError::Request(e.to_string()))?,
    );
    let mut req = Request::new(Empty::<Bytes>::new());
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Sends `req` on a fresh upstream connection; its answer's head must come within `timeout`.
async fn send_handshake(
    upstream: &Upstream,
    req: Request<Empty<Bytes>>,
    timeout: std::time::Duration,
) -> Result<hyper::Response<hyper::body::Incoming>, WebSocketDialError> {
    let io = upstream.connect_raw().await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "upstream WebSocket connection ended with an error");
        }
    });
    match tokio::time::timeout(timeout, sender.send_request(req)).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(WebSocketDialError::Timeout(timeout)),
    }
}

/// A refusal whole, for the client: status, headers and a capped body (what came of it
/// within `timeout`).
async fn refused(
    mut resp: hyper::Response<hyper::body::Incoming>,
    timeout: std::time::Duration,
) -> WebSocketDialError {
    let status = resp.status();
    let headers = Box::new(std::mem::take(resp.headers_mut()));
    let body = tokio::time::timeout(
        timeout,
        Limited::new(resp.into_body(), MAX_REFUSAL_BODY).collect(),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .map(|b| b.to_bytes())
    .unwrap_or_default();
    WebSocketDialError::Refused {
        status,
        headers,
        body,
    }
}

/// Checks a 101's headers `h` as a WebSocket handshake answer to `key` offering `protocols`;
/// the subprotocol the upstream chose, if any.
fn check_answer(
    h: &HeaderMap,
    key: &str,
    protocols: &[&str],
) -> Result<Option<String>, WebSocketDialError> {
    let is_websocket = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    if !is_websocket {
        return Err(WebSocketDialError::BadHandshake("no Upgrade: websocket"));
    }
    if h.get(header::SEC_WEBSOCKET_ACCEPT).map(|v| v.as_bytes())
        != Some(derive_accept_key(key.as_bytes()).as_bytes())
    {
        return Err(WebSocketDialError::BadHandshake(
            "Sec-WebSocket-Accept does not match the key",
        ));
    }
    let protocol = h
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    if protocol
        .as_deref()
        .is_some_and(|chosen| !protocols.contains(&chosen))
    {
        return Err(WebSocketDialError::BadHandshake(
            "the upstream chose a subprotocol that was not offered",
        ));
    }
    Ok(protocol)
}
