//! SPDY upgrades (kubectl ≤ 1.30) for exec, attach and port-forward under
//! `--upstream-streaming auto`: relayed unchanged where the path to the upstream carries SPDY,
//! translated to WebSocket ([`reverse_handler`]) where it refuses SPDY.
//!
//! The client's upgrade goes upstream as the relay would send it, so a cluster that takes SPDY
//! costs nothing extra. A refusal that is not the cluster's own answer ([`after_refusal`]: a
//! SPDY-dropping gateway's page, a bare 400) sends the session to the reverse translator, and
//! the memory sends later ones there directly for a while. A Kubernetes `Status` (401, 403,
//! 404 …) is the cluster's answer and is delivered as the relay delivers it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::auth::Caller;
use super::body::ProxyBody;
use super::metrics::SessionKind;
use super::refusal_body::read_body;
use super::relay;
use super::reverse_handler;
use super::session_audit;
use super::sessions::SessionSlot;
use super::state::ProxyState;
use super::upgrade_request::UpgradeRequest;
use super::upstream_streaming::{
    after_refusal, log_decision, ClientProtocol, RefusalAnswer, StreamFamily, UpstreamPath,
};
use crate::translate::exec_options::Subresource;

/// Handles a SPDY exec, attach (`subresource`) or port-forward upgrade under `auto`; `slot` is
/// its admission.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    peer: SocketAddr,
    caller: Caller,
    subresource: Subresource,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    let family = match subresource {
        Subresource::PortForward => StreamFamily::PortForward,
        _ => StreamFamily::RemoteCommand,
    };
    let upstream = state.upstream.authority();
    let remembered =
        state
            .streaming_memory
            .recall(&upstream, family, ClientProtocol::Spdy, Instant::now());
    if remembered == Some(UpstreamPath::Reverse) {
        return reverse_handler::handle(state, req, peer, caller, slot).await;
    }
    let upstream_req =
        match relay::upstream_request(&state, &req.parts, req.body.clone(), peer, &caller) {
            Ok(r) => r,
            Err(e) => return e.response(),
        };
    let credentials = upstream_req.headers().get(header::AUTHORIZATION).cloned();
    let (answer, identity) = tokio::join!(
        relay::ask_upstream(&state, upstream_req),
        session_audit::identify(&state, &caller, credentials),
    );
    let learn = |path| {
        if state
            .streaming_memory
            .learn(&upstream, family, path, Instant::now())
        {
            log_decision(&upstream, family, path);
        }
    };
    let answer = match answer {
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            learn(UpstreamPath::Relay);
            Ok(resp.map(BodyExt::boxed))
        }
        Ok(resp) => {
            // Never a stream for these subresources: a refusal, read (bounded) to decide on it.
            let (parts, body) = resp.into_parts();
            let body = read_body(body, state.handshake_timeout).await;
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            if after_refusal(parts.status.as_u16(), content_type, &body) == RefusalAnswer::FallBack
            {
                learn(UpstreamPath::Reverse);
                return reverse_handler::handle(state, req, peer, caller, slot).await;
            }
            let body = Full::new(body).map_err(|never| match never {}).boxed();
            Ok(Response::from_parts(parts, body))
        }
        Err(e) => Err(e),
    };
    relay::relay_answered(
        &state,
        req,
        peer,
        SessionKind::SpdyRelay,
        slot,
        &caller,
        answer,
        identity,
    )
    .await
}
