//! SPDY upgrades (kubectl ≤ 1.30) for exec, attach and port-forward under
//! `--upstream-streaming auto`: relayed unchanged where the path to the upstream carries SPDY,
//! translated to WebSocket ([`reverse_handler`]) where it refuses SPDY.
//!
//! The session begins before anything goes upstream (identified, recorded, audited: its
//! `started` event says `auto`, its `ended` event names the path taken). The client's upgrade then goes
//! upstream as the relay would send it, so a cluster that takes SPDY costs nothing extra. A refusal that is not the cluster's own answer ([`after_refusal`]: a
//! SPDY-dropping gateway's page, a bare 400) makes the reverse translator ask once for this
//! session; if its upstream takes it, the memory sends later ones there directly for a while.
//! A Kubernetes `Status` (401, 403, 404 …) is the cluster's answer and is delivered as the
//! relay delivers it.

use std::sync::Arc;
use std::time::Instant;

use http::{header, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::admission::reverse_kind;
use super::lifecycle::end::Running;
use super::lifecycle::start::{self, Begun, Held};
use super::relay::run::{ask_upstream, relay_answered, upstream_request, RelayError};
use super::reverse_handler;
use super::state::ProxyState;
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::SessionKind;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::refusal_body::HeldRefusal;
use crate::proxy::upstream::streaming::{
    after_first, after_refusal, after_second, log_decision, log_forgotten, AfterFirst, AfterSecond,
    Answer, ClientProtocol, StreamFamily, UpstreamPath,
};
use crate::proxy::upstream::websocket_dial::WebSocketDialError;
use crate::proxy::wire::body::ProxyBody;
use crate::translate::exec_options::Subresource;
use crate::translate::protocol::UpstreamVersion;

/// The upstream's answer to the client's SPDY upgrade, relayed.
enum Relayed {
    /// 101: the session is relayed.
    Accepted(Response<Incoming>),
    /// Any other answer, the beginning of its body read.
    Refused(HeldRefusal),
    /// No answer.
    Failed(RelayError),
}

impl Relayed {
    /// How `auto` judges it.
    fn answer(&self) -> Answer {
        match self {
            Relayed::Accepted(_) => Answer::Accepted,
            Relayed::Refused(held) => held.answer().into(),
            Relayed::Failed(_) => Answer::NoAnswer,
        }
    }
}

/// How `auto` judges the reverse translator's upstream answer: a 101 without the offered
/// subprotocol is a path that does not serve it.
fn reverse_answer(dialled: &reverse_handler::Dialled) -> Answer {
    match dialled {
        Ok(_) => Answer::Accepted,
        Err(WebSocketDialError::Refused {
            status,
            headers,
            body,
        }) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            after_refusal(status.as_u16(), content_type, body).into()
        }
        Err(WebSocketDialError::BadHandshake(_)) => Answer::Unrecognised,
        Err(_) => Answer::NoAnswer,
    }
}

/// Handles a SPDY exec, attach (`subresource`) or port-forward upgrade under `auto`, admitted
/// as `running`; `version` is what the reverse translator would speak with the client. The
/// session begins (the caller identified, an exec or attach's recording opened, the audit
/// trail started, saying `auto`); then, if it may go upstream, the relay is asked first unless
/// the reverse translator is remembered; a 101 is served and learned, the cluster's Status
/// delivered, anything else makes the other path ask once (learned only if its upstream takes
/// it). When both refuse, the client gets the cluster's Status if the second answer is one,
/// else the first refusal as it came.
pub async fn handle(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    subresource: Subresource,
    version: Option<UpstreamVersion>,
    mut running: Running,
) -> Response<ProxyBody> {
    let family = match subresource {
        Subresource::PortForward => StreamFamily::PortForward,
        _ => StreamFamily::RemoteCommand,
    };
    let upstream = state.cluster.upstream.authority();
    let remembered = state.cluster.streaming_memory.recall(
        &upstream,
        family,
        ClientProtocol::Spdy,
        Instant::now(),
    );
    // The `started` event says `auto`; the `ended` event names the path taken.
    let path = ProtocolPath::Auto;
    let recording = start::begin(&state, &req, &stream, &mut running, path, None).await;
    if let Err(held) = start::may_go_upstream(&running, &recording) {
        return start::end_held(running, recording, held);
    }
    let session = SpdyAuto {
        state,
        req,
        stream,
        subresource,
        version,
        begun: Begun { running, recording },
    };
    match remembered {
        Some(UpstreamPath::Reverse) => session.remembered_reverse(family).await,
        _ => session.relay_first(family).await,
    }
}

/// A SPDY exec, attach or port-forward under `auto` whose session has begun.
struct SpdyAuto {
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    subresource: Subresource,
    version: Option<UpstreamVersion>,
    begun: Begun,
}

impl SpdyAuto {
    /// The relay asked first: a 101 is served and learned, the cluster's Status delivered;
    /// anything else makes the reverse translator ask once.
    async fn relay_first(self, family: StreamFamily) -> Response<ProxyBody> {
        let relayed = self.ask_relay().await;
        match after_first(false, relayed.answer()) {
            AfterFirst::Serve => learn(&self.state, family, UpstreamPath::Relay),
            AfterFirst::Deliver => {}
            AfterFirst::TryOther { .. } => {
                if self.begun.running.client_gone() {
                    return self.client_gone();
                }
                let dialled = reverse_handler::dial(&self.state, &self.req, &self.stream).await;
                match after_second(reverse_answer(&dialled)) {
                    // The reverse translator's session or its Status; only a 101 is learned.
                    second @ (AfterSecond::Serve | AfterSecond::DeliverSecond) => {
                        if second == AfterSecond::Serve {
                            learn(&self.state, family, UpstreamPath::Reverse);
                        }
                        return self.reverse(dialled).await;
                    }
                    AfterSecond::DeliverFirst => drop(dialled),
                }
            }
        }
        self.relay(relayed).await
    }

    /// The reverse translator remembered: asked first. A 101 is served (and keeps the memory
    /// fresh), the cluster's Status delivered; an unrecognised refusal forgets the memory and
    /// asks the relay once, which is learned if its upstream takes it. When both refuse, the
    /// client gets the relay's Status if it is one, else the reverse translator's refusal.
    async fn remembered_reverse(self, family: StreamFamily) -> Response<ProxyBody> {
        let dialled = reverse_handler::dial(&self.state, &self.req, &self.stream).await;
        match after_first(true, reverse_answer(&dialled)) {
            AfterFirst::Serve => learn(&self.state, family, UpstreamPath::Reverse),
            AfterFirst::Deliver => {}
            AfterFirst::TryOther { .. } => {
                let upstream = self.state.cluster.upstream.authority();
                if self.state.cluster.streaming_memory.forget(
                    &upstream,
                    family,
                    UpstreamPath::Reverse,
                ) {
                    log_forgotten(&upstream, family, UpstreamPath::Reverse);
                }
                if self.begun.running.client_gone() {
                    drop(dialled);
                    return self.client_gone();
                }
                let relayed = self.ask_relay().await;
                match after_second(relayed.answer()) {
                    AfterSecond::Serve => learn(&self.state, family, UpstreamPath::Relay),
                    AfterSecond::DeliverSecond => {}
                    AfterSecond::DeliverFirst => return self.reverse(dialled).await,
                }
                return self.relay(relayed).await;
            }
        }
        self.reverse(dialled).await
    }

    /// Asks the upstream with the client's SPDY upgrade, as the relay sends it.
    async fn ask_relay(&self) -> Relayed {
        let state = &self.state;
        let upstream_req = match upstream_request(state, &self.req, &self.stream) {
            Ok(upstream_req) => upstream_req,
            Err(e) => return Relayed::Failed(e),
        };
        match ask_upstream(state, upstream_req).await {
            Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => Relayed::Accepted(resp),
            // Never a stream for these subresources: a refusal, its beginning read to decide on
            // it (the rest streams through if it is passed on).
            Ok(resp) => Relayed::Refused(HeldRefusal::hold(resp, state.handshake_timeout).await),
            Err(e) => Relayed::Failed(e),
        }
    }

    /// The session relayed, on the relay's answer: the session on a 101, else the answer as
    /// it came.
    async fn relay(self, relayed: Relayed) -> Response<ProxyBody> {
        let SpdyAuto {
            state,
            req,
            stream,
            mut begun,
            ..
        } = self;
        let (kind, path) = (SessionKind::SpdyRelay, ProtocolPath::RelaySpdy);
        begun.running.took_path(kind, path, None);
        let answer = match relayed {
            Relayed::Accepted(resp) => Ok(resp.map(BodyExt::boxed)),
            Relayed::Refused(held) => Ok(held.into_response()),
            Relayed::Failed(e) => Err(e),
        };
        relay_answered(&state, req, stream, begun, answer).await
    }

    /// The session reverse-translated, on its upstream's answer `dialled`.
    async fn reverse(self, dialled: reverse_handler::Dialled) -> Response<ProxyBody> {
        let SpdyAuto {
            state,
            req,
            stream,
            subresource,
            version,
            mut begun,
        } = self;
        let protocol = Some(reverse_handler::client_protocol(version));
        let kind = reverse_kind(subresource);
        begun
            .running
            .took_path(kind, ProtocolPath::ReverseTranslated, protocol);
        reverse_handler::serve(state, req, stream, version, begun, dialled).await
    }

    /// Ends the session: its client went before the second path was asked.
    fn client_gone(self) -> Response<ProxyBody> {
        let Begun { running, recording } = self.begun;
        start::end_held(running, recording, Held::ClientGone)
    }
}

/// Notes that `path`'s upstream answered 101; logs a change of mind once.
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
