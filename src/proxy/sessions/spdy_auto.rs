//! SPDY upgrades (kubectl ≤ 1.30) for exec, attach and port-forward under
//! `--upstream-streaming auto`: relayed unchanged where the path to the upstream carries SPDY,
//! translated to WebSocket ([`reverse_handler`]) where it refuses SPDY.
//!
//! The client's upgrade goes upstream as the relay would send it, so a cluster that takes SPDY
//! costs nothing extra. A refusal that is not the cluster's own answer ([`after_refusal`]: a
//! SPDY-dropping gateway's page, a bare 400) makes the reverse translator ask once for this
//! session; if its upstream takes it, the memory sends later ones there directly for a while.
//! A Kubernetes `Status` (401, 403, 404 …) is the cluster's answer and is delivered as the
//! relay delivers it.

use std::sync::Arc;
use std::time::Instant;

use http::{header, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::registry::SessionSlot;
use super::relay::{self, RelayError};
use super::reverse_handler;
use super::session_audit::{self, AuditIdentity};
use super::state::ProxyState;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::SessionKind;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::refusal_body::HeldRefusal;
use crate::proxy::upstream::streaming::{
    after_first, after_refusal, after_second, log_decision, log_forgotten, AfterFirst, AfterSecond,
    Answer, ClientProtocol, StreamFamily, UpstreamPath,
};
use crate::proxy::upstream::websocket_dial::WebSocketDialError;
use crate::proxy::wire::body::ProxyBody;
use crate::translate::exec_options::Subresource;

/// The upstream's answer to the client's SPDY upgrade, relayed.
enum Relayed {
    /// 101: the session is relayed.
    Accepted(Response<Incoming>),
    /// Any other answer, the beginning of its body read.
    Refused(HeldRefusal),
    /// No answer.
    Failed(RelayError),
}

impl Relayed {
    /// How `auto` judges it.
    fn answer(&self) -> Answer {
        match self {
            Relayed::Accepted(_) => Answer::Accepted,
            Relayed::Refused(held) => held.answer().into(),
            Relayed::Failed(_) => Answer::NoAnswer,
        }
    }
}

/// How `auto` judges the reverse translator's upstream answer: a 101 without the offered
/// subprotocol is a path that does not serve it.
fn reverse_answer(dialled: &reverse_handler::Dialled) -> Answer {
    match dialled {
        Ok(_) => Answer::Accepted,
        Err(WebSocketDialError::Refused {
            status,
            headers,
            body,
        }) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            after_refusal(status.as_u16(), content_type, body).into()
        }
        Err(WebSocketDialError::BadHandshake(_)) => Answer::Unrecognised,
        Err(_) => Answer::NoAnswer,
    }
}

/// Handles a SPDY exec, attach (`subresource`) or port-forward upgrade under `auto`; `slot` is
/// its admission. The relay is asked first unless the reverse translator is remembered; a 101
/// is served and learned, the cluster's Status delivered, anything else makes the other path
/// ask once (learned only if its upstream takes it). When both refuse, the client gets the
/// cluster's Status if the second answer is one, else the first refusal as it came.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
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
        return remembered_reverse(state, req, stream, family, slot).await;
    }
    let (relayed, identity) = match ask_relay(&state, &req, &stream).await {
        Ok(asked) => asked,
        Err(refused) => return refused,
    };
    match after_first(false, relayed.answer()) {
        AfterFirst::Serve => learn(&state, family, UpstreamPath::Relay),
        AfterFirst::Deliver => {}
        AfterFirst::TryOther { .. } => {
            let dialled = reverse_handler::dial(&state, &req, &stream).await;
            match after_second(reverse_answer(&dialled)) {
                // The reverse translator's session or its Status; only a 101 is learned.
                second @ (AfterSecond::Serve | AfterSecond::DeliverSecond) => {
                    if second == AfterSecond::Serve {
                        learn(&state, family, UpstreamPath::Reverse);
                    }
                    return reverse_handler::handle_dialled(
                        state,
                        req,
                        stream,
                        slot,
                        Some(dialled),
                    )
                    .await;
                }
                AfterSecond::DeliverFirst => drop(dialled),
            }
        }
    }
    relay_answer(&state, req, stream, slot, relayed, identity).await
}

/// The reverse translator remembered: asked first. A 101 is served (and keeps the memory
/// fresh), the cluster's Status delivered; an unrecognised refusal forgets the memory and asks
/// the relay once, which is learned if its upstream takes it. When both refuse, the client gets
/// the relay's Status if it is one, else the reverse translator's refusal.
async fn remembered_reverse(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    family: StreamFamily,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    let dialled = reverse_handler::dial(&state, &req, &stream).await;
    match after_first(true, reverse_answer(&dialled)) {
        AfterFirst::Serve => learn(&state, family, UpstreamPath::Reverse),
        AfterFirst::Deliver => {}
        AfterFirst::TryOther { .. } => {
            let upstream = state.upstream.authority();
            if state
                .streaming_memory
                .forget(&upstream, family, UpstreamPath::Reverse)
            {
                log_forgotten(&upstream, family, UpstreamPath::Reverse);
            }
            let (relayed, identity) = match ask_relay(&state, &req, &stream).await {
                Ok(asked) => asked,
                Err(refused) => return refused,
            };
            match after_second(relayed.answer()) {
                AfterSecond::Serve => learn(&state, family, UpstreamPath::Relay),
                AfterSecond::DeliverSecond => {}
                AfterSecond::DeliverFirst => {
                    return reverse_handler::handle_dialled(state, req, stream, slot, Some(dialled))
                        .await
                }
            }
            return relay_answer(&state, req, stream, slot, relayed, identity).await;
        }
    }
    reverse_handler::handle_dialled(state, req, stream, slot, Some(dialled)).await
}

/// Asks the upstream with the client's SPDY upgrade, as the relay sends it, finding out who
/// the caller is for the audit meanwhile.
async fn ask_relay(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
) -> Result<(Relayed, AuditIdentity), Response<ProxyBody>> {
    let upstream_req = relay::upstream_request(state, req, stream).map_err(|e| e.response())?;
    let credentials = upstream_req.headers().get(header::AUTHORIZATION).cloned();
    let (answer, identity) = tokio::join!(
        relay::ask_upstream(state, upstream_req),
        session_audit::identify(state, &stream.caller, credentials),
    );
    let relayed = match answer {
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => Relayed::Accepted(resp),
        // Never a stream for these subresources: a refusal, its beginning read to decide on it
        // (the rest streams through if it is passed on).
        Ok(resp) => Relayed::Refused(HeldRefusal::hold(resp, state.handshake_timeout).await),
        Err(e) => Relayed::Failed(e),
    };
    Ok((relayed, identity))
}

/// Hands the relay's answer to the relay: the session on a 101, else the answer as it came.
async fn relay_answer(
    state: &ProxyState,
    req: UpgradeRequest,
    stream: StreamRequest,
    slot: SessionSlot,
    relayed: Relayed,
    identity: AuditIdentity,
) -> Response<ProxyBody> {
    let answer = match relayed {
        Relayed::Accepted(resp) => Ok(resp.map(BodyExt::boxed)),
        Relayed::Refused(held) => Ok(held.into_response()),
        Relayed::Failed(e) => Err(e),
    };
    relay::relay_answered(
        state,
        req,
        stream,
        SessionKind::SpdyRelay,
        slot,
        answer,
        identity,
    )
    .await
}

/// Notes that `path`'s upstream answered 101; logs a change of mind once.
fn learn(state: &ProxyState, family: StreamFamily, path: UpstreamPath) {
    let upstream = state.upstream.authority();
    if state
        .streaming_memory
        .learn(&upstream, family, path, Instant::now())
    {
        log_decision(&upstream, family, path);
    }
}
