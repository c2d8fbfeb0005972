//! Byte-for-byte relay of upgrades the upstream serves natively: SPDY/3.1 (kubectl ≤ 1.30 and
//! kubectl's fallback), legacy WebSocket exec/port-forward and log streaming. The upstream
//! decides; we pass its answer through and then copy bytes both ways.
//!
//! Every wait on the upstream is bounded (`--upstream-dial-timeout`, then
//! `--handshake-timeout` for its answer), and an answer other than 101 is not a session: the
//! slot is given back at once and the answer streamed to the client as it comes (it may be a
//! followed log or a watch that never ends).
//!
//! A relay cannot ping either side inside a protocol it does not parse: its liveness is TCP
//! keepalive (`--tcp-keepalive`) and, except for followed logs, `--stream-idle-timeout`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn, Instrument};

use super::registry::{next_session_id, SessionSlot};
use super::relay_answer;
use super::relay_ending;
use super::relay_pings::PingInjector;
use super::relay_recording::RelayTap;
use super::session_audit::{self, AuditIdentity, SessionClient};
use super::state::ProxyState;
use crate::activity_clock::ActivityClock;
use crate::audit::recording::RecordPolicy;
use crate::audit::{ProtocolPath, SessionAudit, SessionEnd as AuditEnd, Verb};
use crate::proxy::auth::Caller;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::is_valid_key;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::classify::RelayKind;
use crate::proxy::route::stream_request::{StreamRequest, StreamTarget};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::headers::{remove_hop_by_hop, set_forwarding_headers};
use crate::proxy::wire::status_response::failure;
use crate::translate::observe::{
    Direction, Observer, PortForwardWatch, Scope, WebSocketFraming, PORT_FORWARD,
};
use crate::translate::protocol::TUNNEL_PREFIX;
use crate::translate::ws::Liveness;

/// Bytes moved by one relayed connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayStats {
    pub client_to_upstream: u64,
    pub upstream_to_client: u64,
}

/// Why the upstream's answer to a relayed upgrade never came.
#[derive(Debug, thiserror::Error)]
pub(super) enum RelayError {
    #[error("error dialing the upstream: {0}")]
    Dial(#[from] crate::proxy::upstream::endpoint::UpstreamError),
    #[error("error talking to the upstream: {0}")]
    Http(#[from] hyper::Error),
    #[error("the upstream did not answer the upgrade within {0:?}")]
    Timeout(std::time::Duration),
    #[error("invalid upgrade request: {0}")]
    Request(String),
}

impl RelayError {
    /// The answer for the client.
    pub(super) fn response(&self) -> Response<ProxyBody> {
        let (code, reason) = match self {
            RelayError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "Timeout"),
            RelayError::Request(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            _ => (StatusCode::BAD_GATEWAY, "ServiceUnavailable"),
        };
        failure(code, reason, self.to_string())
    }
}

/// Relays one upgrade request; `slot` is its admission as a streaming session.
pub async fn relay(
    state: &ProxyState,
    req: UpgradeRequest,
    stream: StreamRequest,
    kind: RelayKind,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    if kind == RelayKind::WebSocket
        && !req
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
    let kind = match kind {
        RelayKind::Spdy => SessionKind::SpdyRelay,
        RelayKind::WebSocket | RelayKind::Other => SessionKind::WebSocketRelay,
    };
    let session_id = next_session_id();
    // The recording is opened before anything goes upstream, so that under --record=required
    // a session that cannot be recorded is refused before it starts.
    let recording = match start_recording(state, &req, &stream, session_id, kind).await {
        Ok(recording) => recording,
        Err(refusal) => return refusal,
    };
    let (peer, caller) = (stream.peer, &stream.caller);
    let upstream_req = match upstream_request(state, &req.parts, req.body.clone(), peer, caller) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let credentials = upstream_req.headers().get(header::AUTHORIZATION).cloned();
    let (answer, identity) = tokio::join!(
        ask_upstream(state, upstream_req),
        session_audit::identify(state, caller, credentials),
    );
    let answer = answer.map(|resp| resp.map(BodyExt::boxed));
    let relayed = Relayed::new(state, req, stream, kind, slot, session_id, recording);
    carry(state, relayed, answer, identity).await
}

/// Relays an upgrade whose upstream answer is already in: WebSocket pass-through, and SPDY
/// under `--upstream-streaming auto`, which had to see the answer to choose the path. The
/// recording opens now; under `--record=required` a failure drops the upstream's connection
/// before a byte is relayed, which ends the session there.
#[allow(clippy::too_many_arguments)]
pub(super) async fn relay_answered(
    state: &ProxyState,
    req: UpgradeRequest,
    stream: StreamRequest,
    kind: SessionKind,
    slot: SessionSlot,
    answer: Result<Response<ProxyBody>, RelayError>,
    identity: AuditIdentity,
) -> Response<ProxyBody> {
    let session_id = next_session_id();
    let recording = match start_recording(state, &req, &stream, session_id, kind).await {
        Ok(recording) => recording,
        Err(refusal) => {
            drop(answer);
            return refusal;
        }
    };
    let relayed = Relayed::new(state, req, stream, kind, slot, session_id, recording);
    carry(state, relayed, answer, identity).await
}

/// A relayed session's recording as it starts.
#[derive(Default)]
pub(super) struct RelayRecording {
    recorder: Option<crate::audit::recording::Recorder>,
    /// Why it could not start (best-effort: the session goes on unrecorded).
    error: Option<String>,
    /// `--record=required`.
    required: bool,
}

/// Opens the recording of an exec or attach about to be relayed (nothing for other requests
/// or without `--record-dir`). Under `--record=required` a recording that cannot start refuses
/// the session: the refusal is audited and the 503 for the client is the error.
async fn start_recording(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
    session_id: u64,
    kind: SessionKind,
) -> Result<RelayRecording, Response<ProxyBody>> {
    let required = state
        .recordings
        .as_ref()
        .is_some_and(|r| r.policy() == RecordPolicy::Required);
    let recordable = stream.target.is_remote_command();
    let Some(recordings) = state.recordings.as_ref().filter(|_| recordable) else {
        return Ok(RelayRecording::default());
    };
    let (command, title) = (
        &stream.target.options.command,
        stream.target.recording_title(),
    );
    let id = crate::audit::instance::session_id(session_id);
    match recordings.open(&id, command, title).await {
        Ok(r) => Ok(RelayRecording {
            recorder: Some(r),
            error: None,
            required,
        }),
        Err(e) => {
            warn!(session = session_id, error = %e, "the relayed session's recording could not start");
            if !required {
                return Ok(RelayRecording {
                    recorder: None,
                    error: Some(e.to_string()),
                    required,
                });
            }
            refused_unrecorded(state, req, stream, session_id, kind, &e.to_string()).await;
            Err(failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!(
                    "kube-ws-proxy cannot record this session and recordings are required \
                     (--record=required): {e}"
                ),
            ))
        }
    }
}

/// A relayed upgrade whose upstream answer is in: what [`carry`] needs besides the answer.
pub(super) struct Relayed {
    pub on_upgrade: hyper::upgrade::OnUpgrade,
    pub path: String,
    /// What the request names, as the front door read it.
    pub target: StreamTarget,
    /// Who asks.
    pub caller: Caller,
    pub peer: SocketAddr,
    pub kind: SessionKind,
    pub slot: SessionSlot,
    pub session_id: u64,
    pub guard: crate::proxy::observability::metrics::SessionGuard,
    /// The session's recording, opened before the relay starts.
    pub recorder: Option<crate::audit::recording::Recorder>,
    pub recording_error: Option<String>,
    /// `--record=required`.
    pub required: bool,
    /// The request's `Audit-ID`.
    pub audit_id: Option<String>,
    /// The client connection and how it asked (HTTP/1.1 upgrade or HTTP/2 extended CONNECT).
    pub client_stream: crate::proxy::wire::client_stream::ClientStream,
    /// The `Sec-WebSocket-Key` that went upstream (on HTTP/2 the proxy's own).
    pub sent_key: Option<http::HeaderValue>,
}

impl Relayed {
    /// Takes what the relay needs from the request; from here on a failure is the upstream's
    /// (an unfinished session guard counts as `upstream_error`).
    fn new(
        state: &ProxyState,
        req: UpgradeRequest,
        stream: StreamRequest,
        kind: SessionKind,
        slot: SessionSlot,
        session_id: u64,
        recording: RelayRecording,
    ) -> Relayed {
        let peer = stream.peer;
        Relayed {
            path: req.parts.uri.path().to_owned(),
            target: stream.target,
            caller: stream.caller,
            audit_id: stream.audit_id,
            // On HTTP/2 the key is the proxy's own (extended_connect.rs): the upstream's
            // accept is checked against it here, not by the client.
            sent_key: req.parts.headers.get(header::SEC_WEBSOCKET_KEY).cloned(),
            on_upgrade: req.on_upgrade,
            client_stream: req.client,
            peer,
            kind,
            slot,
            session_id,
            guard: state.metrics.session(kind),
            recorder: recording.recorder,
            recording_error: recording.error,
            required: recording.required,
        }
    }
}

/// Carries a relayed upgrade on from the upstream's answer: a non-101 goes to the client as it
/// comes; a 101 starts the byte copy (recorded and audited) in the background and is answered.
pub(super) async fn carry(
    state: &ProxyState,
    relayed: Relayed,
    answer: Result<Response<ProxyBody>, RelayError>,
    identity: AuditIdentity,
) -> Response<ProxyBody> {
    let Relayed {
        on_upgrade,
        path,
        target,
        caller,
        peer,
        kind,
        slot,
        session_id,
        guard,
        recorder,
        mut recording_error,
        required,
        audit_id,
        client_stream,
        sent_key,
    } = relayed;
    let protocol = answer.as_ref().ok().and_then(negotiated_protocol);
    // Only a session that started can be followed: which protocol it speaks is in the 101.
    let mut tap = None;
    let mut refusal = None;
    if let (Some(recorder), Ok(resp)) = (recorder, &answer) {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            match observer_for(resp, Scope::Everything) {
                Some(observer) => {
                    let (upgrade, protocol) = agreed(resp);
                    let ending = relay_ending::Ending::for_protocol(upgrade, protocol);
                    tap = Some(RelayTap::new(recorder, observer, required).ending_with(ending))
                }
                None => {
                    let e = format!(
                        "cannot follow the relayed protocol {}",
                        protocol.as_deref().unwrap_or("(none named)")
                    );
                    warn!(session = session_id, error = %e, "the relayed session cannot be recorded");
                    if required {
                        refusal = Some(e.clone());
                    }
                    recording_error = Some(e);
                }
            }
        }
    }
    // Without a recording, an audited exec or attach is still followed for its exit code: its
    // error stream alone, the other streams' payloads passed over unread.
    if let (None, Some(_), Ok(resp)) = (&tap, &state.audit, &answer) {
        let remote_command = target.is_remote_command();
        if remote_command && resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            tap = observer_for(resp, Scope::ErrorStream).map(RelayTap::observing);
        }
    }
    let mut info = session_audit::session_info(
        session_id,
        &target,
        SessionClient::new(peer, client_stream.form),
        identity,
        match kind {
            SessionKind::SpdyRelay => ProtocolPath::RelaySpdy,
            SessionKind::PassThrough => ProtocolPath::PassThrough,
            _ => ProtocolPath::RelayWebsocket,
        },
        protocol,
        audit_id,
    );
    if let (Some(info), Some(path)) = (info.as_mut(), tap.as_ref().and_then(RelayTap::path)) {
        info.recording = Some(path.display().to_string());
    }
    let audit = session_audit::start(state, info);
    if let Some(e) = refusal {
        // The upstream agreed, but nothing has been relayed yet: dropping its connection ends
        // the session there, and the client gets a refusal instead of the 101.
        drop(answer);
        drop(slot);
        end_refused(audit, &e);
        guard.finish(SessionOutcome::RecordingFailed, 0, 0);
        return failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "kube-ws-proxy cannot record this session and recordings are required \
                 (--record=required): {e}"
            ),
        );
    }
    let mut resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            state.metrics.upstream_upgrade_failure(0);
            end_unstarted(audit, SessionOutcome::UpstreamError, Some(e.to_string()));
            return e.response();
        }
    };

    if resp.status() != StatusCode::SWITCHING_PROTOCOLS
        && !relay_answer::may_pass_refusal(client_stream.form, resp.status())
    {
        drop(slot);
        let e = format!(
            "the upstream answered the WebSocket upgrade with {} instead of switching protocols",
            resp.status().as_u16()
        );
        end_unstarted(audit, SessionOutcome::UpstreamError, Some(e.clone()));
        state
            .metrics
            .upstream_upgrade_failure(resp.status().as_u16());
        guard.finish(SessionOutcome::UpstreamError, 0, 0);
        return failure(StatusCode::BAD_GATEWAY, "BadGateway", e);
    }
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Not a session: the slot goes back now, the answer streams through as it comes.
        drop(slot);
        end_unstarted(
            audit,
            SessionOutcome::UpstreamError,
            Some(format!("upstream answered {}", resp.status().as_u16())),
        );
        state
            .metrics
            .upstream_upgrade_failure(resp.status().as_u16());
        guard.finish(SessionOutcome::UpstreamError, 0, 0);
        let (mut parts, body) = resp.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, body);
    }

    // The audit log lists a port-forward's connections (kubectl ≤ 1.30's SPDY, the tunnel's
    // WebSocket passed through, the legacy WebSocket one): the relay shows its bytes to a
    // watch. Without the log nothing looks at them.
    let watch = audit
        .as_ref()
        .filter(|a| a.info().verb == Verb::PortForward)
        .and_then(|_| port_forward_watch(&resp));
    let upgraded_to_websocket = resp
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"));
    // What the client will be told; on HTTP/2 only once the upstream's accept checks out.
    let answer = match relay_answer::accepted(
        client_stream.form,
        sent_key.as_ref(),
        std::mem::take(resp.headers_mut()),
    ) {
        Ok(answer) => answer,
        Err(e) => {
            drop(slot);
            end_unstarted(audit, SessionOutcome::UpstreamError, Some(e.to_string()));
            state.metrics.upstream_upgrade_failure(101);
            guard.finish(SessionOutcome::UpstreamError, 0, 0);
            return failure(StatusCode::BAD_GATEWAY, "BadGateway", e.to_string());
        }
    };
    let handshake_timeout = state.handshake_timeout;
    let upstream_io =
        match tokio::time::timeout(handshake_timeout, hyper::upgrade::on(&mut resp)).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                end_unstarted(audit, SessionOutcome::UpstreamError, Some(e.to_string()));
                return RelayError::Http(e).response();
            }
            Err(_) => {
                let e = RelayError::Timeout(handshake_timeout);
                end_unstarted(audit, SessionOutcome::UpstreamError, Some(e.to_string()));
                return e.response();
            }
        };
    let user = caller.user().map(str::to_owned);
    let linger = state.session_limits.close_drain_timeout;
    // A relayed WebSocket (pass-through, legacy protocols, logs) can be pinged between the
    // upstream's frames; SPDY cannot from outside its session.
    let keepalive = state.client_keepalive.filter(|_| upgraded_to_websocket);
    // A followed log may rightly be quiet for hours; the kubelet's idle timeout spares it too.
    let idle_timeout = state
        .stream_idle_timeout
        .filter(|_| !path.ends_with("/log"));
    tokio::spawn(async move {
        let client = match tokio::time::timeout(handshake_timeout, on_upgrade).await {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                debug!(error = %e, "client upgrade failed");
                end_unstarted(audit, SessionOutcome::ClientGone, None);
                guard.finish(SessionOutcome::ClientGone, 0, 0);
                return;
            }
            Err(_) => {
                debug!("client upgrade timed out");
                end_unstarted(audit, SessionOutcome::ClientGone, None);
                guard.finish(SessionOutcome::ClientGone, 0, 0);
                return;
            }
        };
        let started = std::time::Instant::now();
        // A relay carries a protocol we do not parse: on shutdown it can only be cut.
        let counters = RelayCounters::default();
        let activity = ActivityClock::new();
        let idle = async {
            match idle_timeout {
                Some(limit) => activity.quiet_for(limit).await,
                None => std::future::pending().await,
            }
        };
        let must_end = async {
            match &tap {
                Some(tap) => tap.must_end().await,
                None => std::future::pending().await,
            }
        };
        let mut recording_failure = None;
        let liveness = Liveness::new(keepalive);
        let hooks = RelayHooks {
            tap: tap.as_ref(),
            watch: watch.as_ref(),
            keepalive: keepalive.map(|k| RelayKeepalive {
                pings: PingInjector::new(k.interval),
                liveness: liveness.clone(),
            }),
            linger: Some(linger),
        };
        let mut relay = Box::pin(pump(TokioIo::new(client), TokioIo::new(upstream_io), &counters, &activity, hooks));
        let outcome = tokio::select! {
            () = &mut relay => SessionOutcome::Success,
            silent = liveness.lost() => {
                info!(session = session_id, silent_ms = silent.as_millis() as u64, "relayed session ended: the client stopped answering pings");
                SessionOutcome::ClientUnresponsive
            }
            _ = slot.stop_token().cancelled_owned() => SessionOutcome::Drained,
            _ = idle => SessionOutcome::IdleTimeout,
            e = must_end => {
                warn!(session = session_id, error = %e, "relayed session ended: its recording failed and recordings are required");
                recording_failure = Some(e);
                SessionOutcome::RecordingFailed
            }
        };
        if outcome == SessionOutcome::RecordingFailed {
            // The relay ends it itself: the frame the client has begun, the Status, and the
            // client's own close, within the close drain timeout; then both are cut.
            let _ = tokio::time::timeout(linger, &mut relay).await;
        }
        drop(relay);
        // A relay that ended the session itself before the select saw why.
        let outcome = match tap.as_ref().and_then(RelayTap::must_have_ended) {
            Some(e) if outcome == SessionOutcome::Success => {
                recording_failure = Some(e);
                SessionOutcome::RecordingFailed
            }
            _ => outcome,
        };
        let stats = counters.stats();
        let tap_end = tap.map(RelayTap::finish).unwrap_or_default();
        // A command that ended with a non-zero exit code is counted as such, as on the
        // translated path (the relay only knows it where it followed the stream).
        let outcome = match (outcome, tap_end.exit_code) {
            (SessionOutcome::Success, Some(code)) if code != 0 => SessionOutcome::NonZeroExit,
            (outcome, _) => outcome,
        };
        let recording_error = recording_failure
            .or(tap_end.recording_error)
            .or(recording_error);
        // Before the slot goes: a drained proxy exits once every slot is back.
        if let Some(audit) = audit {
            let end = AuditEnd {
                bytes_in: stats.client_to_upstream,
                bytes_out: stats.upstream_to_client,
                duration_ms: started.elapsed().as_millis() as u64,
                exit_code: tap_end.exit_code,
                status: tap_end.status,
                outcome: outcome.label(),
                ended_by: match outcome {
                    SessionOutcome::Drained => "drained",
                    SessionOutcome::IdleTimeout => "idle timeout",
                    SessionOutcome::RecordingFailed => "recording failed",
                    SessionOutcome::ClientUnresponsive => "client unresponsive",
                    _ => "connection closed",
                },
                recording_error,
                ..Default::default()
            };
            audit.end(match watch {
                Some(watch) => end.with_port_forwards(watch.finish()),
                None => end,
            });
        }
        drop(slot);
        guard.finish(outcome, stats.client_to_upstream, stats.upstream_to_client);
        info!(
            session = session_id,
            kind = kind.label(),
            user = user.as_deref().unwrap_or(""),
            http_version = client_stream.form.http_version(),
            connection = client_stream.connection.0,
            path = %path,
            outcome = outcome.label(),
            bytes_up = stats.client_to_upstream,
            bytes_down = stats.upstream_to_client,
            duration_ms = started.elapsed().as_millis() as u64,
            "relayed upgrade finished"
        );
    }
    // The session's log lines name the request they came from (its audit id).
    .in_current_span());
    answer
}

/// Dials the upstream (`--upstream-dial-timeout`) and sends the request; its answer's head
/// must arrive within `--handshake-timeout`.
pub(super) async fn ask_upstream(
    state: &ProxyState,
    req: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>, RelayError> {
    let io = state.upstream.connect_raw().await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // Drives the connection: the response body (if it is not a 101) or the upgrade hand-over.
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "relayed upstream connection ended with an error");
        }
    });
    let timeout = state.handshake_timeout;
    match tokio::time::timeout(timeout, sender.send_request(req)).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(RelayError::Timeout(timeout)),
    }
}

/// The request for the upstream: the client's headers minus hop-by-hop ones (but keeping the
/// upgrade), the upstream's Host, `X-Forwarded-For` and what the auth mode says.
pub(super) fn upstream_request(
    state: &ProxyState,
    parts: &http::request::Parts,
    body: Bytes,
    peer: SocketAddr,
    caller: &Caller,
) -> Result<Request<Full<Bytes>>, RelayError> {
    let upstream = &state.upstream;
    let pq = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let uri: Uri = upstream
        .join_path(pq)
        .parse()
        .map_err(|e: http::uri::InvalidUri| RelayError::Request(e.to_string()))?;
    let mut headers = parts.headers.clone();
    let upgrade = headers.get(header::UPGRADE).cloned();
    headers.remove(header::CONTENT_LENGTH);
    remove_hop_by_hop(&mut headers);
    set_forwarding_headers(&mut headers, peer.ip(), state.trust_forwarded_for);
    state.auth.apply(caller, &mut headers);
    let host = HeaderValue::from_str(&upstream.authority())
        .map_err(|e| RelayError::Request(e.to_string()))?;
    headers.insert(header::HOST, host);
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Some(u) = upgrade {
        headers.insert(header::UPGRADE, u);
    }
    if !body.is_empty() || parts.method == http::Method::POST {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Bytes copied so far each way; readable even when the relay was cut short.
#[derive(Debug, Default)]
pub struct RelayCounters {
    client_to_upstream: AtomicU64,
    upstream_to_client: AtomicU64,
}

impl RelayCounters {
    /// The counts now.
    pub fn stats(&self) -> RelayStats {
        RelayStats {
            client_to_upstream: self.client_to_upstream.load(Ordering::Relaxed),
            upstream_to_client: self.upstream_to_client.load(Ordering::Relaxed),
        }
    }
}

/// Keepalive of a relayed WebSocket's client: pings slipped in between the upstream's frames,
/// and whether the client is still heard from.
pub struct RelayKeepalive {
    pub pings: PingInjector,
    pub liveness: Liveness,
}

/// What a relay does besides copying: the session's recording (`tap`), a port-forward's audit
/// (`watch`), client keepalive, and how long one direction may outlive the other (`linger`).
#[derive(Default)]
pub struct RelayHooks<'a> {
    pub tap: Option<&'a RelayTap>,
    pub watch: Option<&'a PortForwardWatch>,
    pub keepalive: Option<RelayKeepalive>,
    /// Once one direction has ended, how long the other may go on (to deliver a last Status,
    /// to answer a Close) before the relay ends anyway. `None`: until it ends by itself.
    pub linger: Option<std::time::Duration>,
}

/// Copies both ways until both directions end (or, with a linger, until it is over after the
/// first ended); a finished direction half-closes the other side.
/// Bytes are counted on `counters` and every read is noted on `activity`; with a tap, every
/// read is shown to it (the session's recording) before it is passed on, and with a watch
/// (a port-forward's audit) too. With keepalive, pings go to the client between the
/// upstream's frames, and every read from the client counts as hearing from it.
pub async fn pump<C, U>(
    client: C,
    upstream: U,
    counters: &RelayCounters,
    activity: &ActivityClock,
    hooks: RelayHooks<'_>,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let (pings, liveness) = match hooks.keepalive {
        Some(k) => (Some(k.pings), Some(k.liveness)),
        None => (None, None),
    };
    let down = async {
        let side = Side {
            total: &counters.upstream_to_client,
            tap: hooks.tap.map(|t| (t, Direction::UpstreamToClient)),
            watch: hooks.watch.map(|w| (w, Direction::UpstreamToClient)),
            pings,
            liveness: None,
            held: liveness.as_ref(),
        };
        let copied = copy(&mut ur, &mut cw, activity, side).await;
        // After the proxy's own last frames on SPDY the client closes: a spdystream that
        // reads the connection's end drops the frames it has not handled yet.
        if copied != (Copied::MustEnd { half_close: false }) {
            let _ = cw.shutdown().await;
        }
    };
    let up = async {
        let side = Side {
            total: &counters.client_to_upstream,
            tap: hooks.tap.map(|t| (t, Direction::ClientToUpstream)),
            watch: hooks.watch.map(|w| (w, Direction::ClientToUpstream)),
            pings: None,
            liveness: liveness.as_ref(),
            held: None,
        };
        let copied = copy(&mut cr, &mut uw, activity, side).await;
        let _ = uw.shutdown().await;
        if let Copied::MustEnd { .. } = copied {
            // The session is over, nothing more goes upstream; the client is read (and what it
            // sends dropped) until it closes, so that it reads the end the proxy gave it
            // instead of meeting a reset.
            discard(&mut cr).await;
        }
    };
    // Stream protocols close both ways at once; a peer that keeps its half open after the other
    // ended (an HTTP/2 client that never ends its stream, a client that never closes its
    // socket) must not hold the session, its slot and its upstream connection until the idle
    // timeout. kube-apiserver's own relay ends at the first direction's end; the linger
    // leaves the other the time a close handshake needs.
    tokio::pin!(down, up);
    let down_ended_first = tokio::select! {
        () = &mut down => true,
        () = &mut up => false,
    };
    let rest = async {
        if down_ended_first {
            up.await
        } else {
            down.await
        }
    };
    match hooks.linger {
        Some(linger) => {
            let _ = tokio::time::timeout(linger, rest).await;
        }
        None => rest.await,
    }
}

/// One direction of a relay: where its bytes are counted and who else sees them.
struct Side<'a> {
    total: &'a AtomicU64,
    tap: Option<(&'a RelayTap, Direction)>,
    watch: Option<(&'a PortForwardWatch, Direction)>,
    /// Towards the client: pings to slip in.
    pings: Option<PingInjector>,
    /// From the client: its reads are what proves it is there.
    liveness: Option<&'a Liveness>,
    /// Towards the client: its liveness, held while the tap keeps the output back (no ping can
    /// go out then, so the client's silence is not its fault).
    held: Option<&'a Liveness>,
}

/// How one direction's copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    /// End of stream or an error, on either side.
    Ended,
    /// The tap ended the session (`--record=required`). Towards the client, whether the
    /// connection may be half-closed now: `false` once the proxy's last frames went on SPDY.
    MustEnd { half_close: bool },
}

/// What waiting for the next read gave.
enum Next {
    Read(usize),
    Ended,
    MustEnd,
}

/// Copies until EOF or an error, with one bounded buffer, adding what was copied to the side's
/// total; stops early when the tap says the session must end. Towards the client a tap may
/// pass on less than a read (the start of a frame head waits at the buffer's front for the
/// rest of it), and a session that must end is ended between two frames with the proxy's
/// Status ([`end_down`]).
async fn copy<R, W>(r: &mut R, w: &mut W, activity: &ActivityClock, mut side: Side<'_>) -> Copied
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    // Bytes at the front of `buf` kept back from the last read.
    let mut kept = 0;
    loop {
        let n = match next_read(r, w, &mut buf[kept..], &mut side).await {
            Next::Read(n) => n,
            Next::Ended => {
                // The start of a head the upstream never finished: passed on as it came.
                if kept > 0 && w.write_all(&buf[..kept]).await.is_ok() {
                    side.total.fetch_add(kept as u64, Ordering::Relaxed);
                }
                return Copied::Ended;
            }
            Next::MustEnd => return end_down(r, w, &mut buf, kept, &side).await,
        };
        activity.touch();
        if let Some(liveness) = side.liveness {
            liveness.heard();
        }
        let have = kept + n;
        let pass = match side.tap {
            Some((tap, Direction::UpstreamToClient)) => {
                match held_meanwhile(side.held, tap.pass_down(&buf[..have])).await {
                    Some(pass) => pass,
                    None => return end_down(r, w, &mut buf, have, &side).await,
                }
            }
            Some((tap, direction)) => {
                if !tap.relayed(direction, &buf[..have]).await {
                    return Copied::MustEnd { half_close: true };
                }
                have
            }
            None => have,
        };
        if let Some((watch, direction)) = side.watch {
            watch.relayed(direction, &buf[..pass]);
        }
        let written = match side.pings.as_mut() {
            Some(pings) => pings.write_through(w, &buf[..pass]).await,
            None => w.write_all(&buf[..pass]).await,
        };
        if written.is_err() {
            return Copied::Ended;
        }
        side.total.fetch_add(pass as u64, Ordering::Relaxed);
        buf.copy_within(pass..have, 0);
        kept = have - pass;
    }
}

/// Waits for `fut` (the tap, which may wait for the recording) with the client's liveness
/// held: a relay cannot ping inside a frame, so while its output is held back the client has
/// nothing to answer and its silence must not end the session as unresponsive.
async fn held_meanwhile<F: std::future::Future>(client: Option<&Liveness>, fut: F) -> F::Output {
    let _held = client.map(Liveness::hold);
    fut.await
}

/// Waits for the next read into `buf`, sending the client's pings as they fall due; towards
/// the client, gives up waiting once the tap says the session must end.
async fn next_read<R, W>(r: &mut R, w: &mut W, buf: &mut [u8], side: &mut Side<'_>) -> Next
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let ender = match side.tap {
        Some((tap, Direction::UpstreamToClient)) => Some(tap),
        _ => None,
    };
    loop {
        let must_end = async {
            match ender {
                Some(tap) => {
                    tap.must_end().await;
                }
                None => std::future::pending().await,
            }
        };
        let read = match side.pings.as_mut() {
            None => {
                let _listening = side.liveness.map(Liveness::listen);
                tokio::select! {
                    read = r.read(buf) => read,
                    () = must_end => return Next::MustEnd,
                }
            }
            Some(pings) => tokio::select! {
                read = r.read(buf) => read,
                () = must_end => return Next::MustEnd,
                () = pings.due() => {
                    if pings.send(w).await.is_err() {
                        return Next::Ended;
                    }
                    continue;
                }
            },
        };
        return match read {
            Ok(0) | Err(_) => Next::Ended,
            Ok(n) => Next::Read(n),
        };
    }
}

/// Ends a session that must end, towards the client: the frame the client has begun is
/// completed (the first bytes of `buf[..have]`, then what more the upstream sends of it),
/// and the proxy's last frames follow, with the Status saying why. Where none can go (the
/// upstream began closing, a stream not understood, the upstream ends inside the frame), the
/// connection is just closed.
async fn end_down<R, W>(
    r: &mut R,
    w: &mut W,
    buf: &mut [u8],
    mut have: usize,
    side: &Side<'_>,
) -> Copied
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let closed = Copied::MustEnd { half_close: true };
    let Some((tap, Direction::UpstreamToClient)) = side.tap else {
        return closed;
    };
    tap.note_ended();
    if !tap.ends_with_status() {
        return closed;
    }
    let why = tap.must_end().await;
    loop {
        let done = tap.complete(&buf[..have]);
        if done > 0 {
            if w.write_all(&buf[..done]).await.is_err() {
                return closed;
            }
            side.total.fetch_add(done as u64, Ordering::Relaxed);
        }
        if tap.owed() == 0 {
            break;
        }
        have = match r.read(buf).await {
            Ok(0) | Err(_) => return closed,
            Ok(n) => n,
        };
    }
    let Some(end) = tap.end_frames(&why) else {
        return closed;
    };
    if w.write_all(&end.bytes).await.is_err() || w.flush().await.is_err() {
        return closed;
    }
    Copied::MustEnd {
        half_close: end.half_close,
    }
}

/// Reads and drops until the end of the stream.
async fn discard<R: tokio::io::AsyncRead + Unpin>(r: &mut R) {
    let mut buf = [0u8; 4096];
    while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// The protocol a relayed upgrade agreed on, from the upstream's 101: the WebSocket
/// subprotocol, or for SPDY the stream protocol version (`v4.channel.k8s.io`, ...).
fn negotiated_protocol<B>(resp: &Response<B>) -> Option<String> {
    let h = resp.headers();
    let upgrade = h.get(header::UPGRADE).and_then(|v| v.to_str().ok());
    let sub = h
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .or_else(|| h.get("x-stream-protocol-version"))
        .and_then(|v| v.to_str().ok());
    match (upgrade, sub) {
        (Some(u), Some(s)) if u.eq_ignore_ascii_case("websocket") => Some(s.to_owned()),
        (Some(u), Some(s)) => Some(format!("{u}+{s}")),
        (Some(u), None) => Some(u.to_owned()),
        (None, _) => None,
    }
}

/// The watch on a port-forward the upstream accepted, for the protocol it agreed on: SPDY
/// `portforward.k8s.io`, the tunnel's WebSocket (`SPDY/3.1+portforward.k8s.io`, passed
/// through), or a WebSocket channel protocol (legacy port-forward); `None` for one it cannot
/// follow.
fn port_forward_watch<B>(resp: &Response<B>) -> Option<PortForwardWatch> {
    let h = resp.headers();
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let upgrade = header("upgrade")?;
    if upgrade.eq_ignore_ascii_case("SPDY/3.1") {
        return (header("x-stream-protocol-version") == Some(PORT_FORWARD))
            .then(PortForwardWatch::new);
    }
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    let subprotocol = header("sec-websocket-protocol");
    if subprotocol.and_then(|p| p.strip_prefix(TUNNEL_PREFIX)) == Some(PORT_FORWARD) {
        return Some(PortForwardWatch::tunnel());
    }
    // A kubelet offered no subprotocol speaks the binary framing under no name.
    let framing = match subprotocol.filter(|p| !p.is_empty()) {
        None => WebSocketFraming::Binary,
        Some(name) => WebSocketFraming::from_subprotocol(name)?,
    };
    Some(PortForwardWatch::websocket(framing))
}

/// The observer of a relayed session the upstream accepted, looking at as much as `scope`
/// says, if its protocol can be followed.
fn observer_for<B>(resp: &Response<B>, scope: Scope) -> Option<Observer> {
    let (upgrade, sub) = agreed(resp);
    Observer::with_scope(upgrade, sub, scope)
}

/// What a relayed upgrade's 101 agreed on: its `Upgrade`, and its `Sec-WebSocket-Protocol`
/// (WebSocket) or `X-Stream-Protocol-Version` (SPDY).
fn agreed<B>(resp: &Response<B>) -> (Option<&str>, Option<&str>) {
    let h = resp.headers();
    let upgrade = h.get(header::UPGRADE).and_then(|v| v.to_str().ok());
    let sub = h
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .or_else(|| h.get("x-stream-protocol-version"))
        .and_then(|v| v.to_str().ok());
    (upgrade, sub)
}

/// Audits a relayed session refused before it went upstream because it could not be
/// recorded.
async fn refused_unrecorded(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
    session_id: u64,
    kind: SessionKind,
    error: &str,
) {
    if state.audit.is_none() {
        return;
    }
    let credentials = req.parts.headers.get(header::AUTHORIZATION).cloned();
    let identity = session_audit::identify(state, &stream.caller, credentials).await;
    let info = session_audit::session_info(
        session_id,
        &stream.target,
        SessionClient::new(stream.peer, stream.client.form),
        identity,
        match kind {
            SessionKind::SpdyRelay => ProtocolPath::RelaySpdy,
            SessionKind::PassThrough => ProtocolPath::PassThrough,
            _ => ProtocolPath::RelayWebsocket,
        },
        None,
        stream.audit_id.clone(),
    );
    end_refused(session_audit::start(state, info), error);
}

/// Ends the trail of a relay refused because it could not be recorded.
fn end_refused(audit: Option<SessionAudit>, error: &str) {
    session_audit::end_unstarted(
        audit,
        SessionOutcome::RecordingFailed,
        "refused: it could not be recorded",
        None,
        Some(error.to_owned()),
    );
}

/// Ends the trail of a relay that never carried a byte.
fn end_unstarted(audit: Option<SessionAudit>, outcome: SessionOutcome, status: Option<String>) {
    let ended_by = match outcome {
        SessionOutcome::ClientGone => session_audit::CLIENT_UPGRADE_FAILED,
        _ => "upstream refused",
    };
    session_audit::end_unstarted(audit, outcome, ended_by, status, None);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// Relays with a 10 s linger; how long the relay took.
    async fn lingering_pump(
        client: DuplexStream,
        upstream: DuplexStream,
        counters: &RelayCounters,
    ) -> Duration {
        let started = tokio::time::Instant::now();
        let hooks = RelayHooks {
            linger: Some(Duration::from_secs(10)),
            ..RelayHooks::default()
        };
        pump(client, upstream, counters, &ActivityClock::new(), hooks).await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_its_side_open_is_cut_after_the_linger() {
        let (client_near, mut client_far) = duplex(1024);
        let (upstream_near, mut upstream_far) = duplex(1024);
        let counters = RelayCounters::default();
        let upstream = async move {
            upstream_far.write_all(b"last words").await.unwrap();
            // The upstream is done: its connection closes.
        };
        let relay = lingering_pump(client_near, upstream_near, &counters);
        let (took, ()) = tokio::join!(relay, upstream);
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
        // The client got everything and then the end, though it never closed its own side.
        let mut got = Vec::new();
        client_far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        assert_eq!(counters.stats().upstream_to_client, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_other_direction_finishes_within_the_linger() {
        let (client_near, mut client_far) = duplex(1024);
        let (upstream_near, mut upstream_far) = duplex(1024);
        let counters = RelayCounters::default();
        let client = async move {
            client_far.write_all(b"bye").await.unwrap();
            client_far.shutdown().await.unwrap();
            let mut got = Vec::new();
            client_far.read_to_end(&mut got).await.unwrap();
            got
        };
        let upstream = async move {
            let mut got = [0; 3];
            upstream_far.read_exact(&mut got).await.unwrap();
            assert_eq!(
                upstream_far.read(&mut [0; 1]).await.unwrap(),
                0,
                "the client's end"
            );
            // A last answer, a while after the client's side ended.
            tokio::time::sleep(Duration::from_secs(3)).await;
            upstream_far.write_all(b"status").await.unwrap();
        };
        let relay = lingering_pump(client_near, upstream_near, &counters);
        let (took, got, ()) = tokio::join!(relay, client, upstream);
        assert_eq!(got, b"status");
        assert!(
            took < Duration::from_secs(4),
            "ended when the upstream did: {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_linger_a_half_open_relay_goes_on() {
        let (client_near, _client_far) = duplex(1024);
        let (upstream_near, upstream_far) = duplex(1024);
        drop(upstream_far);
        let (counters, activity) = (RelayCounters::default(), ActivityClock::new());
        let relay = pump(
            client_near,
            upstream_near,
            &counters,
            &activity,
            RelayHooks::default(),
        );
        assert!(tokio::time::timeout(Duration::from_secs(3600), relay)
            .await
            .is_err());
    }
}
