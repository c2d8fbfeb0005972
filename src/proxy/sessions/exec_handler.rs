//! `pods/{name}/exec` and `/attach` WebSockets offering `v5.channel.k8s.io`: dial the upstream
//! first, then accept the client's WebSocket and translate (PROTOCOL.md §4.7). Under
//! `--upstream-streaming auto` the dial ([`dial`]) is made by the caller, which decides on its
//! answer before handing it over ([`Prepared`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use tracing::{info, warn, Instrument};

use super::lifecycle::audit;
use super::lifecycle::end::{remote_command_outcome, Finished, Running};
use super::lifecycle::recording::{unrecordable_status, OpenedRecording};
use super::lifecycle::start::{self, Begun, Held};
use super::state::ProxyState;
use crate::audit::ProtocolPath;
use crate::peer_hangup::PeerHangup;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::ClientAnswer;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::error::reported;
use crate::proxy::upstream::spdy_dial::{dial_spdy, DialError};
use crate::proxy::wire::body::ProxyBody;
use crate::spdy::proto::{Config as SpdyConfig, Connection};
use crate::spdy::upgrade::UpgradeError;
use crate::translate::exec_options::ExecOptions;
use crate::translate::protocol::{ChannelProtocol, UpstreamVersion};
pub use crate::translate::remote_command::ExecStreams;
use crate::translate::remote_command::{self, Outcome};
use crate::translate::status::Status;
use crate::translate::status_mapping::from_upgrade_refusal;

/// Where a translated session's upstream stands when [`handle`] is called.
#[derive(Debug)]
pub enum Prepared {
    /// Not asked yet: dial it with SPDY.
    Dial,
    /// Asked already (`auto`, [`dial`]): the SPDY session, or why there is none.
    Dialled(Result<ExecStreams, SetupError>),
    /// Not to be asked (a pass-through the upstream did not take, a session that cannot be
    /// recorded): this Status is what the client hears inside its WebSocket.
    Refused(Status),
}

/// Why the SPDY session of a translated exec/attach could not be set up.
#[derive(Debug)]
pub enum SetupError {
    /// The upstream answered the SPDY upgrade with something other than 101 (body capped).
    Refused {
        status: StatusCode,
        headers: Box<HeaderMap>,
        body: Bytes,
    },
    /// No answer: dial, TLS or timeout.
    Unanswered(DialError),
    /// The upgrade was taken but the exec streams did not open: the Status to report (boxed:
    /// it is large and rare).
    Streams(Box<Status>),
}

impl SetupError {
    /// What the client is told, inside its WebSocket.
    pub fn into_status(self) -> Status {
        match self {
            SetupError::Refused {
                status,
                headers,
                body,
            } => {
                let content_type = headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok());
                from_upgrade_refusal(status.as_u16(), content_type, &body)
            }
            // The cause goes to the log; the client, who may be anyone, gets its kind.
            SetupError::Unanswered(e) => Status::internal_error(&reported(&e)),
            SetupError::Streams(status) => *status,
        }
    }
}

/// Asks the upstream for the SPDY session of a translated exec/attach of `req`, as [`handle`]
/// would, without committing the client to it: `auto` decides on the answer first.
pub async fn dial(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
) -> Result<ExecStreams, SetupError> {
    let headers = state.upstream_headers(&req.parts.headers, stream);
    dial_streams(
        state,
        &req.path_and_query(),
        headers,
        &stream.target.options,
    )
    .await
}

/// Handles a v5 exec or attach translated to SPDY (`--upstream-streaming spdy`), admitted as
/// `running`. In order: the session begins (the caller identified, the recording opened, the
/// audit trail started), then, if it may go upstream, it is served ([`serve`]). A refusal is
/// still reported inside the WebSocket, as a Status on channel 3.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    answer: ClientAnswer,
    mut running: Running,
) -> Response<ProxyBody> {
    let v5 = Some(ChannelProtocol::V5.name().to_owned());
    let recording = start::begin(
        &state,
        &req,
        &stream,
        &mut running,
        ProtocolPath::Translated,
        v5,
    )
    .await;
    let prepared = match start::may_go_upstream(&running, &recording) {
        Ok(()) => Prepared::Dial,
        Err(Held::Unrecordable(why)) => Prepared::Refused(unrecordable_status(&why)),
        Err(held) => return start::end_held(running, recording, held),
    };
    serve(
        state,
        req,
        stream,
        answer,
        Begun { running, recording },
        prepared,
    )
    .await
}

/// Serves a translated exec or attach that has begun: its upstream as `prepared` has it (asked
/// now when it was not yet), then the client's WebSocket answered while the session runs in
/// the background ([`ExecSession::run`]). Under `auto` the caller asked the upstream already
/// and hands over its answer; a pass-through it refused comes here to tell the client why.
pub async fn serve(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    answer: ClientAnswer,
    begun: Begun,
    prepared: Prepared,
) -> Response<ProxyBody> {
    let headers = state.upstream_headers(&req.parts.headers, &stream);
    let path_and_query = req.path_and_query();
    let options = &stream.target.options;
    let setup = set_up(&state, &path_and_query, headers, options, prepared).await;
    let Begun { running, recording } = begun;
    let session = ExecSession {
        state,
        stream,
        running,
        recording,
    };
    // The session's log lines name the request they came from (its audit id). Boxed: the task
    // then moves a pointer, not the session's whole state, each time tokio moves it.
    tokio::spawn(Box::pin(session.run(req.on_upgrade, setup)).in_current_span());
    answer.response(Some(ChannelProtocol::V5.name()))
}

/// The upstream's SPDY session as `prepared` has it (dialled now when it was not asked yet),
/// or the Status the client is told instead; a failed upgrade is counted.
async fn set_up(
    state: &ProxyState,
    path_and_query: &str,
    headers: http::HeaderMap,
    options: &ExecOptions,
    prepared: Prepared,
) -> Result<ExecStreams, Status> {
    let dialled = match prepared {
        Prepared::Refused(status) => return Err(status),
        Prepared::Dialled(dialled) => dialled,
        Prepared::Dial => dial_streams(state, path_and_query, headers, options).await,
    };
    dialled.map_err(|e| {
        match &e {
            SetupError::Refused { status, .. } => state
                .metrics
                .upstream_upgrade_failure(state.cluster.metrics_label(), status.as_u16()),
            SetupError::Unanswered(e) => state
                .metrics
                .upstream_upgrade_failure(state.cluster.metrics_label(), e.upstream_status()),
            SetupError::Streams(_) => {}
        }
        e.into_status()
    })
}

/// A translated exec or attach whose audit trail has started, from the client's upgrade to
/// its end.
struct ExecSession {
    state: Arc<ProxyState>,
    stream: StreamRequest,
    running: Running,
    recording: OpenedRecording,
}

impl ExecSession {
    /// Waits for the client's WebSocket, translates until the session ends (or reports the
    /// refusal `setup` holds), then finishes it (recording, audit, slot, metrics) and logs it.
    async fn run(self, on_upgrade: hyper::upgrade::OnUpgrade, setup: Result<ExecStreams, Status>) {
        let state = &self.state;
        let ws = match state.client_websocket(on_upgrade).await {
            Ok(ws) => ws,
            Err(e) => {
                warn!(error = %e, "client upgrade failed");
                if let Ok(streams) = setup {
                    streams.conn.close().await;
                }
                self.running.unstarted(
                    SessionOutcome::ClientGone,
                    audit::CLIENT_UPGRADE_FAILED,
                    self.recording.finish().await,
                );
                return;
            }
        };
        let options = &self.stream.target.options;
        let ready = options.ready_channel();
        let mut limits = state.session_limits.clone();
        limits.idle_timeout = state.stream_idle_timeout;
        let outcome = match setup {
            Ok(streams) => {
                let stop = self.running.slot().stop();
                let recording = self.recording.recording.as_ref();
                let traffic = self.running.traffic();
                let tty = options.tty;
                remote_command::run(ws, streams, ready, tty, &limits, stop, recording, traffic)
                    .await
            }
            Err(status) => remote_command::refuse(ws, ready, status, &limits).await,
        };
        let result = if self.recording.refusal().is_some() {
            SessionOutcome::RecordingFailed
        } else {
            remote_command_outcome(&outcome)
        };
        let recording_error = self.recording.finish().await;
        let (kind, session_id) = (self.running.kind(), self.running.session_id());
        self.running
            .finish(Finished::remote_command(&outcome, result, recording_error));
        log_finished(&self.stream, kind, session_id, &outcome);
    }
}

/// The session's log line.
fn log_finished(stream: &StreamRequest, kind: SessionKind, session_id: u64, outcome: &Outcome) {
    let client = stream.client;
    info!(
        session = session_id,
        verb = kind.label(),
        user = stream.caller.user().unwrap_or(""),
        http_version = client.form.http_version(),
        connection = client.connection.0,
        namespace = stream.target.namespace(),
        pod = stream.target.pod_name(),
        container = stream.target.container(),
        tty = stream.target.options.tty,
        bytes_in = outcome.bytes_in,
        bytes_out = outcome.bytes_out,
        duration_ms = outcome.duration.as_millis() as u64,
        exit_code = outcome.exit_code().map(i64::from).unwrap_or(-1),
        status = outcome.status_summary(),
        close_reason = outcome.end.describe(),
        "exec session finished"
    );
}

/// Dials, upgrades and opens the streams.
async fn dial_streams(
    state: &ProxyState,
    path_and_query: &str,
    headers: http::HeaderMap,
    options: &ExecOptions,
) -> Result<ExecStreams, SetupError> {
    let offered = UpstreamVersion::offer_list()
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    let upgraded = match dial_spdy(
        &state.cluster.upstream,
        path_and_query,
        headers,
        offered,
        state.handshake_timeout,
    )
    .await
    {
        Ok(upgraded) => upgraded,
        Err(DialError::Upgrade(UpgradeError::Refused {
            status,
            headers,
            body,
        })) => {
            return Err(SetupError::Refused {
                status,
                headers,
                body,
            })
        }
        Err(e) => return Err(SetupError::Unanswered(e)),
    };
    let version = UpstreamVersion::from_negotiated(upgraded.protocol.as_deref());
    let spdy_config = SpdyConfig {
        ping_interval: state.upstream_ping_interval,
        ping_timeout: state.upstream_ping_timeout,
        memory: Some(state.session_memory().clone()),
        ..SpdyConfig::default()
    };
    // The upstream's FIN or reset is looked for on its socket while the session's output
    // waits (for the client or the recording), so a cut session drains what it holds at once.
    let hangup = PeerHangup::of(upgraded.io.tcp());
    let conn = Connection::client_watching(upgraded.io, upgraded.leftover, spdy_config, hangup);
    // Each stream waits for the upstream's SYN_REPLY: bounded like the rest of the handshake.
    let opened = tokio::time::timeout(
        state.handshake_timeout,
        remote_command::open_streams(conn.clone(), version, options),
    )
    .await;
    match opened {
        Ok(Ok(streams)) => Ok(streams),
        Ok(Err(e)) => {
            conn.close().await;
            Err(SetupError::Streams(Box::new(Status::internal_error(
                &format!("error creating upstream streams: {e}"),
            ))))
        }
        Err(_) => {
            conn.close().await;
            Err(SetupError::Streams(Box::new(Status::internal_error(
                &format!(
                    "the upstream did not open the exec streams within {:?}",
                    state.handshake_timeout
                ),
            ))))
        }
    }
}
