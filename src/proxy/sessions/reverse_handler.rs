//! SPDY upgrades (kubectl ≤ 1.30) for exec, attach and port-forward when the upstream only
//! takes WebSockets: dial the upstream first as a WebSocket client (`v5.channel.k8s.io`, or
//! the `SPDY/3.1+portforward.k8s.io` tunnel), then answer the client's SPDY upgrade and run the
//! reverse translator ([`crate::translate::reverse`]). An upstream refusal is replayed to the
//! client as the HTTP answer it is, which is what kubectl gets from a SPDY cluster too. Under
//! `--upstream-streaming auto` the dial ([`dial`]) may be made by the caller, which decides on
//! its answer before handing it over ([`handle_dialled`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tracing::{info, warn, Instrument};

use super::registry::{next_session_id, SessionSlot};
use super::session_audit;
use super::session_end::{remote_command_outcome, tunnel_outcome, Finished, Running};
use super::state::ProxyState;
use crate::audit::recording::RecordPolicy;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::spdy_dial::upstream_headers;
use crate::proxy::upstream::websocket_dial::{dial_websocket, DialedWebSocket, WebSocketDialError};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::spdy::proto::{Config as SpdyConfig, Connection};
use crate::translate::exec_options::{ExecOptions, Subresource};
use crate::translate::observe::PortForwardWatch;
use crate::translate::protocol::{ChannelProtocol, UpstreamVersion, TUNNEL_PREFIX};
use crate::translate::remote_command::{Outcome, SessionEndKind, SessionRecording};
use crate::translate::reverse::negotiation::{self, NegotiationError, ACCEPTED_VERSIONS_HEADER};
use crate::translate::reverse::{self, port_forward, ReverseLimits};

/// Handles a SPDY upgrade that goes to the reverse translator (`--upstream-streaming
/// websocket`, or `auto` against a path that refuses SPDY); `slot` is its admission.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    handle_dialled(state, req, stream, slot, None).await
}

/// The reverse translator's upstream WebSocket (with the subprotocol offered), or why there is
/// none.
pub type Dialled = Result<DialedWebSocket, WebSocketDialError>;

/// Asks the upstream for the WebSocket the reverse translator of `req` would use, without
/// committing the client to it: `auto` decides on the answer first.
pub async fn dial(state: &ProxyState, req: &UpgradeRequest, stream: &StreamRequest) -> Dialled {
    let port_forward = stream.target.subresource() == Some(Subresource::PortForward);
    let mut headers = upstream_headers(&req.parts.headers, stream.peer, state.trust_forwarded_for);
    state.auth.apply(&stream.caller, &mut headers);
    dial_upstream(state, &req.path_and_query(), headers, port_forward).await
}

/// The subprotocol asked of the upstream: the tunnel for port-forward, else v5.
fn upstream_protocol(port_forward: bool) -> String {
    if port_forward {
        format!(
            "{TUNNEL_PREFIX}{}",
            crate::translate::protocol::PORT_FORWARD_PROTOCOL
        )
    } else {
        ChannelProtocol::V5.name().to_owned()
    }
}

/// Opens the upstream WebSocket; a 101 without the offered subprotocol counts as a failure.
async fn dial_upstream(
    state: &ProxyState,
    path_and_query: &str,
    headers: http::HeaderMap,
    port_forward: bool,
) -> Dialled {
    let protocol = upstream_protocol(port_forward);
    let offer = [protocol.as_str()];
    let dialed = dial_websocket(
        &state.upstream,
        path_and_query,
        headers,
        &offer,
        state.handshake_timeout,
        state.max_message_size,
    )
    .await;
    match dialed {
        Ok(d) if d.protocol.as_deref() == Some(protocol.as_str()) => Ok(d),
        Ok(_) => Err(WebSocketDialError::BadHandshake(
            "the upstream accepted the WebSocket without the offered subprotocol",
        )),
        Err(e) => Err(e),
    }
}

/// [`handle`], with the upstream already asked when `dialled` is given ([`dial`]).
pub async fn handle_dialled(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    slot: SessionSlot,
    dialled: Option<Dialled>,
) -> Response<ProxyBody> {
    let path_and_query = req.path_and_query();
    let Some(subresource) = stream.target.subresource() else {
        return failure(StatusCode::NOT_FOUND, "NotFound", "not a pod subresource");
    };
    let offered = negotiation::offered(&req.parts.headers);
    let port_forward = subresource == Subresource::PortForward;
    let negotiated = if port_forward {
        negotiation::port_forward(&offered).map(|_| None)
    } else {
        negotiation::remote_command(&offered).map(Some)
    };
    let version = match negotiated {
        Ok(version) => version,
        Err(e) => return refuse_offer(&e),
    };
    let mut headers = upstream_headers(&req.parts.headers, stream.peer, state.trust_forwarded_for);
    state.auth.apply(&stream.caller, &mut headers);
    let kind = match subresource {
        Subresource::Attach => SessionKind::Attach,
        Subresource::PortForward => SessionKind::PortForwardTunnel,
        _ => SessionKind::Exec,
    };
    let guard = state.metrics.session(kind);
    let session_id = next_session_id();
    let credentials = headers.get(header::AUTHORIZATION).cloned();
    let dial = async {
        match dialled {
            Some(dialled) => dialled,
            None => dial_upstream(&state, &path_and_query, headers, port_forward).await,
        }
    };
    let (dialed, identity) = tokio::join!(
        dial,
        session_audit::identify(&state, &stream.caller, credentials),
    );
    // What the client is answered with: `X-Stream-Protocol-Version` of its own SPDY upgrade.
    let client_protocol = match version {
        Some(v) => v.name(),
        None => crate::translate::protocol::PORT_FORWARD_PROTOCOL,
    };
    let mut info = session_audit::stream_info(
        session_id,
        &stream,
        identity,
        ProtocolPath::ReverseTranslated,
        Some(format!("SPDY/3.1+{client_protocol}")),
    );
    let upstream = match dialed {
        Ok(d) => d,
        Err(e) => {
            state.metrics.upstream_upgrade_failure(e.upstream_status());
            let audit = session_audit::start(&state, info);
            session_audit::end_upstream_refused(audit, format!("upstream refused: {e}"));
            guard.finish(SessionOutcome::UpstreamError, 0, 0);
            return refusal_response(e);
        }
    };

    // Exec and attach are recorded; a recording that cannot start under --record=required
    // refuses the session before the client's 101.
    let mut recording_error = None;
    let mut recording = None;
    if let (Some(recordings), false) = (&state.recordings, port_forward) {
        let title = stream.target.recording_title();
        let id = crate::audit::instance::session_id(session_id);
        match recordings
            .open(&id, &stream.target.options.command, title)
            .await
        {
            Ok(recorder) => {
                recording = Some(SessionRecording {
                    recorder,
                    required: recordings.policy() == RecordPolicy::Required,
                })
            }
            Err(e) => {
                warn!(session = session_id, error = %e, "the session's recording could not start");
                if recordings.policy() == RecordPolicy::Required {
                    drop(upstream);
                    drop(slot);
                    session_audit::end_unstarted(
                        session_audit::start(&state, info),
                        SessionOutcome::RecordingFailed,
                        "refused: it could not be recorded",
                        None,
                        Some(e.to_string()),
                    );
                    guard.finish(SessionOutcome::RecordingFailed, 0, 0);
                    return failure(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "ServiceUnavailable",
                        format!(
                            "kube-ws-proxy cannot record this session and recordings are \
                             required (--record=required): {e}"
                        ),
                    );
                }
                recording_error = Some(e.to_string());
            }
        }
    }
    if let (Some(info), Some(r)) = (info.as_mut(), &recording) {
        info.recording = Some(r.recorder.path().display().to_string());
    }
    let running = Running::new(session_audit::start(&state, info), slot, guard);
    let on_upgrade = req.on_upgrade;
    let task_state = state.clone();
    tokio::spawn(
        async move {
            let state = task_state;
            let client = match tokio::time::timeout(state.handshake_timeout, on_upgrade).await {
                Ok(Ok(io)) => TokioIo::new(io),
                _ => {
                    warn!(session = session_id, "client upgrade failed");
                    running.unstarted(
                        SessionOutcome::ClientGone,
                        session_audit::CLIENT_UPGRADE_FAILED,
                        recording_error,
                    );
                    return;
                }
            };
            let Some(version) = version else {
                let watch = running.is_audited().then(PortForwardWatch::new);
                let outcome = port_forward::run(
                    client,
                    upstream.socket,
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
                    path = "reverse_translated",
                    user = stream.caller.user().unwrap_or(""),
                    namespace = stream.target.namespace(),
                    pod = stream.target.pod_name(),
                    outcome = result.label(),
                    bytes_up = outcome.bytes_up,
                    bytes_down = outcome.bytes_down,
                    ended_by = outcome.ended_by.describe(),
                    duration_ms = outcome.duration.as_millis() as u64,
                    "port-forward (SPDY client, WebSocket upstream) finished"
                );
                return;
            };
            let options = &stream.target.options;
            let outcome = exec(
                &state,
                client,
                upstream,
                version,
                options,
                running.slot(),
                recording.as_ref(),
            )
            .await;
            let exit_code = outcome.status.as_ref().and_then(|s| s.exit_code());
            let result = remote_command_outcome(&outcome);
            let recording_error =
                recording_error.or_else(|| recording.as_ref().and_then(|r| r.recorder.error()));
            drop(recording);
            running.finish(Finished::remote_command(&outcome, result, recording_error));
            info!(
                session = session_id,
                verb = kind.label(),
                path = "reverse_translated",
                user = stream.caller.user().unwrap_or(""),
                namespace = stream.target.namespace(),
                pod = stream.target.pod_name(),
                container = stream.target.container(),
                tty = options.tty,
                version = version.name(),
                bytes_in = outcome.bytes_in,
                bytes_out = outcome.bytes_out,
                duration_ms = outcome.duration.as_millis() as u64,
                exit_code = exit_code.map(i64::from).unwrap_or(-1),
                status = outcome
                    .status
                    .as_ref()
                    .map(|s| s.summary())
                    .unwrap_or_default(),
                close_reason = outcome.end.describe(),
                "exec session (SPDY client, WebSocket upstream) finished"
            );
        }
        // The session's log lines name the request they came from (its audit id).
        .in_current_span(),
    );
    spdy_switching_protocols(client_protocol)
}

/// The client's SPDY session: its streams accepted, then the translator run to the end.
async fn exec(
    state: &ProxyState,
    client: TokioIo<hyper::upgrade::Upgraded>,
    upstream: DialedWebSocket,
    version: UpstreamVersion,
    options: &ExecOptions,
    slot: &SessionSlot,
    recording: Option<&SessionRecording>,
) -> Outcome {
    let started = std::time::Instant::now();
    // SPDY pings keep the client's path alive and find out when it is gone.
    let config = SpdyConfig {
        ping_interval: state.client_keepalive.map(|k| k.interval),
        ping_timeout: state.client_keepalive.and_then(|k| k.timeout),
        ..SpdyConfig::default()
    };
    let (conn, incoming) = Connection::server(client, Bytes::new(), config);
    let streams = match reverse::accept_streams(
        conn.clone(),
        incoming,
        version,
        options,
        state.handshake_timeout,
    )
    .await
    {
        Ok(streams) => streams,
        Err(e) => {
            warn!(error = %e, "the SPDY client did not open its streams");
            conn.close().await;
            let mut socket = upstream.socket;
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(2), socket.close(None)).await;
            return Outcome {
                bytes_in: 0,
                bytes_out: 0,
                status: None,
                end: SessionEndKind::ClientGone,
                duration: started.elapsed(),
            };
        }
    };
    let limits = ReverseLimits {
        upstream_queue_messages: state.session_limits.stdin_queue_messages,
        idle_timeout: state.stream_idle_timeout,
        upstream_ping_interval: state.upstream_ping_interval,
        upstream_ping_timeout: state.upstream_ping_timeout,
    };
    reverse::run(
        streams,
        upstream.socket,
        &limits,
        slot.stop_token(),
        recording,
    )
    .await
}

/// The 101 to the client's SPDY upgrade, naming the negotiated version.
fn spdy_switching_protocols(version: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    h.insert(
        negotiation::STREAM_PROTOCOL_HEADER,
        HeaderValue::from_static(version),
    );
    resp
}

/// A version offer we cannot serve, refused as a kubelet refuses it.
fn refuse_offer(e: &NegotiationError) -> Response<ProxyBody> {
    let reason = match e {
        NegotiationError::NoOffer => "BadRequest",
        NegotiationError::NoOverlap { .. } => "Forbidden",
    };
    let mut resp = failure(e.status(), reason, e.to_string());
    if let NegotiationError::NoOverlap { .. } = e {
        for v in negotiation::SUPPORTED {
            resp.headers_mut()
                .append(ACCEPTED_VERSIONS_HEADER, HeaderValue::from_static(v.name()));
        }
    }
    resp
}

/// The answer to a failed upstream dial: a refusal replayed as the upstream sent it, anything
/// else a 502 Status.
fn refusal_response(e: WebSocketDialError) -> Response<ProxyBody> {
    match e {
        WebSocketDialError::Refused {
            status,
            headers,
            body,
        } if status.as_u16() >= 400 => {
            let mut resp = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
            *resp.status_mut() = status;
            for (name, value) in headers.iter() {
                if crate::proxy::wire::headers::is_hop_by_hop(name)
                    || name == header::CONTENT_LENGTH
                {
                    continue;
                }
                resp.headers_mut().append(name.clone(), value.clone());
            }
            resp
        }
        WebSocketDialError::Refused { status, .. } => failure(
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
