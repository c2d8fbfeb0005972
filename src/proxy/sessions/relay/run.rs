//! The relay's runner: a byte-for-byte relay of an upgrade the upstream serves natively
//! (SPDY/3.1, legacy WebSocket exec/port-forward, log streaming), from the request to the
//! upstream's answer. The upstream decides; we pass its answer through and, on a 101, start
//! the session ([`super::session`]) that copies bytes both ways.
//!
//! Every wait on the upstream is bounded (`--upstream-dial-timeout`, then
//! `--handshake-timeout` for its answer), and an answer other than 101 is not a session: the
//! slot is given back at once and the answer streamed to the client as it comes (it may be a
//! followed log or a watch that never ends).
//!
//! A relay cannot ping either side inside a protocol it does not parse: its liveness is TCP
//! keepalive (`--tcp-keepalive`) and, except for followed logs, `--stream-idle-timeout`.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tracing::{debug, warn, Instrument};

use super::answer;
use super::ending;
use super::recording::RelayTap;
use super::session::RelaySession;
use crate::audit::{ProtocolPath, Verb};
use crate::peer_hangup::PeerHangup;
use crate::proxy::auth::Caller;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::route::stream_request::{StreamRequest, StreamTarget};
use crate::proxy::sessions::lifecycle::audit;
use crate::proxy::sessions::lifecycle::end::Running;
use crate::proxy::sessions::lifecycle::recording::{unrecordable_response, OpenedRecording};
use crate::proxy::sessions::lifecycle::start::{self, Begun};
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::upstream::error::{reported, UpstreamFailure, TALKING_FAILED};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::headers::{remove_hop_by_hop, set_forwarding_headers};
use crate::proxy::wire::status_response::failure;
use crate::translate::observe::{
    Observer, PortForwardWatch, Scope, WebSocketFraming, PORT_FORWARD,
};
use crate::translate::protocol::TUNNEL_PREFIX;

/// Why the upstream's answer to a relayed upgrade never came.
#[derive(Debug, thiserror::Error)]
pub(in crate::proxy::sessions) enum RelayError {
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
    pub(in crate::proxy::sessions) fn response(&self) -> Response<ProxyBody> {
        let (code, reason) = match self {
            RelayError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "Timeout"),
            RelayError::Request(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            _ => (StatusCode::BAD_GATEWAY, "ServiceUnavailable"),
        };
        // The cause goes to the log; the client, who may be anyone, gets its kind.
        failure(code, reason, reported(self))
    }
}

impl UpstreamFailure for RelayError {
    fn client_reason(&self) -> String {
        match self {
            RelayError::Dial(e) => format!("error dialing the upstream: {}", e.client_reason()),
            // hyper's error may wrap an I/O error carrying a TLS alert.
            RelayError::Http(_) => TALKING_FAILED.to_owned(),
            RelayError::Timeout(_) | RelayError::Request(_) => self.to_string(),
        }
    }

    fn log_kind(&self) -> &'static str {
        match self {
            RelayError::Dial(e) => UpstreamFailure::log_kind(e),
            RelayError::Http(_) => "upstream_connection",
            RelayError::Timeout(_) => "upstream_answer_timeout",
            RelayError::Request(_) => "upstream_upgrade",
        }
    }
}

/// Relays one upgrade request, admitted as `running` (a relay of its kind). In order: the
/// session begins (the caller identified, an exec or attach's recording opened, the audit
/// trail started), then, if it may go upstream, the upstream is asked and its answer carried
/// on ([`carry`]).
pub async fn relay(
    state: &ProxyState,
    req: UpgradeRequest,
    stream: StreamRequest,
    mut running: Running,
) -> Response<ProxyBody> {
    // The protocol is in the upstream's answer: the `ended` event says it.
    let path = protocol_path(running.kind());
    let recording = start::begin(state, &req, &stream, &mut running, path, None).await;
    if let Err(held) = start::may_go_upstream(&running, &recording) {
        return start::end_held(running, recording, held);
    }
    let upstream_req = match upstream_request(state, &req, &stream) {
        Ok(r) => r,
        Err(e) => {
            running.upstream_refused(e.to_string(), 0);
            return e.response();
        }
    };
    let answer = ask_upstream(state, upstream_req).await;
    let answer = answer.map(|resp| resp.map(BodyExt::boxed));
    let relayed = Relayed::new(req, stream, &running, recording);
    carry(state, relayed, running, answer).await
}

/// Relays an upgrade whose session has begun and whose upstream answer is already in:
/// WebSocket pass-through, and SPDY under `--upstream-streaming auto`, which had to see the
/// answer to choose the path.
pub(in crate::proxy::sessions) async fn relay_answered(
    state: &ProxyState,
    req: UpgradeRequest,
    stream: StreamRequest,
    begun: Begun,
    answer: Result<Response<ProxyBody>, RelayError>,
) -> Response<ProxyBody> {
    let Begun { running, recording } = begun;
    let relayed = Relayed::new(req, stream, &running, recording);
    carry(state, relayed, running, answer).await
}

/// A relayed upgrade whose upstream answer is in: what [`carry`] needs besides the answer.
pub(in crate::proxy::sessions) struct Relayed {
    pub on_upgrade: hyper::upgrade::OnUpgrade,
    pub path: String,
    /// What the request names, as the front door read it.
    pub target: StreamTarget,
    /// Who asks.
    pub caller: Caller,
    pub kind: SessionKind,
    pub session_id: u64,
    /// The session's recording, opened before the relay starts.
    pub recorder: Option<crate::audit::recording::Recorder>,
    pub recording_error: Option<String>,
    /// `--record=required`.
    pub required: bool,
    /// The client connection and how it asked (HTTP/1.1 upgrade or HTTP/2 extended CONNECT).
    pub client_stream: crate::proxy::wire::client_stream::ClientStream,
    /// The `Sec-WebSocket-Key` that went upstream (on HTTP/2 the proxy's own).
    pub sent_key: Option<http::HeaderValue>,
}

impl Relayed {
    /// Takes what the relay of session `running` needs from the request and its recording.
    fn new(
        req: UpgradeRequest,
        stream: StreamRequest,
        running: &Running,
        recording: OpenedRecording,
    ) -> Relayed {
        let (recorder, recording_error, required) = recording.into_parts();
        Relayed {
            path: req.parts.uri.path().to_owned(),
            target: stream.target,
            caller: stream.caller,
            // On HTTP/2 the key is the proxy's own (extended_connect.rs): the upstream's
            // accept is checked against it here, not by the client.
            sent_key: req.parts.headers.get(header::SEC_WEBSOCKET_KEY).cloned(),
            on_upgrade: req.on_upgrade,
            client_stream: req.client,
            kind: running.kind(),
            session_id: running.session_id(),
            recorder,
            recording_error,
            required,
        }
    }
}

/// Carries a relayed upgrade that has begun as `running` on from the upstream's answer: a
/// non-101 goes to the client as it comes; a 101 starts the byte copy (recorded and audited)
/// in the background and is answered. In order: the protocol agreed is noted for the `ended`
/// event, how the session is followed (recorded, or watched for its exit code), a session that
/// cannot be recorded under `--record=required` is refused, an answer that is not a session
/// goes to the client, and a session starts.
async fn carry(
    state: &ProxyState,
    mut relayed: Relayed,
    mut running: Running,
    answer: Result<Response<ProxyBody>, RelayError>,
) -> Response<ProxyBody> {
    let protocol = answer.as_ref().ok().and_then(negotiated_protocol);
    running.agreed(protocol_path(relayed.kind), protocol.clone());
    let (tap, refusal) = match &answer {
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            follow_session(state, &mut relayed, resp, protocol.as_deref())
        }
        // Not a session: nothing to record.
        _ => {
            drop(relayed.recorder.take());
            (None, None)
        }
    };
    if let Some(e) = refusal {
        // The upstream agreed, but nothing has been relayed yet: dropping its connection ends
        // the session there, and the client gets a refusal instead of the 101.
        drop(answer);
        return refuse_unrecordable(running, e);
    }
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            state
                .metrics
                .upstream_upgrade_failure(state.cluster.metrics_label(), 0);
            running.upstream_refused(e.to_string(), 0);
            return e.response();
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return not_switched(state, relayed, resp, running);
    }
    start_session(state, relayed, resp, running, tap).await
}

/// How a session the upstream switched protocols for is followed: with a recording, its tap
/// (or, where its protocol cannot be followed, why not: a refusal under `--record=required`);
/// without one, an audited exec or attach is still followed for its exit code. Only a session
/// that started can be followed: which protocol it speaks is in the 101.
fn follow_session<B>(
    state: &ProxyState,
    relayed: &mut Relayed,
    resp: &Response<B>,
    protocol: Option<&str>,
) -> (Option<RelayTap>, Option<String>) {
    let mut tap = None;
    let mut refusal = None;
    if let Some(recorder) = relayed.recorder.take() {
        match observer_for(state, resp, Scope::Everything) {
            Some(observer) => {
                let (upgrade, protocol) = agreed(resp);
                let ending = ending::Ending::for_protocol(upgrade, protocol);
                tap = Some(RelayTap::new(recorder, observer, relayed.required).ending_with(ending))
            }
            None => {
                let e = format!(
                    "cannot follow the relayed protocol {}",
                    protocol.unwrap_or("(none named)")
                );
                warn!(session = relayed.session_id, error = %e, "the relayed session cannot be recorded");
                if relayed.required {
                    refusal = Some(e.clone());
                }
                relayed.recording_error = Some(e);
            }
        }
    }
    // Without a recording, an audited exec or attach is still followed for its exit code: its
    // error stream alone, the other streams' payloads passed over unread.
    if let (None, Some(_)) = (&tap, &state.audit) {
        if relayed.target.is_remote_command() {
            let (upgrade, protocol) = agreed(resp);
            let ending = ending::Ending::for_protocol(upgrade, protocol);
            tap = observer_for(state, resp, Scope::ErrorStream)
                .map(|observer| RelayTap::observing(observer).ending_with(ending));
        }
    }
    (tap, refusal)
}

/// The audit log's name for the path a relay of `kind` takes.
fn protocol_path(kind: SessionKind) -> ProtocolPath {
    match kind {
        SessionKind::SpdyRelay => ProtocolPath::RelaySpdy,
        SessionKind::PassThrough => ProtocolPath::PassThrough,
        _ => ProtocolPath::RelayWebsocket,
    }
}

/// Refuses a session the upstream agreed to that cannot be recorded under
/// `--record=required` (`e`: why), before a byte is relayed.
fn refuse_unrecordable(running: Running, e: String) -> Response<ProxyBody> {
    let refusal = unrecordable_response(&e);
    running.unstarted(
        SessionOutcome::RecordingFailed,
        audit::REFUSED_UNRECORDABLE,
        Some(e),
    );
    refusal
}

/// An upstream answer other than 101, which is not a session: refused with a 502 where the
/// client could not be given it, otherwise streamed through as it comes, the slot back now.
fn not_switched(
    state: &ProxyState,
    relayed: Relayed,
    resp: Response<ProxyBody>,
    running: Running,
) -> Response<ProxyBody> {
    let status = resp.status().as_u16();
    state
        .metrics
        .upstream_upgrade_failure(state.cluster.metrics_label(), status);
    if !answer::may_pass_refusal(relayed.client_stream.form, resp.status()) {
        let e = format!(
            "the upstream answered the WebSocket upgrade with {status} instead of switching protocols"
        );
        running.upstream_refused(e.clone(), status);
        return failure(StatusCode::BAD_GATEWAY, "BadGateway", e);
    }
    running.upstream_refused(format!("upstream answered {status}"), status);
    let (mut parts, body) = resp.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}

/// Starts a session the upstream switched protocols for: what the client is told is checked
/// (on HTTP/2 the upstream's accept), the upstream's connection is taken over, and the relay
/// runs in the background ([`RelaySession::run`]); the answer for the client.
async fn start_session(
    state: &ProxyState,
    relayed: Relayed,
    mut resp: Response<ProxyBody>,
    running: Running,
    tap: Option<RelayTap>,
) -> Response<ProxyBody> {
    // The audit log lists a port-forward's connections (kubectl ≤ 1.30's SPDY, the tunnel's
    // WebSocket passed through, the legacy WebSocket one): the relay shows its bytes to a
    // watch. Without the log nothing looks at them.
    let watch = running
        .audit_info()
        .filter(|info| info.verb == Verb::PortForward)
        .and_then(|_| port_forward_watch(&resp))
        .map(|watch| watch.charging(state.session_memory().lane()));
    let upgraded_to_websocket = resp
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"));
    // What the client will be told; on HTTP/2 only once the upstream's accept checks out.
    let answer = match answer::accepted(
        relayed.client_stream.form,
        relayed.sent_key.as_ref(),
        std::mem::take(resp.headers_mut()),
    ) {
        Ok(answer) => answer,
        Err(e) => {
            state
                .metrics
                .upstream_upgrade_failure(state.cluster.metrics_label(), 101);
            running.upstream_refused(e.to_string(), 101);
            return failure(StatusCode::BAD_GATEWAY, "BadGateway", e.to_string());
        }
    };
    let handshake_timeout = state.handshake_timeout;
    let upstream_io =
        match tokio::time::timeout(handshake_timeout, hyper::upgrade::on(&mut resp)).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                running.upstream_refused(e.to_string(), 101);
                return RelayError::Http(e).response();
            }
            Err(_) => {
                let e = RelayError::Timeout(handshake_timeout);
                running.upstream_refused(e.to_string(), 101);
                return e.response();
            }
        };
    let on_upgrade = relayed.on_upgrade;
    let upstream_hangup = resp.extensions().get::<UpstreamSocket>().map(|s| s.0);
    let session = RelaySession {
        upstream_hangup,
        user: relayed.caller.user().map(str::to_owned),
        linger: state.session_limits.close_drain_timeout,
        // A relayed WebSocket (pass-through, legacy protocols, logs) can be pinged between the
        // upstream's frames; SPDY cannot from outside its session.
        keepalive: state.client_keepalive.filter(|_| upgraded_to_websocket),
        // A followed log may rightly be quiet for hours; the kubelet's idle timeout spares it
        // too.
        idle_timeout: state
            .stream_idle_timeout
            .filter(|_| !relayed.path.ends_with("/log")),
        handshake_timeout,
        path: relayed.path,
        kind: relayed.kind,
        session_id: relayed.session_id,
        recording_error: relayed.recording_error,
        client_stream: relayed.client_stream,
        tap,
        watch,
        running,
    };
    // The session's log lines name the request they came from (its audit id). Boxed: the task
    // then moves a pointer, not the session's whole state, each time tokio moves it.
    tokio::spawn(Box::pin(session.run(on_upgrade, upstream_io)).in_current_span());
    answer
}

/// The TCP socket under the connection an upstream answer came on, as the answer's extension:
/// once the connection is upgraded, a relay that holds the upstream's reads back (for its
/// recording) looks there for the upstream's hang-up. It names the socket the upgraded
/// connection keeps, so it is looked at only while that connection lives (inside the relay).
#[derive(Debug, Clone, Copy)]
struct UpstreamSocket(PeerHangup);

/// Dials the upstream (`--upstream-dial-timeout`) and sends the request; its answer's head
/// must arrive within `--handshake-timeout`.
pub(in crate::proxy::sessions) async fn ask_upstream(
    state: &ProxyState,
    req: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>, RelayError> {
    let io = state.cluster.upstream.connect_raw().await?;
    let socket = UpstreamSocket(PeerHangup::of(io.tcp()));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // Drives the connection: the response body (if it is not a 101) or the upgrade hand-over.
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "relayed upstream connection ended with an error");
        }
    });
    let timeout = state.handshake_timeout;
    match tokio::time::timeout(timeout, sender.send_request(req)).await {
        Ok(answer) => {
            let mut answer = answer?;
            answer.extensions_mut().insert(socket);
            Ok(answer)
        }
        Err(_) => Err(RelayError::Timeout(timeout)),
    }
}

/// The request for the upstream: the client's headers minus hop-by-hop ones (but keeping the
/// upgrade), the upstream's Host, `X-Forwarded-For` and what the auth mode says.
pub(in crate::proxy::sessions) fn upstream_request(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
) -> Result<Request<Full<Bytes>>, RelayError> {
    let (parts, body) = (&req.parts, req.body.clone());
    let upstream = &state.cluster.upstream;
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
    set_forwarding_headers(&mut headers, stream.peer.ip(), state.trust_forwarded_for);
    state.cluster.auth.apply(&stream.caller, &mut headers);
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
/// says, if its protocol can be followed; what it buffers is held from the session's memory.
fn observer_for<B>(state: &ProxyState, resp: &Response<B>, scope: Scope) -> Option<Observer> {
    let (upgrade, sub) = agreed(resp);
    Observer::with_scope(upgrade, sub, scope).map(|o| o.charging(state.session_memory().lane()))
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
