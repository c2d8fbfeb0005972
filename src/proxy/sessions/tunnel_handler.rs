//! WebSockets offering `SPDY/3.1+<name>.k8s.io` (kubectl ≥ 1.31 port-forward): once the
//! session has begun (identified, audited), dial the upstream with a SPDY upgrade; on its 101
//! accept the WebSocket and relay bytes; an upstream refusal ≥ 400 is replayed to the client as
//! that HTTP response (PROTOCOL.md §2.1).
//! Under `--upstream-streaming auto` the dial ([`dial`]) is made by the caller, which decides
//! on its answer before handing it over.

use std::sync::Arc;

use http::Response;
use tracing::{info, warn, Instrument};

use super::lifecycle::audit;
use super::lifecycle::end::{Finished, Running};
use super::lifecycle::start;
use super::state::ProxyState;
use super::upstream_refusal;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::ClientAnswer;
use crate::proxy::observability::metrics::SessionOutcome;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::endpoint::UpstreamIo;
use crate::proxy::upstream::spdy_dial::{dial_spdy, DialError};
use crate::proxy::wire::body::ProxyBody;
use crate::spdy::upgrade::Upgraded;
use crate::translate::observe::{PortForwardWatch, PORT_FORWARD};
use crate::translate::protocol::TUNNEL_PREFIX;
use crate::translate::tunnel;

/// The tunnel's upstream SPDY connection, or why there is none.
pub type Dialled = Result<Upgraded<UpstreamIo>, DialError>;

/// Asks the upstream for the tunnel's SPDY connection (a SPDY upgrade offering `protocols`),
/// as [`handle`] does; under `auto` the caller decides on the answer before serving it.
pub async fn dial(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
    protocols: Vec<String>,
) -> Dialled {
    let headers = state.upstream_headers(&req.parts.headers, stream);
    let timeout = state.handshake_timeout;
    dial_spdy(
        &state.cluster.upstream,
        &req.path_and_query(),
        headers,
        protocols,
        timeout,
    )
    .await
}

/// Handles the tunnel to a SPDY upstream (`--upstream-streaming spdy`), admitted as `running`;
/// `protocols` are the de-prefixed names. In order: the session begins (the caller
/// identified, the audit trail started), then, if it may go upstream, the upstream is dialled
/// and the session served ([`serve`]).
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    protocols: Vec<String>,
    answer: ClientAnswer,
    mut running: Running,
) -> Response<ProxyBody> {
    // The protocol is the upstream's choice: its `ended` event says it.
    let recording = start::begin(
        &state,
        &req,
        &stream,
        &mut running,
        ProtocolPath::Tunnel,
        None,
    )
    .await;
    if let Err(held) = start::may_go_upstream(&running, &recording) {
        return start::end_held(running, recording, held);
    }
    let dialled = dial(&state, &req, &stream, protocols).await;
    serve(state, req, stream, answer, running, dialled).await
}

/// Serves a tunnel that has begun, on the upstream's answer `dialled` (under `auto` asked by
/// the caller): a refusal is replayed to the client; on the upstream's 101 the tunnel runs in
/// the background ([`TunnelSession::run`]) and the client's WebSocket is answered.
pub async fn serve(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    answer: ClientAnswer,
    mut running: Running,
    dialled: Dialled,
) -> Response<ProxyBody> {
    // No version header in the 101 → no subprotocol (the client then rejects it, as designed).
    let chosen = dialled
        .as_ref()
        .ok()
        .and_then(|u| u.protocol.as_ref().map(|p| format!("{TUNNEL_PREFIX}{p}")));
    running.agreed(ProtocolPath::Tunnel, chosen.clone());
    let upstream = match dialled {
        Ok(u) => u,
        Err(e) => return upstream_refusal::refuse(&state, running, e),
    };
    // The audit log lists a port-forward's connections: the tunnel shows its bytes to a
    // watch. Without the log nothing looks at them.
    let watch = (running.is_audited() && upstream.protocol.as_deref() == Some(PORT_FORWARD))
        .then(|| PortForwardWatch::new().charging(state.session_memory().lane()));
    let session = TunnelSession {
        state,
        stream,
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
                    audit::CLIENT_UPGRADE_FAILED,
                    None,
                );
                return;
            }
        };
        let outcome = tunnel::run(
            ws,
            upstream.io,
            upstream.leftover,
            self.running.slot().stop(),
            state.stream_idle_timeout,
            self.watch.as_ref(),
            self.running.traffic(),
        )
        .await;
        let finished = Finished::tunnel(&outcome, self.watch);
        let result = finished.outcome;
        let session_id = self.running.session_id();
        self.running.finish(finished);
        let (stream, client) = (&self.stream, self.stream.client);
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
}
