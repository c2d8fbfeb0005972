//! SPDY upgrades (kubectl ≤ 1.30) for exec, attach and port-forward when the upstream only
//! takes WebSockets: once the session has begun (identified, recorded, audited), dial the
//! upstream as a WebSocket client (`v5.channel.k8s.io`, or the `SPDY/3.1+portforward.k8s.io`
//! tunnel), then answer the client's SPDY upgrade and run the reverse translator
//! ([`crate::translate::reverse`]). An upstream refusal is replayed to the client as the HTTP
//! answer it is, which is what kubectl gets from a SPDY cluster too. Under
//! `--upstream-streaming auto` the dial ([`dial`]) may be made by the caller, which decides on
//! its answer before handing it over ([`serve`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tracing::{info, warn, Instrument};

use super::lifecycle::audit;
use super::lifecycle::end::{remote_command_outcome, Finished, Running};
use super::lifecycle::recording::OpenedRecording;
use super::lifecycle::start::{self, Begun};
use super::state::ProxyState;
use super::upstream_refusal;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::StreamRequest;
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
/// websocket`), admitted as `running`; `version` is what the client's offer was negotiated to
/// (`None` for port-forward). In order: the session begins (the caller identified, an exec or
/// attach's recording opened, the audit trail started), then, if it may go upstream, the
/// upstream is dialled and the session served ([`serve`]).
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    version: Option<UpstreamVersion>,
    mut running: Running,
) -> Response<ProxyBody> {
    let path = ProtocolPath::ReverseTranslated;
    let protocol = Some(client_protocol(version));
    let recording = start::begin(&state, &req, &stream, &mut running, path, protocol).await;
    if let Err(held) = start::may_go_upstream(&running, &recording) {
        return start::end_held(running, recording, held);
    }
    let dialled = dial(&state, &req, &stream).await;
    serve(
        state,
        req,
        stream,
        version,
        Begun { running, recording },
        dialled,
    )
    .await
}

/// What the audit log says the client got: `SPDY/3.1+` and the version of its SPDY upgrade.
pub fn client_protocol(version: Option<UpstreamVersion>) -> String {
    format!("SPDY/3.1+{}", answered_version(version))
}

/// The version the client is answered with (`X-Stream-Protocol-Version`).
fn answered_version(version: Option<UpstreamVersion>) -> &'static str {
    match version {
        Some(v) => v.name(),
        None => crate::translate::protocol::PORT_FORWARD_PROTOCOL,
    }
}

/// The reverse translator's upstream WebSocket (with the subprotocol offered), or why there is
/// none.
pub type Dialled = Result<DialedWebSocket, WebSocketDialError>;

/// Asks the upstream for the WebSocket the reverse translator of `req` would use, without
/// committing the client to it: `auto` decides on the answer first.
pub async fn dial(state: &ProxyState, req: &UpgradeRequest, stream: &StreamRequest) -> Dialled {
    let port_forward = stream.target.subresource() == Some(Subresource::PortForward);
    let headers = state.upstream_headers(&req.parts.headers, stream);
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
        &state.cluster.upstream,
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

/// Serves a reverse-translated session that has begun, on the upstream's answer `dialled`
/// (under `auto` asked by the caller): a refusal is replayed to the client; on a WebSocket the
/// client's 101 is answered while the session runs in the background
/// ([`ReverseSession::run`]).
pub async fn serve(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    version: Option<UpstreamVersion>,
    begun: Begun,
    dialled: Dialled,
) -> Response<ProxyBody> {
    let Begun { running, recording } = begun;
    let upstream = match dialled {
        Ok(d) => d,
        Err(e) => {
            // Nothing was recorded: the file holds its header only.
            drop(recording);
            return upstream_refusal::refuse(&state, running, e);
        }
    };
    let session = ReverseSession {
        state,
        stream,
        running,
        recording,
    };
    // The session's log lines name the request they came from (its audit id). Boxed: the task
    // then moves a pointer, not the session's whole state, each time tokio moves it.
    tokio::spawn(Box::pin(session.run(req.on_upgrade, upstream, version)).in_current_span());
    spdy_switching_protocols(answered_version(version))
}

/// The version the client's SPDY upgrade offers that the reverse translator speaks: `None` for
/// port-forward (one protocol), else the remote-command version.
pub fn negotiate(
    req: &UpgradeRequest,
    port_forward: bool,
) -> Result<Option<UpstreamVersion>, NegotiationError> {
    let offered = negotiation::offered(&req.parts.headers);
    if port_forward {
        negotiation::port_forward(&offered).map(|_| None)
    } else {
        negotiation::remote_command(&offered).map(Some)
    }
}

/// A reverse-translated session whose audit trail has started, from the client's SPDY
/// upgrade to its end.
struct ReverseSession {
    state: Arc<ProxyState>,
    stream: StreamRequest,
    running: Running,
    recording: OpenedRecording,
}

impl ReverseSession {
    /// Waits for the client's upgrade, then runs the port-forward (no `version`) or the exec
    /// or attach to its end.
    async fn run(
        self,
        on_upgrade: hyper::upgrade::OnUpgrade,
        upstream: DialedWebSocket,
        version: Option<UpstreamVersion>,
    ) {
        let client = match tokio::time::timeout(self.state.handshake_timeout, on_upgrade).await {
            Ok(Ok(io)) => TokioIo::new(io),
            _ => {
                warn!(session = self.running.session_id(), "client upgrade failed");
                self.running.unstarted(
                    SessionOutcome::ClientGone,
                    audit::CLIENT_UPGRADE_FAILED,
                    self.recording.finish().await,
                );
                return;
            }
        };
        match version {
            None => self.port_forward(client, upstream).await,
            Some(version) => self.exec(client, upstream, version).await,
        }
    }

    /// Carries a port-forward to its end, then finishes and logs it.
    async fn port_forward(
        self,
        client: TokioIo<hyper::upgrade::Upgraded>,
        upstream: DialedWebSocket,
    ) {
        let watch = self
            .running
            .is_audited()
            .then(|| PortForwardWatch::new().charging(self.state.session_memory().lane()));
        let outcome = port_forward::run(
            client,
            upstream.socket,
            self.running.slot().stop(),
            self.state.stream_idle_timeout,
            watch.as_ref(),
            self.running.traffic(),
        )
        .await;
        let finished = Finished::tunnel(&outcome, watch);
        let result = finished.outcome;
        let session_id = self.running.session_id();
        self.running.finish(finished);
        let stream = &self.stream;
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
    }

    /// Translates an exec or attach to its end, then finishes it (recording, audit, slot,
    /// metrics) and logs it.
    async fn exec(
        self,
        client: TokioIo<hyper::upgrade::Upgraded>,
        upstream: DialedWebSocket,
        version: UpstreamVersion,
    ) {
        let outcome = exec(
            &self.state,
            client,
            upstream,
            version,
            &self.stream.target.options,
            &self.running,
            self.recording.recording.as_ref(),
        )
        .await;
        let result = remote_command_outcome(&outcome);
        let recording_error = self.recording.finish().await;
        let (kind, session_id) = (self.running.kind(), self.running.session_id());
        self.running
            .finish(Finished::remote_command(&outcome, result, recording_error));
        log_exec_finished(&self.stream, kind, session_id, version, &outcome);
    }
}

/// A reverse-translated exec or attach's log line.
fn log_exec_finished(
    stream: &StreamRequest,
    kind: SessionKind,
    session_id: u64,
    version: UpstreamVersion,
    outcome: &Outcome,
) {
    info!(
        session = session_id,
        verb = kind.label(),
        path = "reverse_translated",
        user = stream.caller.user().unwrap_or(""),
        namespace = stream.target.namespace(),
        pod = stream.target.pod_name(),
        container = stream.target.container(),
        tty = stream.target.options.tty,
        version = version.name(),
        bytes_in = outcome.bytes_in,
        bytes_out = outcome.bytes_out,
        duration_ms = outcome.duration.as_millis() as u64,
        exit_code = outcome.exit_code().map(i64::from).unwrap_or(-1),
        status = outcome.status_summary(),
        close_reason = outcome.end.describe(),
        "exec session (SPDY client, WebSocket upstream) finished"
    );
}

/// The client's SPDY session: its streams accepted, then the translator run to the end.
async fn exec(
    state: &ProxyState,
    client: TokioIo<hyper::upgrade::Upgraded>,
    upstream: DialedWebSocket,
    version: UpstreamVersion,
    options: &ExecOptions,
    running: &Running,
    recording: Option<&SessionRecording>,
) -> Outcome {
    let started = std::time::Instant::now();
    // SPDY pings keep the client's path alive and find out when it is gone.
    let config = SpdyConfig {
        ping_interval: state.client_keepalive.map(|k| k.interval),
        ping_timeout: state.client_keepalive.and_then(|k| k.timeout),
        memory: Some(state.session_memory().clone()),
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
    let (stop, traffic) = (running.slot().stop(), running.traffic());
    reverse::run(streams, upstream.socket, &limits, stop, recording, traffic).await
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
pub fn refuse_offer(e: &NegotiationError) -> Response<ProxyBody> {
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
