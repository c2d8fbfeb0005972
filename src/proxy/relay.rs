//! Byte-for-byte relay of upgrades the upstream serves natively: SPDY/3.1 (kubectl ≤ 1.30 and
//! kubectl's fallback), legacy WebSocket exec/port-forward and log streaming. The upstream
//! decides; we pass its answer through and then copy bytes both ways.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info};

use super::auth::{Authenticator, Caller};
use super::classify::RelayKind;
use super::forward::ProxyBody;
use super::headers::{append_x_forwarded_for, is_hop_by_hop};
use super::metrics::{SessionKind, SessionOutcome};
use super::sessions::{next_session_id, SessionSlot};
use super::state::ProxyState;
use super::status_response::failure;
use super::upstream::Upstream;
use crate::spdy::upgrade::{read_body, read_response_head};

/// Largest request body relayed with an upgrade request (they normally have none).
const MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest refusal body passed back.
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// Bytes moved by one relayed connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayStats {
    pub client_to_upstream: u64,
    pub upstream_to_client: u64,
}

/// Relays one upgrade request; `slot` is its admission as a streaming session.
pub async fn relay(
    state: &ProxyState,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    kind: RelayKind,
    slot: SessionSlot,
    caller: &Caller,
) -> Response<ProxyBody> {
    let kind = match kind {
        RelayKind::Spdy => SessionKind::SpdyRelay,
        RelayKind::WebSocket | RelayKind::Other => SessionKind::WebSocketRelay,
    };
    let upstream = &state.upstream;
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "connection cannot be upgraded",
        );
    };
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                "upgrade request body too large",
            )
        }
    };
    // From here on a failure is the upstream's (an unfinished guard counts as upstream_error).
    let guard = state.metrics.session(kind);
    let pq = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let head = request_head(upstream, &state.auth, caller, &parts, pq, peer, body.len());

    let mut io = match upstream.connect_raw().await {
        Ok(io) => io,
        Err(e) => {
            return failure(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                format!("error dialing the upstream: {e}"),
            )
        }
    };
    let sent = async {
        io.write_all(&head).await?;
        if !body.is_empty() {
            io.write_all(&body).await?;
        }
        io.flush().await
    };
    if let Err(e) = sent.await {
        return failure(StatusCode::BAD_GATEWAY, "ServiceUnavailable", e.to_string());
    }
    let (resp_head, leftover) = match read_response_head(&mut io).await {
        Ok(h) => h,
        Err(e) => {
            return failure(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                format!("invalid upstream response: {e}"),
            )
        }
    };

    if resp_head.status != StatusCode::SWITCHING_PROTOCOLS {
        state
            .metrics
            .upstream_upgrade_failure(resp_head.status.as_u16());
        guard.finish(SessionOutcome::UpstreamError, 0, 0);
        let body = read_body(&mut io, &resp_head.headers, leftover, MAX_RESPONSE_BODY)
            .await
            .unwrap_or_default();
        let mut resp = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
        *resp.status_mut() = resp_head.status;
        for (name, value) in &resp_head.headers {
            if !is_hop_by_hop(name) && name != header::CONTENT_LENGTH {
                resp.headers_mut().append(name.clone(), value.clone());
            }
        }
        return resp;
    }

    let path = parts.uri.path().to_owned();
    let leftover = leftover.freeze();
    let user = caller.user().map(str::to_owned);
    tokio::spawn(async move {
        let client = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(error = %e, "client upgrade failed");
                guard.finish(SessionOutcome::ClientGone, 0, 0);
                return;
            }
        };
        let started = std::time::Instant::now();
        // A relay carries a protocol we do not parse: on shutdown it can only be cut.
        let (stats, outcome) = tokio::select! {
            stats = pump(TokioIo::new(client), io, leftover) => (stats, SessionOutcome::Success),
            _ = slot.stop_token().cancelled_owned() => (RelayStats::default(), SessionOutcome::Drained),
        };
        drop(slot);
        guard.finish(outcome, stats.client_to_upstream, stats.upstream_to_client);
        info!(
            session = next_session_id(),
            kind = kind.label(),
            user = user.as_deref().unwrap_or(""),
            path = %path,
            outcome = outcome.label(),
            bytes_up = stats.client_to_upstream,
            bytes_down = stats.upstream_to_client,
            duration_ms = started.elapsed().as_millis() as u64,
            "relayed upgrade finished"
        );
    });
    let mut resp = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    // The upstream's 101 headers verbatim: Upgrade, Sec-WebSocket-Accept/-Protocol,
    // X-Stream-Protocol-Version … belong to the protocol the two ends agreed on.
    *resp.headers_mut() = resp_head.headers;
    resp
}

/// The request head for the upstream: the client's headers minus hop-by-hop ones (but keeping
/// the upgrade), the upstream's Host, and X-Forwarded-For.
fn request_head(
    upstream: &Upstream,
    auth: &Authenticator,
    caller: &Caller,
    parts: &http::request::Parts,
    pq: &str,
    peer: SocketAddr,
    body_len: usize,
) -> Vec<u8> {
    let mut headers = parts.headers.clone();
    let upgrade = headers.get(header::UPGRADE).cloned();
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    super::headers::remove_hop_by_hop(&mut headers);
    append_x_forwarded_for(&mut headers, peer.ip());
    auth.apply(caller, &mut headers);
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(upstream.join_path(pq).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(upstream.authority().as_bytes());
    out.extend_from_slice(b"\r\nConnection: Upgrade\r\n");
    if let Some(u) = upgrade {
        out.extend_from_slice(b"Upgrade: ");
        out.extend_from_slice(u.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || parts.method == http::Method::POST {
        out.extend_from_slice(format!("Content-Length: {body_len}\r\n").as_bytes());
    }
    for (name, value) in &headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Copies both ways until both directions end; a finished direction half-closes the other side.
pub async fn pump<C, U>(client: C, upstream: U, leftover: Bytes) -> RelayStats
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let down = async {
        let mut n = leftover.len() as u64;
        if !leftover.is_empty() && cw.write_all(&leftover).await.is_err() {
            return n;
        }
        n += copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
        n
    };
    let up = async {
        let n = copy(&mut cr, &mut uw).await;
        let _ = uw.shutdown().await;
        n
    };
    let (upstream_to_client, client_to_upstream) = tokio::join!(down, up);
    RelayStats {
        client_to_upstream,
        upstream_to_client,
    }
}

/// Copies until EOF or an error, with one bounded buffer; returns the bytes copied.
async fn copy<R, W>(r: &mut R, w: &mut W) -> u64
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    let mut total = 0u64;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            return total;
        }
        total += n as u64;
    }
}
