//! WebSockets offering `SPDY/3.1+<name>.k8s.io` (kubectl ≥ 1.31 port-forward): dial the
//! upstream with a SPDY upgrade first; on its 101 accept the WebSocket and relay bytes; an
//! upstream refusal ≥ 400 is replayed to the client as that HTTP response (PROTOCOL.md §2.1).
//! Under `--upstream-streaming auto` the dial ([`dial`]) is made by the caller, which decides
//! on its answer before handing it over.

use std::sync::Arc;

use http::{Response, StatusCode};
use tracing::{info, warn, Instrument};

use super::registry::{next_session_id, SessionSlot};
use super::session_audit;
use super::session_end::{Finished, Running};
use super::state::ProxyState;
use super::upstream_refusal;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::validate_handshake;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::endpoint::UpstreamIo;
use crate::proxy::upstream::spdy_dial::{dial_spdy, DialError};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::spdy::upgrade::Upgraded;
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
    let headers = state.upstream_headers(&req.parts.headers, stream);
    dial_upstream(state, &req.path_and_query(), headers, protocols).await
}

/// Dials the upstream with a SPDY upgrade offering `protocols`.
async fn dial_upstream(
    state: &ProxyState,
    path_and_query: &str,
    headers: http::HeaderMap,
    protocols: Vec<String>,
) -> Dialled {
    dial_spdy(
        &state.upstream,
        path_and_query,
        headers,
        protocols,
        state.handshake_timeout,
    )
    .await
}

/// Handles a request the classifier marked as a tunnel; `protocols` are the de-prefixed names;
/// with `dialled` the upstream was asked already ([`dial`]). In order: the client's handshake
/// is checked, the upstream is dialled while the caller is identified, the audit trail starts,
/// and on the upstream's 101 the tunnel runs in the background ([`TunnelSession::run`]).
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    protocols: Vec<String>,
    slot: SessionSlot,
    dialled: Option<Dialled>,
) -> Response<ProxyBody> {
    let answer = match validate_handshake(&req.parts.method, &req.parts.headers, stream.client.form)
    {
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
    let guard = state.metrics.session(SessionKind::PortForwardTunnel);
    let session_id = next_session_id();
    let headers = state.upstream_headers(&req.parts.headers, &stream);
    let credentials = headers.get(http::header::AUTHORIZATION).cloned();
    let path_and_query = req.path_and_query();
    let dial = async {
        match dialled {
            Some(dialled) => dialled,
            None => dial_upstream(&state, &path_and_query, headers, protocols).await,
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
    let info = session_audit::stream_info(
        session_id,
        &stream,
        identity,
        ProtocolPath::Tunnel,
        chosen.clone(),
    );
    let running = Running::new(session_audit::start(&state, info), slot, guard);
    let upstream = match dialed {
        Ok(u) => u,
        Err(e) => return upstream_refusal::refuse(&state, running, e),
    };
    // The audit log lists a port-forward's connections: the tunnel shows its bytes to a
    // watch. Without the log nothing looks at them.
    let watch = (running.is_audited() && upstream.protocol.as_deref() == Some(PORT_FORWARD))
        .then(|| PortForwardWatch::new().charging(state.session_memory.lane()));
    let session = TunnelSession {
        state,
        stream,
        session_id,
        running,
        watch,
    };
    // The session's log lines name the request they came from (its audit id). Boxed: the task
    // then moves a pointer, not the session's whole state, each time tokio moves it.
    tokio::spawn(Box::pin(session.run(req.on_upgrade, upstream)).in_current_span());
    answer.response(chosen.as_deref())
}

/// A tunnel the upstream agreed to, from the client's upgrade to its end.
struct TunnelSession {
    state: Arc<ProxyState>,
    stream: StreamRequest,
    session_id: u64,
    running: Running,
    /// The port-forward's connections, for the audit log.
    watch: Option<PortForwardWatch>,
}

impl TunnelSession {
    /// Waits for the client's WebSocket, carries the tunnel until either side ends it, then
    /// finishes the session (audit, slot, metrics) and logs it.
    async fn run(self, on_upgrade: hyper::upgrade::OnUpgrade, upstream: Upgraded<UpstreamIo>) {
        let state = &self.state;
        let ws = match state.client_websocket(on_upgrade).await {
            Ok(ws) => ws,
            Err(e) => {
                warn!(error = %e, "client upgrade failed");
                self.running.unstarted(
                    SessionOutcome::ClientGone,
                    session_audit::CLIENT_UPGRADE_FAILED,
                    None,
                );
                return;
            }
        };
        let outcome = tunnel::run(
            ws,
            upstream.io,
            upstream.leftover,
            self.running.slot().stop_token(),
            state.stream_idle_timeout,
            self.watch.as_ref(),
        )
        .await;
        let finished = Finished::tunnel(&outcome, self.watch);
        let result = finished.outcome;
        self.running.finish(finished);
        let (stream, client) = (&self.stream, self.stream.client);
        info!(
            session = self.session_id,
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
}
