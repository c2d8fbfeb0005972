//! WebSockets offering `SPDY/3.1+<name>.k8s.io` (kubectl ≥ 1.31 port-forward): dial the
//! upstream with a SPDY upgrade first; on its 101 accept the WebSocket and relay bytes; an
//! upstream refusal ≥ 400 is replayed to the client as that HTTP response (PROTOCOL.md §2.1).
//! Under `--upstream-streaming auto` the dial ([`dial`]) is made by the caller, which decides
//! on its answer before handing it over.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tracing::{info, warn, Instrument};

use super::registry::{next_session_id, SessionSlot};
use super::session_audit;
use super::session_end::{tunnel_outcome, Finished, Running};
use super::state::ProxyState;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::{upgraded, validate_handshake};
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::endpoint::UpstreamIo;
use crate::proxy::upstream::spdy_dial::{dial_spdy, upstream_headers, DialError};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::spdy::upgrade::{UpgradeError, Upgraded};
use crate::translate::observe::{PortForwardWatch, PORT_FORWARD};
use crate::translate::protocol::TUNNEL_PREFIX;
use crate::translate::tunnel;

/// The tunnel's upstream SPDY connection, or why there is none.
pub type Dialled = Result<Upgraded<UpstreamIo>, DialError>;

/// Asks the upstream for the tunnel's SPDY connection as [`handle`] would, without committing
/// the client to it: `auto` decides on the answer first.
pub async fn dial(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
    protocols: Vec<String>,
) -> Dialled {
    let mut headers = upstream_headers(&req.parts.headers, stream.peer, state.trust_forwarded_for);
    state.auth.apply(&stream.caller, &mut headers);
    dial_spdy(
        &state.upstream,
        &req.path_and_query(),
        headers,
        protocols,
        state.handshake_timeout,
    )
    .await
}

/// Handles a request the classifier marked as a tunnel; `protocols` are the de-prefixed names;
/// with `dialled` the upstream was asked already ([`dial`]).
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    protocols: Vec<String>,
    slot: SessionSlot,
    dialled: Option<Dialled>,
) -> Response<ProxyBody> {
    let client = stream.client;
    let answer = match validate_handshake(&req.parts.method, &req.parts.headers, client.form) {
        Ok(answer) => answer,
        Err(e) => return failure(e.status(), "BadRequest", e.to_string()),
    };
    if protocols.is_empty() {
        return failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "unable to upgrade: no tunneling spdy protocols provided",
        );
    }
    let path_and_query = req.path_and_query();
    let mut headers = upstream_headers(&req.parts.headers, stream.peer, state.trust_forwarded_for);
    state.auth.apply(&stream.caller, &mut headers);
    let on_upgrade = req.on_upgrade;
    let guard = state.metrics.session(SessionKind::PortForwardTunnel);
    let session_id = next_session_id();
    let credentials = headers.get(http::header::AUTHORIZATION).cloned();
    let dial = async {
        match dialled {
            Some(dialled) => dialled,
            None => {
                let timeout = state.handshake_timeout;
                dial_spdy(
                    &state.upstream,
                    &path_and_query,
                    headers,
                    protocols,
                    timeout,
                )
                .await
            }
        }
    };
    let (dialed, identity) = tokio::join!(
        dial,
        session_audit::identify(&state, &stream.caller, credentials),
    );
    // No version header in the 101 → no subprotocol (the client then rejects it, as designed).
    let chosen = dialed
        .as_ref()
        .ok()
        .and_then(|u| u.protocol.as_ref().map(|p| format!("{TUNNEL_PREFIX}{p}")));
    let audit = session_audit::start(
        &state,
        session_audit::stream_info(
            session_id,
            &stream,
            identity,
            ProtocolPath::Tunnel,
            chosen.clone(),
        ),
    );
    let upgraded_upstream = match dialed {
        Ok(u) => u,
        Err(e) => {
            state.metrics.upstream_upgrade_failure(e.upstream_status());
            session_audit::end_upstream_refused(audit, format!("upstream refused: {e}"));
            guard.finish(SessionOutcome::UpstreamError, 0, 0);
            return refusal_response(e);
        }
    };
    // The audit log lists a port-forward's connections: the tunnel shows its bytes to a
    // watch. Without the log nothing looks at them.
    let watch = (audit.is_some() && upgraded_upstream.protocol.as_deref() == Some(PORT_FORWARD))
        .then(PortForwardWatch::new);
    let running = Running::new(audit, slot, guard);
    let ws_config = state.client_socket_config();
    let handshake_timeout = state.handshake_timeout;
    tokio::spawn(
        async move {
            let ws = match upgraded(on_upgrade, ws_config, handshake_timeout).await {
                Ok(ws) => ws,
                Err(e) => {
                    warn!(error = %e, "client upgrade failed");
                    running.unstarted(
                        SessionOutcome::ClientGone,
                        session_audit::CLIENT_UPGRADE_FAILED,
                        None,
                    );
                    return;
                }
            };
            let outcome = tunnel::run(
                ws,
                upgraded_upstream.io,
                upgraded_upstream.leftover,
                running.slot().stop_token(),
                state.stream_idle_timeout,
                watch.as_ref(),
            )
            .await;
            let result = tunnel_outcome(outcome.ended_by);
            running.finish(
                Finished::new(
                    result,
                    outcome.bytes_up,
                    outcome.bytes_down,
                    outcome.duration,
                    outcome.ended_by.describe(),
                )
                .with_port_forwards(watch),
            );
            info!(
                session = session_id,
                verb = "portforward",
                user = stream.caller.user().unwrap_or(""),
                http_version = client.form.http_version(),
                connection = client.connection.0,
                namespace = stream.target.namespace(),
                pod = stream.target.pod_name(),
                outcome = result.label(),
                bytes_up = outcome.bytes_up,
                bytes_down = outcome.bytes_down,
                ended_by = outcome.ended_by.describe(),
                duration_ms = outcome.duration.as_millis() as u64,
                "port-forward tunnel finished"
            );
        }
        // The session's log lines name the request they came from (its audit id).
        .in_current_span(),
    );
    answer.response(chosen.as_deref())
}

/// The answer to a failed upstream dial: a refusal ≥ 400 replayed as the upstream sent it,
/// anything else a 502 Status.
fn refusal_response(e: DialError) -> Response<ProxyBody> {
    match e {
        DialError::Upgrade(UpgradeError::Refused {
            status,
            headers,
            body,
        }) if status.as_u16() >= 400 => replay(status, *headers, body),
        DialError::Upgrade(UpgradeError::Refused { status, .. }) => failure(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("invalid upgrade response: status code {}", status.as_u16()),
        ),
        e => failure(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("error dialing the upstream: {e}"),
        ),
    }
}

/// The upstream's refusal, as it sent it (hop-by-hop headers aside).
fn replay(status: StatusCode, headers: http::HeaderMap, body: Bytes) -> Response<ProxyBody> {
    let mut resp = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    for (name, value) in &headers {
        if crate::proxy::wire::headers::is_hop_by_hop(name) || name == http::header::CONTENT_LENGTH
        {
            continue;
        }
        resp.headers_mut().append(name.clone(), value.clone());
    }
    resp
}
