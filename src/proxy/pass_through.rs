//! v5 exec/attach and the port-forward tunnel under `--upstream-streaming websocket|auto`: the
//! client's WebSocket upgrade goes upstream unchanged (its bearer subprotocol entry turned into
//! credentials as `--auth-mode` says), and on the upstream's 101 the bytes are copied both ways
//! by the relay (src/proxy/relay.rs), which also applies the session limit, idle timeout,
//! drain, metrics, logs, audit and recording. No framing work is done on the way.
//!
//! Under `auto` an old cluster's refusal (see [`after_refusal`]) sends the session to the SPDY
//! translation instead, and the memory keeps later sessions from asking again for a while.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::auth::Caller;
use super::body::ProxyBody;
use super::headers::remove_hop_by_hop;
use super::metrics::SessionKind;
use super::refusal_body::read_body;
use super::relay::{self, RelayError};
use super::request_layers;
use super::session_audit::{self, AuditIdentity, SessionClient};
use super::sessions::{next_session_id, SessionSlot};
use super::state::ProxyState;
use super::status_response::failure;
use super::upgrade_request::UpgradeRequest;
use super::upstream_streaming::{
    after_refusal, log_decision, ClientProtocol, RefusalAnswer, StreamFamily, UpstreamPath,
    UpstreamStreaming,
};
use super::websocket::is_valid_key;
use super::{exec_handler, tunnel_handler};
use crate::audit::ProtocolPath;
use crate::translate::exec_options::Subresource;
use crate::translate::protocol::{ChannelProtocol, TUNNEL_PREFIX};
use crate::translate::status::Status;
use crate::translate::status_mapping::from_upgrade_refusal;
use crate::translate::subprotocol::BEARER_PREFIX;

/// A streaming request that may be passed through.
#[derive(Debug)]
pub enum Streamed {
    /// exec/attach offering `v5.channel.k8s.io`.
    RemoteCommand(Subresource),
    /// The port-forward tunnel; the de-prefixed SPDY protocols.
    Tunnel(Vec<String>),
}

impl Streamed {
    /// The client's offered subprotocols the upstream is offered: `v5.channel.k8s.io` alone
    /// for exec/attach, the `SPDY/3.1+…k8s.io` entries for the tunnel (never the bearer entry).
    fn upstream_offer(&self, client: &HeaderMap) -> Vec<String> {
        client
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|p| !p.starts_with(BEARER_PREFIX))
            .filter(|p| match self {
                Streamed::RemoteCommand(_) => *p == ChannelProtocol::V5.name(),
                Streamed::Tunnel(_) => p.starts_with(TUNNEL_PREFIX) && p.ends_with(".k8s.io"),
            })
            .map(str::to_owned)
            .collect()
    }

    fn family(&self) -> StreamFamily {
        match self {
            Streamed::RemoteCommand(_) => StreamFamily::RemoteCommand,
            Streamed::Tunnel(_) => StreamFamily::PortForward,
        }
    }
}

/// The upstream's answer to the client's upgrade.
enum Asked {
    /// 101 with a subprotocol the client offered.
    Accepted(Response<Incoming>),
    /// Any other answer, its body read (bounded).
    Refused {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// A 101 the client could not use (no or another subprotocol, not a WebSocket).
    Unusable(String),
    /// No answer.
    Failed(RelayError),
}

/// Handles a v5 exec/attach or tunnel request as `--upstream-streaming` says.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    peer: SocketAddr,
    caller: Caller,
    streamed: Streamed,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    let family = streamed.family();
    let upstream = state.upstream.authority();
    let setting = state.upstream_streaming;
    let remembered =
        state
            .streaming_memory
            .recall(&upstream, family, ClientProtocol::WebSocket, Instant::now());
    if setting == UpstreamStreaming::Spdy
        || (setting == UpstreamStreaming::Auto && remembered == Some(UpstreamPath::Spdy))
    {
        return translate(state, req, peer, caller, streamed, slot, None).await;
    }
    if !req
        .parts
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .is_some_and(|k| is_valid_key(k.as_bytes()))
    {
        return failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "missing or invalid Sec-WebSocket-Key",
        );
    }
    let mut upstream_req =
        match relay::upstream_request(&state, &req.parts, req.body.clone(), peer, &caller) {
            Ok(r) => r,
            Err(e) => return e.response(),
        };
    // Only what the translation would speak is offered: a client that also offers v4 must not
    // end up with a v4 session on an old cluster (which picks v4, and starts the command, where
    // the translation would have given it v5).
    let offer = streamed.upstream_offer(&req.parts.headers);
    match HeaderValue::from_str(&offer.join(", ")) {
        Ok(v) if !offer.is_empty() => {
            upstream_req
                .headers_mut()
                .insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
        _ => {
            return failure(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "no WebSocket subprotocol to offer upstream",
            )
        }
    }
    let credentials = upstream_req.headers().get(header::AUTHORIZATION).cloned();
    let (answer, identity) = tokio::join!(
        relay::ask_upstream(&state, upstream_req),
        session_audit::identify(&state, &caller, credentials),
    );
    let asked = match answer {
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            match unusable(&offer, &resp) {
                Some(why) => Asked::Unusable(why),
                None => Asked::Accepted(resp),
            }
        }
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let body = read_body(body, state.handshake_timeout).await;
            Asked::Refused {
                status: parts.status,
                headers: parts.headers,
                body,
            }
        }
        Err(e) => Asked::Failed(e),
    };
    let auto = setting == UpstreamStreaming::Auto;
    let learn = |path| {
        if auto
            && state
                .streaming_memory
                .learn(&upstream, family, path, Instant::now())
        {
            log_decision(&upstream, family, path);
        }
    };
    match asked {
        Asked::Accepted(resp) => {
            learn(UpstreamPath::PassThrough);
            carry(&state, req, peer, &caller, slot, resp, identity).await
        }
        Asked::Refused {
            status,
            headers,
            body,
        } => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            let answer = after_refusal(status.as_u16(), content_type, &body);
            if auto && answer == RefusalAnswer::FallBack {
                learn(UpstreamPath::Spdy);
                return translate(state, req, peer, caller, streamed, slot, None).await;
            }
            state.metrics.upstream_upgrade_failure(status.as_u16());
            let refusal = match answer {
                RefusalAnswer::Deliver => Delivered::Replay {
                    status,
                    headers,
                    body,
                },
                RefusalAnswer::FallBack => Delivered::Unsupported(format!(
                    "the upstream answered {} to the {} WebSocket upgrade",
                    status.as_u16(),
                    family.label()
                )),
            };
            deliver(state, req, peer, caller, streamed, slot, refusal, identity).await
        }
        Asked::Unusable(why) => {
            if auto {
                learn(UpstreamPath::Spdy);
                return translate(state, req, peer, caller, streamed, slot, None).await;
            }
            state.metrics.upstream_upgrade_failure(101);
            let refusal = Delivered::Unsupported(why);
            deliver(state, req, peer, caller, streamed, slot, refusal, identity).await
        }
        Asked::Failed(e) => {
            state.metrics.upstream_upgrade_failure(0);
            let refusal = Delivered::Failed(e);
            deliver(state, req, peer, caller, streamed, slot, refusal, identity).await
        }
    }
}

/// Why a 101 cannot be passed to the client, if it cannot: it must be a WebSocket with a
/// subprotocol that was offered (kubectl rejects anything else).
fn unusable(offer: &[String], resp: &Response<Incoming>) -> Option<String> {
    let h = resp.headers();
    let websocket = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"));
    if !websocket {
        return Some("the upstream's 101 is not a WebSocket".to_owned());
    }
    let chosen = h
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .unwrap_or("");
    let offered = offer.iter().any(|p| p == chosen);
    (!offered).then(|| {
        format!("the upstream chose subprotocol {chosen:?}, which the client did not offer")
    })
}

/// The SPDY translation, as under `--upstream-streaming spdy`; with `refusal`, that Status is
/// what the exec client is told inside its WebSocket.
async fn translate(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    peer: SocketAddr,
    caller: Caller,
    streamed: Streamed,
    slot: SessionSlot,
    refusal: Option<(Status, ProtocolPath)>,
) -> Response<ProxyBody> {
    match streamed {
        Streamed::RemoteCommand(subresource) => {
            exec_handler::handle(state, req, peer, caller, subresource, slot, refusal).await
        }
        Streamed::Tunnel(protocols) => {
            tunnel_handler::handle(state, req, peer, caller, protocols, slot).await
        }
    }
}

/// A pass-through that did not start, as the client will hear it.
enum Delivered {
    /// The cluster's own answer.
    Replay {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// `websocket` against an upstream that does not serve the protocol.
    Unsupported(String),
    /// The upstream was not reached.
    Failed(RelayError),
}

/// Tells the client why the pass-through did not start: exec/attach inside the accepted
/// WebSocket (a Status on channel 3, as the translation does, so that kubectl does not fall back
/// to a SPDY its gateway drops), the tunnel as an HTTP answer (kube-apiserver replays it too).
// One argument per thing the two ways of telling need; bundling them would only rename them.
#[allow(clippy::too_many_arguments)]
async fn deliver(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    peer: SocketAddr,
    caller: Caller,
    streamed: Streamed,
    slot: SessionSlot,
    delivered: Delivered,
    identity: AuditIdentity,
) -> Response<ProxyBody> {
    let unsupported = |why: &str| {
        format!(
            "{why}: it does not serve this protocol itself (Kubernetes 1.31+ with \
             TranslateStreamCloseWebsocketRequests and PortForwardWebsockets does), and \
             kube-ws-proxy runs with --upstream-streaming=websocket; use auto or spdy for this \
             cluster"
        )
    };
    match streamed {
        Streamed::RemoteCommand(_) => {
            let status = match delivered {
                Delivered::Replay {
                    status,
                    headers,
                    body,
                } => {
                    let content_type = headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok());
                    from_upgrade_refusal(status.as_u16(), content_type, &body)
                }
                Delivered::Unsupported(why) => {
                    Status::failure(502, "BadGateway", unsupported(&why))
                }
                Delivered::Failed(e) => Status::internal_error(&e.to_string()),
            };
            translate(
                state,
                req,
                peer,
                caller,
                streamed,
                slot,
                Some((status, ProtocolPath::PassThrough)),
            )
            .await
        }
        Streamed::Tunnel(_) => {
            drop(slot);
            let info = session_audit::session_info(
                next_session_id(),
                &req.path_and_query(),
                SessionClient::new(peer, req.client.form),
                identity,
                ProtocolPath::PassThrough,
                None,
                request_layers::audit_id(&req.parts.headers),
            );
            let summary = match &delivered {
                Delivered::Replay { status, .. } => {
                    format!("upstream answered {}", status.as_u16())
                }
                Delivered::Unsupported(why) => why.clone(),
                Delivered::Failed(e) => e.to_string(),
            };
            session_audit::end_upstream_refused(session_audit::start(&state, info), summary);
            match delivered {
                Delivered::Replay {
                    status,
                    mut headers,
                    body,
                } => {
                    remove_hop_by_hop(&mut headers);
                    headers.remove(header::CONTENT_LENGTH);
                    let mut resp =
                        Response::new(Full::new(body).map_err(|never| match never {}).boxed());
                    *resp.status_mut() = status;
                    *resp.headers_mut() = headers;
                    resp
                }
                Delivered::Unsupported(why) => {
                    failure(StatusCode::BAD_GATEWAY, "BadGateway", unsupported(&why))
                }
                Delivered::Failed(e) => e.response(),
            }
        }
    }
}

/// Starts the pass-through on the upstream's 101: the relay copies the bytes; exec/attach are
/// recorded by following the v5 channels as it does for relayed v4.
async fn carry(
    state: &ProxyState,
    req: UpgradeRequest,
    peer: SocketAddr,
    caller: &Caller,
    slot: SessionSlot,
    resp: Response<Incoming>,
    identity: AuditIdentity,
) -> Response<ProxyBody> {
    let resp = Ok(resp.map(BodyExt::boxed));
    relay::relay_answered(
        state,
        req,
        peer,
        SessionKind::PassThrough,
        slot,
        caller,
        resp,
        identity,
    )
    .await
}
