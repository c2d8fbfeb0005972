//! v5 exec/attach and the port-forward tunnel under `--upstream-streaming websocket|auto`: once
//! the session has begun (identified, recorded, audited), the client's WebSocket upgrade goes
//! upstream unchanged (its bearer subprotocol entry turned into
//! credentials as `--auth-mode` says), and on the upstream's 101 the bytes are copied both ways
//! by the relay (src/proxy/sessions/relay/), which also applies the session limit, idle timeout,
//! drain, metrics, logs, audit and recording. No framing work is done on the way.
//!
//! Under `auto` a refusal that is not the cluster's Status (see [`after_refusal`]: an old
//! cluster's kubelet, a gateway) makes the SPDY translation ask once for this session; only an
//! upstream's 101 is remembered, so later sessions go to the path that last worked without
//! asking again for a while (src/proxy/upstream/streaming.rs).

use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::admission::remote_command_kind;
use super::exec_handler::{ExecStreams, Prepared, SetupError};
use super::lifecycle::end::Running;
use super::lifecycle::recording::unrecordable_status;
use super::lifecycle::start::{self, Begun, Held};
use super::relay::run::{ask_upstream, relay_answered, upstream_request, RelayError};
use super::state::ProxyState;
use super::{exec_handler, tunnel_handler};
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::ClientAnswer;
use crate::proxy::observability::metrics::SessionKind;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::error::reported;
use crate::proxy::upstream::refusal_body::{HeldRefusal, MAX_STATUS_BODY};
use crate::proxy::upstream::spdy_dial::DialError;
use crate::proxy::upstream::streaming::{
    after_first, after_refusal, after_second, log_decision, log_forgotten, AfterFirst, AfterSecond,
    Answer, ClientProtocol, RefusalAnswer, StreamFamily, UpstreamPath, UpstreamStreaming,
};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::spdy::upgrade::UpgradeError;
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
    fn family(&self) -> StreamFamily {
        match self {
            Streamed::RemoteCommand(_) => StreamFamily::RemoteCommand,
            Streamed::Tunnel(_) => StreamFamily::PortForward,
        }
    }
}

/// The client's offered subprotocols the upstream is offered: `v5.channel.k8s.io` alone for
/// exec/attach, the `SPDY/3.1+…k8s.io` entries for the tunnel (never the bearer entry).
pub(super) fn upstream_offer(family: StreamFamily, client: &HeaderMap) -> Vec<String> {
    client
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.starts_with(BEARER_PREFIX))
        .filter(|p| match family {
            StreamFamily::RemoteCommand => *p == ChannelProtocol::V5.name(),
            StreamFamily::PortForward => p.starts_with(TUNNEL_PREFIX) && p.ends_with(".k8s.io"),
        })
        .map(str::to_owned)
        .collect()
}

/// The upstream's answer to the client's upgrade.
enum Asked {
    /// 101 with a subprotocol the client offered.
    Accepted(Response<Incoming>),
    /// Any other answer, the beginning of its body read.
    Refused(HeldRefusal),
    /// A 101 the client could not use (no or another subprotocol, not a WebSocket).
    Unusable(String),
    /// No answer.
    Failed(RelayError),
}

impl Asked {
    /// How `auto` judges it.
    fn answer(&self) -> Answer {
        match self {
            Asked::Accepted(_) => Answer::Accepted,
            Asked::Refused(held) => held.answer().into(),
            Asked::Unusable(_) => Answer::Unrecognised,
            Asked::Failed(_) => Answer::NoAnswer,
        }
    }

    /// What the client hears when this refusal is its answer under `auto`.
    fn into_delivered(self) -> Delivered {
        match self {
            Asked::Refused(held) => Delivered::Replay(held),
            Asked::Unusable(why) => Delivered::BadGateway(why),
            Asked::Failed(e) => Delivered::Failed(e),
            Asked::Accepted(_) => Delivered::BadGateway("the upstream's 101 was not used".into()),
        }
    }
}

/// The SPDY translation's upstream, asked before the client is committed to it (`auto`).
enum Dialled {
    Exec(Result<ExecStreams, SetupError>),
    Tunnel(tunnel_handler::Dialled),
}

impl Dialled {
    /// How `auto` judges it: a 101 (streams that then failed to open included) is an accepted
    /// upgrade.
    fn answer(&self) -> Answer {
        let refused = |status: &StatusCode, headers: &HeaderMap, body: &[u8]| {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            Answer::from(after_refusal(status.as_u16(), content_type, body))
        };
        match self {
            Dialled::Exec(Ok(_)) | Dialled::Exec(Err(SetupError::Streams(_))) => Answer::Accepted,
            Dialled::Tunnel(Ok(_)) => Answer::Accepted,
            Dialled::Exec(Err(SetupError::Refused {
                status,
                headers,
                body,
            }))
            | Dialled::Tunnel(Err(DialError::Upgrade(UpgradeError::Refused {
                status,
                headers,
                body,
            }))) => refused(status, headers, body),
            Dialled::Exec(Err(SetupError::Unanswered(_))) | Dialled::Tunnel(Err(_)) => {
                Answer::NoAnswer
            }
        }
    }

    /// Lets go of it unused (the SPDY session is closed, the tunnel's connection dropped).
    async fn discard(self) {
        if let Dialled::Exec(Ok(streams)) = self {
            streams.conn.close().await;
        }
    }
}

/// Handles a v5 exec/attach or tunnel request as `--upstream-streaming` says, admitted as
/// `running`; `answer` is how its client is answered where the proxy answers it. Translated
/// alone under `spdy`; otherwise the session begins (the caller identified, an exec or
/// attach's recording opened, the audit trail started, saying `auto` where the upstream's
/// answers decide the path) and then, if it may go upstream, the upstream is asked.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    streamed: Streamed,
    answer: ClientAnswer,
    mut running: Running,
) -> Response<ProxyBody> {
    let setting = state.cluster.upstream_streaming;
    if setting == UpstreamStreaming::Spdy {
        return match streamed {
            Streamed::RemoteCommand(_) => {
                exec_handler::handle(state, req, stream, answer, running).await
            }
            Streamed::Tunnel(protocols) => {
                tunnel_handler::handle(state, req, stream, protocols, answer, running).await
            }
        };
    }
    let remembered = state.cluster.streaming_memory.recall(
        &state.cluster.upstream.authority(),
        streamed.family(),
        ClientProtocol::WebSocket,
        Instant::now(),
    );
    let translation_first =
        setting == UpstreamStreaming::Auto && remembered == Some(UpstreamPath::Spdy);
    // Under `auto` the `started` event says so; the `ended` event names the path taken.
    let path = match setting {
        UpstreamStreaming::Auto => ProtocolPath::Auto,
        _ => ProtocolPath::PassThrough,
    };
    let recording = start::begin(&state, &req, &stream, &mut running, path, None).await;
    let begun = match start::may_go_upstream(&running, &recording) {
        Ok(()) => Begun { running, recording },
        Err(Held::Unrecordable(why)) if matches!(streamed, Streamed::RemoteCommand(_)) => {
            // Told inside the WebSocket, as the translation tells it: kubectl then does not
            // fall back to a SPDY that would be refused the same way.
            let begun = Begun { running, recording };
            let prepared = Prepared::Refused(unrecordable_status(&why));
            return exec_handler::serve(state, req, stream, answer, begun, prepared).await;
        }
        Err(held) => return start::end_held(running, recording, held),
    };
    let session = PassThrough {
        state,
        req,
        stream,
        streamed,
        answer,
        begun,
    };
    if translation_first {
        return session.remembered_translation().await;
    }
    let asked = session.ask().await;
    if setting == UpstreamStreaming::Auto {
        return session.auto_after_pass_through(asked).await;
    }
    session.websocket(asked).await
}

/// A v5 exec/attach or tunnel whose session has begun, on its way upstream.
struct PassThrough {
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    streamed: Streamed,
    answer: ClientAnswer,
    begun: Begun,
}

impl PassThrough {
    /// `websocket`: the pass-through's answer is the session's: a 101 is carried, a refusal
    /// delivered.
    async fn websocket(self, asked: Asked) -> Response<ProxyBody> {
        let family = self.streamed.family();
        let delivered = match asked {
            Asked::Accepted(resp) => return self.carry(resp).await,
            Asked::Refused(held) if held.answer() == RefusalAnswer::Deliver => {
                Delivered::Replay(held)
            }
            Asked::Refused(held) => Delivered::Unsupported {
                why: format!(
                    "the upstream answered {} to the {} WebSocket upgrade",
                    held.status.as_u16(),
                    family.label()
                ),
                upstream_status: held.status.as_u16(),
            },
            Asked::Unusable(why) => Delivered::Unsupported {
                why,
                upstream_status: 101,
            },
            Asked::Failed(e) => Delivered::Failed(e),
        };
        self.deliver(delivered).await
    }

    /// Asks the upstream with the client's WebSocket upgrade, offering only what the
    /// translation would speak.
    async fn ask(&self) -> Asked {
        let (state, req) = (&self.state, &self.req);
        let mut upstream_req = match upstream_request(state, req, &self.stream) {
            Ok(upstream_req) => upstream_req,
            Err(e) => return Asked::Failed(e),
        };
        // Only what the translation would speak is offered: a client that also offers v4 must
        // not end up with a v4 session on an old cluster (which picks v4, and starts the
        // command, where the translation would have given it v5). Never empty: admission
        // checked it.
        let offer = upstream_offer(self.streamed.family(), &req.parts.headers);
        match HeaderValue::from_str(&offer.join(", ")) {
            Ok(v) if !offer.is_empty() => {
                upstream_req
                    .headers_mut()
                    .insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
            _ => {
                let why = "no WebSocket subprotocol to offer upstream".to_owned();
                return Asked::Failed(RelayError::Request(why));
            }
        }
        match ask_upstream(state, upstream_req).await {
            Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                match unusable(&offer, &resp) {
                    Some(why) => Asked::Unusable(why),
                    None => Asked::Accepted(resp),
                }
            }
            Ok(resp) => Asked::Refused(HeldRefusal::hold(resp, state.handshake_timeout).await),
            Err(e) => Asked::Failed(e),
        }
    }

    /// `auto`, the pass-through asked first: a 101 is served and learned; the cluster's Status
    /// is delivered; anything else makes the translation ask once, which is learned only if
    /// its upstream takes it. When both refuse, the client gets the cluster's Status if the
    /// translation's answer is one, else the pass-through's refusal as it came.
    async fn auto_after_pass_through(self, asked: Asked) -> Response<ProxyBody> {
        let family = self.streamed.family();
        match (after_first(false, asked.answer()), asked) {
            (AfterFirst::Serve, Asked::Accepted(resp)) => {
                learn(&self.state, family, UpstreamPath::PassThrough);
                self.carry(resp).await
            }
            (AfterFirst::TryOther { .. }, asked) => {
                if self.begun.running.client_gone() {
                    return self.client_gone();
                }
                let dialled = self.dial_translation().await;
                match after_second(dialled.answer()) {
                    // The translation's session or its Status; only a 101 is learned.
                    second @ (AfterSecond::Serve | AfterSecond::DeliverSecond) => {
                        if second == AfterSecond::Serve {
                            learn(&self.state, family, UpstreamPath::Spdy);
                        }
                        self.translate(dialled).await
                    }
                    AfterSecond::DeliverFirst => {
                        dialled.discard().await;
                        self.deliver(asked.into_delivered()).await
                    }
                }
            }
            (_, asked) => self.deliver(asked.into_delivered()).await,
        }
    }

    /// `auto`, the translation remembered: asked first. A 101 is served (and keeps the memory
    /// fresh), the cluster's Status delivered; an unrecognised refusal forgets the memory and
    /// asks the pass-through once, which is learned if its upstream takes it. When both
    /// refuse, the client gets the pass-through's Status if it is one, else the translation's
    /// refusal.
    async fn remembered_translation(self) -> Response<ProxyBody> {
        let family = self.streamed.family();
        let dialled = self.dial_translation().await;
        match after_first(true, dialled.answer()) {
            AfterFirst::Serve => {
                learn(&self.state, family, UpstreamPath::Spdy);
                return self.translate(dialled).await;
            }
            AfterFirst::Deliver => return self.translate(dialled).await,
            AfterFirst::TryOther { .. } => {}
        }
        let upstream = self.state.cluster.upstream.authority();
        if self
            .state
            .cluster
            .streaming_memory
            .forget(&upstream, family, UpstreamPath::Spdy)
        {
            log_forgotten(&upstream, family, UpstreamPath::Spdy);
        }
        if self.begun.running.client_gone() {
            dialled.discard().await;
            return self.client_gone();
        }
        let asked = self.ask().await;
        match (after_second(asked.answer()), asked) {
            (AfterSecond::Serve, Asked::Accepted(resp)) => {
                dialled.discard().await;
                learn(&self.state, family, UpstreamPath::PassThrough);
                self.carry(resp).await
            }
            (AfterSecond::DeliverSecond, asked) => {
                dialled.discard().await;
                self.deliver(asked.into_delivered()).await
            }
            // The translation's own refusal, as the translation reports it.
            _ => self.translate(dialled).await,
        }
    }

    /// Asks the upstream for the SPDY translation's session, as the handlers would.
    async fn dial_translation(&self) -> Dialled {
        let (state, req, stream) = (&*self.state, &self.req, &self.stream);
        match &self.streamed {
            Streamed::RemoteCommand(_) => {
                Dialled::Exec(exec_handler::dial(state, req, stream).await)
            }
            Streamed::Tunnel(protocols) => {
                Dialled::Tunnel(tunnel_handler::dial(state, req, stream, protocols.clone()).await)
            }
        }
    }

    /// The SPDY translation, on its upstream's answer `dialled`: the session is moved to the
    /// translated path.
    async fn translate(self, dialled: Dialled) -> Response<ProxyBody> {
        let PassThrough {
            state,
            req,
            stream,
            streamed,
            answer,
            mut begun,
        } = self;
        match (streamed, dialled) {
            (Streamed::RemoteCommand(subresource), Dialled::Exec(dialled)) => {
                let v5 = Some(ChannelProtocol::V5.name().to_owned());
                let kind = remote_command_kind(subresource);
                begun.running.took_path(kind, ProtocolPath::Translated, v5);
                let prepared = Prepared::Dialled(dialled);
                exec_handler::serve(state, req, stream, answer, begun, prepared).await
            }
            (_, Dialled::Tunnel(dialled)) => {
                let (kind, path) = (SessionKind::PortForwardTunnel, ProtocolPath::Tunnel);
                begun.running.took_path(kind, path, None);
                tunnel_handler::serve(state, req, stream, answer, begun.running, dialled).await
            }
            (Streamed::Tunnel(_), Dialled::Exec(_)) => unreachable!("a tunnel dials a tunnel"),
        }
    }

    /// Tells the client why the pass-through did not start: exec/attach inside the accepted
    /// WebSocket (a Status on channel 3, as the translation does, so that kubectl does not fall
    /// back to a SPDY its gateway drops), the tunnel as an HTTP answer (kube-apiserver replays
    /// it too, whole: the body streams through). Counted and audited as a pass-through.
    async fn deliver(self, delivered: Delivered) -> Response<ProxyBody> {
        let PassThrough {
            state,
            req,
            stream,
            streamed,
            answer,
            mut begun,
        } = self;
        state
            .metrics
            .upstream_upgrade_failure(state.cluster.metrics_label(), delivered.upstream_status());
        let (kind, path) = (SessionKind::PassThrough, ProtocolPath::PassThrough);
        begun.running.took_path(kind, path, None);
        if let Streamed::RemoteCommand(_) = streamed {
            let status = refusal_status(delivered, state.handshake_timeout).await;
            let prepared = Prepared::Refused(status);
            return exec_handler::serve(state, req, stream, answer, begun, prepared).await;
        }
        begun
            .running
            .upstream_refused(delivered.summary(), delivered.upstream_status());
        match delivered {
            Delivered::Replay(held) => held.into_response(),
            Delivered::Unsupported { why, .. } => {
                failure(StatusCode::BAD_GATEWAY, "BadGateway", unsupported(&why))
            }
            Delivered::BadGateway(why) => failure(StatusCode::BAD_GATEWAY, "BadGateway", why),
            Delivered::Failed(e) => e.response(),
        }
    }

    /// Starts the pass-through on the upstream's 101: the relay copies the bytes; exec/attach
    /// are recorded by following the v5 channels as it does for relayed v4.
    async fn carry(self, resp: Response<Incoming>) -> Response<ProxyBody> {
        let PassThrough {
            state,
            req,
            stream,
            mut begun,
            ..
        } = self;
        let (kind, path) = (SessionKind::PassThrough, ProtocolPath::PassThrough);
        begun.running.took_path(kind, path, None);
        let resp = Ok(resp.map(BodyExt::boxed));
        relay_answered(&state, req, stream, begun, resp).await
    }

    /// Ends the session: its client went before the second path was asked.
    fn client_gone(self) -> Response<ProxyBody> {
        let Begun { running, recording } = self.begun;
        start::end_held(running, recording, Held::ClientGone)
    }
}

/// Notes (under `auto`) that `path`'s upstream answered 101; logs a change of mind once.
fn learn(state: &ProxyState, family: StreamFamily, path: UpstreamPath) {
    let upstream = state.cluster.upstream.authority();
    if state
        .cluster
        .streaming_memory
        .learn(&upstream, family, path, Instant::now())
    {
        log_decision(&upstream, family, path);
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

/// A pass-through that did not start, as the client will hear it.
enum Delivered {
    /// The upstream's answer, passed on: the cluster's Status, or (`auto`, when the other path
    /// refused too) an answer that is not one.
    Replay(HeldRefusal),
    /// `websocket` against an upstream that does not serve the protocol.
    Unsupported { why: String, upstream_status: u16 },
    /// `auto`: a 101 the client could not use, and the translation did not work either.
    BadGateway(String),
    /// The upstream was not reached.
    Failed(RelayError),
}

impl Delivered {
    /// The upstream's status for the upgrade-failure metric (0: no answer).
    fn upstream_status(&self) -> u16 {
        match self {
            Delivered::Replay(held) => held.status.as_u16(),
            Delivered::Unsupported {
                upstream_status, ..
            } => *upstream_status,
            Delivered::BadGateway(_) => 101,
            Delivered::Failed(_) => 0,
        }
    }

    /// One line for the audit log.
    fn summary(&self) -> String {
        match self {
            Delivered::Replay(held) => format!("upstream answered {}", held.status.as_u16()),
            Delivered::Unsupported { why, .. } | Delivered::BadGateway(why) => why.clone(),
            Delivered::Failed(e) => e.to_string(),
        }
    }
}

/// The text of a `websocket` setting's refusal: what to change.
fn unsupported(why: &str) -> String {
    format!(
        "{why}: it does not serve this protocol itself (Kubernetes 1.31+ with \
         TranslateStreamCloseWebsocketRequests and PortForwardWebsockets does), and \
         kube-ws-proxy runs with --upstream-streaming=websocket; use auto or spdy for this \
         cluster"
    )
}

/// The Status an exec/attach client hears inside its WebSocket for a refusal.
async fn refusal_status(delivered: Delivered, timeout: std::time::Duration) -> Status {
    match delivered {
        Delivered::Replay(held) => {
            let code = held.status.as_u16();
            let content_type = held.content_type().map(str::to_owned);
            match held.whole_body(timeout).await {
                Some(body) => from_upgrade_refusal(code, content_type.as_deref(), &body),
                None => Status::failure(
                    code,
                    "InternalError",
                    format!(
                        "the upstream refused the upgrade with HTTP {code} and a body larger \
                         than {MAX_STATUS_BODY} bytes or slower than {timeout:?}"
                    ),
                ),
            }
        }
        Delivered::Unsupported { why, .. } => Status::failure(502, "BadGateway", unsupported(&why)),
        Delivered::BadGateway(why) => Status::failure(502, "BadGateway", why),
        Delivered::Failed(e) => Status::internal_error(&reported(&e)),
    }
}
