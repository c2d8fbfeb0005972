//! The main listener: client connections (HTTP/1.1 or HTTP/2, plain or TLS) within their
//! clocks, each request classified once and handed to the translator, the tunnel, the relay
//! or the reverse proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::service_fn;
use tracing::debug;

use std::time::Instant;

use super::extended_connect;
use crate::audit::ProtocolPath;
use crate::proxy::auth::{Caller, PeerCertificate};
use crate::proxy::client::connection_deadline::{Activity, Expiry, InFlightBody};
use crate::proxy::client::request_layers;
use crate::proxy::client::upgrade_request::{
    UpgradeRequest, UpgradeRequestError, MAX_UPGRADE_BODY,
};
use crate::proxy::client::waiting_connections::Waiter;
use crate::proxy::observability::metrics::ConnectionShed;
use crate::proxy::observability::metrics::HandshakeRejection;
use crate::proxy::route::classify::{classify, Class, RelayKind};
use crate::proxy::route::stream_request::{is_followed_log, StreamRequest, StreamTarget};
use crate::proxy::sessions::forward::forward;
use crate::proxy::sessions::pass_through;
use crate::proxy::sessions::registry::{next_session_id, Refusal, SessionSlot};
use crate::proxy::sessions::relay::relay;
use crate::proxy::sessions::reverse_handler;
use crate::proxy::sessions::session_audit::{self, AuditedBody, SessionClient};
use crate::proxy::sessions::spdy_auto;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::upstream::streaming::UpstreamStreaming;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::client_stream::{ConnectionId, HandshakeForm};
use crate::proxy::wire::headers::caller_address;
use crate::proxy::wire::maybe_tls::MaybeTls;
use crate::proxy::wire::status_response::failure;
use crate::request::target::RequestTarget;
use crate::translate::exec_options::Subresource;
use crate::translate::subprotocol::BearerToken;

/// Receive window of one HTTP/2 stream: how much a client may send on one stream (one
/// session) that the proxy has not yet read. A session whose upstream stops reading, or whose
/// memory lane makes it wait, holds this much in hyper's buffer besides what it holds itself:
/// memory no budget sees, for every session at once, so it is kept to HTTP/2's own default
/// (the 256 KiB kube-apiserver uses was 500 MiB for the manifests' 2,000 sessions).
pub const H2_STREAM_WINDOW: u32 = 64 * 1024;

/// Most concurrent streams (sessions and plain requests) on one HTTP/2 connection.
pub const H2_MAX_STREAMS: u32 = 128;

/// Receive window of a whole HTTP/2 connection: room for every stream's full window, so that
/// however many of its sessions stall, the others still have window to receive in (a stalled
/// stream can never starve its siblings of connection window). The most a client can make the
/// proxy buffer on one connection (8 MiB).
pub const H2_CONNECTION_WINDOW: u32 = H2_STREAM_WINDOW * H2_MAX_STREAMS;

/// Serves `listener` until `shutdown` turns true; running connections finish on their own.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Running out of file descriptors must not end the proxy.
                debug!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        if let Some(idle) = state.tcp_keepalive {
            crate::proxy::wire::tcp_keepalive::enable(&tcp, idle);
        }
        tokio::spawn(serve_connection(tcp, peer, state.clone(), shutdown.clone()));
    }
}

/// One client connection: the TLS handshake (if any), then HTTP/1.1 or HTTP/2, within the
/// connection's clocks ([`connection_deadline`](crate::proxy::client::connection_deadline)). When the proxy
/// starts draining (`shutdown`), an HTTP/2 connection gets a GOAWAY: no new streams, while
/// its running sessions go on to their end (or the drain timeout).
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    shutdown: watch::Receiver<bool>,
) {
    // The request-header clock starts at the accept: the TLS handshake counts against it, and
    // the connection waits for a head (`--max-pending-connections`) from here.
    let first_request_by = tokio::time::Instant::now() + state.request_header_timeout;
    let waiting = state.waiting_connections.join();
    let clocks = Clocks {
        first_request_by,
        waiter: waiting.waiter(),
    };
    let Some((io, certificate)) = handshake(tcp, peer, &state, &clocks).await else {
        return;
    };
    let conn = Arc::new(Connection {
        peer,
        certificate,
        id: ConnectionId::next(),
        activity: Activity::counted(clocks.waiter.clone()),
    });
    serve_http(io, conn, state, shutdown, &clocks).await;
}

/// The clocks a connection runs on from its accept: its first request head is due by
/// `first_request_by`, and while no request is in flight it waits among the pending
/// connections (`--max-pending-connections`), where `waiter` may be evicted.
struct Clocks {
    first_request_by: tokio::time::Instant,
    waiter: Arc<Waiter>,
}

/// The connection's stream and its client certificate: TLS when configured, its handshake
/// within the request-header clock. `None` when the connection is dropped instead (handshake
/// failed or timed out, or evicted while waiting), each counted as a shed connection.
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    state: &ProxyState,
    clocks: &Clocks,
) -> Option<(ClientIo, PeerCertificate)> {
    let Some(acceptor) = &state.tls else {
        return Some((ClientIo::Plain(tcp), PeerCertificate::None));
    };
    let handshake = tokio::time::timeout_at(clocks.first_request_by, acceptor.accept(tcp));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        () = clocks.waiter.evicted() => {
            shed_waiting(state, peer);
            return None;
        }
    };
    match handshake {
        Ok(Ok(stream)) => {
            let certificate = peer_certificate(&stream, peer, state);
            Some((ClientIo::Tls(Box::new(stream)), certificate))
        }
        Ok(Err(e)) => {
            debug!(error = %e, %peer, "TLS handshake failed");
            state
                .metrics
                .connection_shed(ConnectionShed::TlsHandshakeFailed);
            None
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            state
                .metrics
                .connection_shed(ConnectionShed::RequestHeaderTimeout);
            None
        }
    }
}

/// HTTP/1.1 or HTTP/2 on an established connection, each request routed as one in flight
/// (the idle clock stopped), until the connection ends, one of its clocks runs out or the
/// proxy drains. The connection is closed (dropped) by returning.
async fn serve_http(
    io: ClientIo,
    conn: Arc<Connection>,
    state: Arc<ProxyState>,
    mut shutdown: watch::Receiver<bool>,
    clocks: &Clocks,
) {
    let (peer, activity) = (conn.peer, conn.activity.clone());
    let service = {
        let state = state.clone();
        let metrics = state.metrics.clone();
        TowerToHyperService::new(request_layers::wrap(
            service_fn(move |req| {
                let in_flight = conn.activity.request_started();
                let state = state.clone();
                let conn = conn.clone();
                async move {
                    let resp = route(state, req, &conn).await;
                    Ok::<_, Infallible>(resp.map(|body| InFlightBody::new(body, in_flight)))
                }
            }),
            metrics,
        ))
    };
    let builder = http_builder(&state);
    let served = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(served);
    let mut closing = false;
    let mut draining = false;
    loop {
        tokio::select! {
            stop = shutdown.wait_for(|stop| *stop).map(|r| r.is_ok()), if !draining => {
                draining = true;
                // (A dropped sender is no signal.) HTTP/2: GOAWAY; an idle HTTP/1.1
                // keep-alive connection is closed, one with a request in flight after it.
                if stop {
                    served.as_mut().graceful_shutdown();
                }
            }
            result = served.as_mut() => return connection_ended(&state, peer, result),
            () = clocks.waiter.evicted() => return shed_waiting(&state, peer),
            expiry = activity.expired(clocks.first_request_by, state.idle_connection_timeout) => {
                if closing {
                    // Told to close a whole idle period ago and still there: cut.
                    return;
                }
                shed_expired(&state, peer, expiry);
                if expiry == Expiry::FirstRequest {
                    // Nothing to say to a peer that never asked anything.
                    return;
                }
                // HTTP/2 gets a GOAWAY, an idle HTTP/1.1 connection is closed; a request that
                // slipped in meanwhile still finishes.
                served.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// hyper's settings for a client connection: the request head's time and size limits, and
/// HTTP/2's windows and stream limit (with WebSockets over HTTP/2 when enabled).
fn http_builder(state: &ProxyState) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(state.request_header_timeout)
        .max_buf_size(state.max_request_header_bytes);
    let mut http2 = builder.http2();
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(state.max_request_header_bytes).unwrap_or(u32::MAX))
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_concurrent_streams(H2_MAX_STREAMS);
    if state.http2_websockets {
        // SETTINGS_ENABLE_CONNECT_PROTOCOL = 1: clients may open WebSockets as streams
        // (RFC 8441). Without it h2 refuses any `:protocol` itself.
        http2.enable_connect_protocol();
    }
    builder
}

/// The end of a connection hyper served to its end or to an error; an error is logged, and
/// counted when it is hyper's own request-header timer that ran out.
fn connection_ended(
    state: &ProxyState,
    peer: SocketAddr,
    result: Result<(), Box<dyn std::error::Error + Send + Sync>>,
) {
    if let Err(e) = result {
        // hyper's own header timer may beat ours to a slow request head.
        let header_timeout = e
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout);
        if header_timeout {
            state
                .metrics
                .connection_shed(ConnectionShed::RequestHeaderTimeout);
        }
        debug!(error = %e, %peer, "client connection ended with an error");
    }
}

/// Counts (and logs) a connection whose first request head or idle period ran out; the caller
/// then drops it or asks it to close.
fn shed_expired(state: &ProxyState, peer: SocketAddr, expiry: Expiry) {
    debug!(%peer, reason = expiry.label(), "closing the client connection");
    state.metrics.connection_shed(match expiry {
        Expiry::FirstRequest => ConnectionShed::RequestHeaderTimeout,
        Expiry::Idle => ConnectionShed::IdleTimeout,
    });
}

/// Counts a connection shed because it had waited longest for a request head while more than
/// `--max-pending-connections` waited; it is closed (dropped) by returning.
fn shed_waiting(state: &ProxyState, peer: SocketAddr) {
    debug!(%peer, "closing the client connection: --max-pending-connections reached, it had waited longest");
    state
        .metrics
        .connection_shed(ConnectionShed::PendingConnectionLimit);
}

/// The client's side of a connection: plain TCP or TLS.
pub type ClientIo = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

/// One client connection, as every request on it sees it.
#[derive(Debug)]
pub struct Connection {
    /// The client's address.
    pub peer: SocketAddr,
    /// What the verified client certificate says, if one was presented.
    pub certificate: PeerCertificate,
    /// Its number in logs.
    pub id: ConnectionId,
    /// Its requests in flight (the idle clock); an HTTP/2 session counts as one while it runs.
    pub activity: Arc<Activity>,
}

/// What the verified client certificate (`--client-ca-file`) of a connection says. A refused
/// one is logged here (aggregated with others); each request on it is then refused with 401.
fn peer_certificate(
    stream: &tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
    state: &ProxyState,
) -> PeerCertificate {
    let Some(leaf) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    else {
        return PeerCertificate::None;
    };
    let certificate = PeerCertificate::from_leaf(leaf);
    if let PeerCertificate::Refused(why) = &certificate {
        state.auth.log_refused_certificate(why, peer);
    }
    certificate
}

/// Classifies a request, authenticates its caller (`--auth-mode`) and runs its handler.
/// Streaming sessions are admitted first (`--max-sessions`, draining); plain requests are
/// counted with their latency.
pub async fn route(
    state: Arc<ProxyState>,
    req: Request<Incoming>,
    conn: &Connection,
) -> Response<ProxyBody> {
    // `Err` is an answer too: a refusal by authentication.
    route_authenticated(state, req, conn)
        .await
        .unwrap_or_else(|refusal| refusal)
}

async fn route_authenticated(
    state: Arc<ProxyState>,
    mut req: Request<Incoming>,
    conn: &Connection,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    // An HTTP/2 WebSocket (extended CONNECT) takes the HTTP/1.1 upgrade's form here, so that
    // everything below is one code path for both.
    if let Err(refusal) = extended_connect::normalize(&mut req) {
        state
            .metrics
            .handshake_rejected(HandshakeRejection::BadRequest);
        let (code, reason) = refusal.status();
        return Ok(failure(code, reason, refusal.to_string()));
    }
    // The one reading of the target, as kube-apiserver will act on it: everything below
    // (classification, audit, recording, what goes upstream) uses it.
    let target = match RequestTarget::parse(req.uri().path(), req.uri().query()) {
        Ok(target) => target,
        Err(e) => return Ok(bad_request(&state, e.to_string())),
    };
    let upgrade = match classify(req.method(), &target, req.headers()) {
        Class::BadRequest(reason) => return Ok(bad_request(&state, reason)),
        Class::Forward => return forward_request(&state, req, conn, &target).await,
        Class::Translate {
            bearer,
            subresource,
        } => Upgrade {
            bearer,
            session: Session::Translate(subresource),
        },
        Class::Tunnel { bearer, protocols } => Upgrade {
            bearer,
            session: Session::Tunnel(protocols),
        },
        Class::Relay { kind, bearer } => Upgrade {
            bearer,
            session: Session::Relay(kind),
        },
    };
    // Boxed: a session's setup is the largest state a request can have (10-15 KB), and the
    // request's future is moved by every service layer; plain requests need not carry it.
    Box::pin(open_session(state, req, conn, &target, upgrade)).await
}

/// Counts a request refused as malformed before anything was done for it, and answers it
/// with 400 and a Kubernetes Status.
fn bad_request(state: &ProxyState, why: impl Into<String>) -> Response<ProxyBody> {
    state
        .metrics
        .handshake_rejected(HandshakeRejection::BadRequest);
    failure(StatusCode::BAD_REQUEST, "BadRequest", why)
}

/// A plain request (no upgrade): its caller authenticated, then forwarded and counted with its
/// latency, or, when audited, a followed pod log audited as a session. `Err` is the refusal
/// by authentication.
async fn forward_request(
    state: &ProxyState,
    mut req: Request<Incoming>,
    conn: &Connection,
    target: &RequestTarget,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    let caller = authenticate(state, req.headers(), None, conn).await?;
    let method = req.method().clone();
    let started = Instant::now();
    if state.audit.is_some() && is_followed_log(&method, target) {
        if let Err(why) = canonical_target(&mut req, target) {
            return Ok(failure(StatusCode::BAD_REQUEST, "BadRequest", why));
        }
        return Ok(followed_log(state, req, conn.peer, &caller, target).await);
    }
    let resp = forward(state, req, conn.peer, &caller).await;
    state
        .metrics
        .request(&method, resp.status().as_u16(), started.elapsed());
    Ok(resp)
}

/// A request classified as a streaming session: the handler it goes to, and the bearer token
/// its WebSocket subprotocol carried (if any).
struct Upgrade {
    bearer: Option<BearerToken>,
    session: Session,
}

/// A streaming session, in the order that keeps the proxy from holding what it should not:
/// the target made canonical, the caller authenticated (from the headers alone, so that in the
/// modes that authenticate, a caller without credentials makes the proxy hold no body), the
/// request's body read, and only then one of the `--max-sessions` slots taken for its handler.
/// `Err` is the refusal by authentication.
async fn open_session(
    state: Arc<ProxyState>,
    mut req: Request<Incoming>,
    conn: &Connection,
    target: &RequestTarget,
    upgrade: Upgrade,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    // What is audited and recorded is what goes upstream.
    if let Err(why) = canonical_target(&mut req, target) {
        return Ok(bad_request(&state, why));
    }
    let caller = authenticate(&state, req.headers(), upgrade.bearer, conn).await?;
    let req = match read_upgrade_request(&state, req, conn).await {
        Ok(req) => req,
        Err(resp) => return Ok(resp),
    };
    let slot = match state.sessions.admit() {
        Ok(slot) => slot,
        Err(refusal) => return Ok(refuse(&state, refusal)),
    };
    let stream = StreamRequest {
        target: StreamTarget::read(target),
        caller,
        peer: conn.peer,
        client: req.client,
        audit_id: request_layers::audit_id(&req.parts.headers),
    };
    let form = req.client.form;
    state.metrics.session_admitted(form);
    // An HTTP/1.1 upgrade takes its connection away from hyper; an HTTP/2 one is a stream the
    // connection must stay open for: it is busy (never idle-closed) until the session ends.
    let slot = slot
        .holding((form == HandshakeForm::ExtendedConnect).then(|| conn.activity.request_started()));
    Ok(run_session(state, req, stream, upgrade.session, slot).await)
}

/// Everything a streaming request carries, read within the handshake timeout and against the
/// shared body budget; or the answer refusing it (503 with Retry-After when over budget).
async fn read_upgrade_request(
    state: &ProxyState,
    req: Request<Incoming>,
    conn: &Connection,
) -> Result<UpgradeRequest, Response<ProxyBody>> {
    UpgradeRequest::read(
        req,
        conn.id,
        MAX_UPGRADE_BODY,
        state.handshake_timeout,
        &state.upgrade_body_budget,
    )
    .await
    .map_err(|e| {
        state.metrics.handshake_rejected(match e {
            UpgradeRequestError::OverBudget => HandshakeRejection::Busy,
            _ => HandshakeRejection::BadRequest,
        });
        let (code, reason) = e.status();
        let mut resp = failure(code, reason, e.to_string());
        if code == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        resp
    })
}

/// Runs an admitted session in its handler, holding its slot until it ends.
async fn run_session(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    session: Session,
    slot: SessionSlot,
) -> Response<ProxyBody> {
    match session {
        // `--upstream-streaming` decides whether these are translated or passed through.
        Session::Translate(subresource) => {
            let streamed = pass_through::Streamed::RemoteCommand(subresource);
            pass_through::handle(state.clone(), req, stream, streamed, slot).await
        }
        Session::Tunnel(protocols) => {
            let streamed = pass_through::Streamed::Tunnel(protocols);
            pass_through::handle(state.clone(), req, stream, streamed, slot).await
        }
        // SPDY exec/attach/port-forward: relayed, or translated to WebSocket where the
        // upstream takes only that (`websocket`, or `auto` once SPDY was refused).
        Session::Relay(RelayKind::Spdy) => {
            match (
                state.upstream_streaming,
                stream.target.streaming_subresource(),
            ) {
                (UpstreamStreaming::WebSocket, Some(_)) => {
                    reverse_handler::handle(state.clone(), req, stream, slot).await
                }
                (UpstreamStreaming::Auto, Some(subresource)) => {
                    spdy_auto::handle(state.clone(), req, stream, subresource, slot).await
                }
                _ => relay(&state, req, stream, RelayKind::Spdy, slot).await,
            }
        }
        Session::Relay(kind) => relay(&state, req, stream, kind, slot).await,
    }
}

/// Makes a streaming request's URI the canonical form of `target`, so that the upstream acts on
/// exactly what the proxy classified, audits and records (`%65xec` goes upstream as `exec`,
/// a dropped `;` pair is not sent at all). A target Go would read as bytes that are not UTF-8
/// is refused: no pod, container or command the API server accepts has them.
fn canonical_target<B>(req: &mut Request<B>, target: &RequestTarget) -> Result<(), &'static str> {
    if !target.is_utf8() {
        return Err("the request path or query decodes to bytes that are not UTF-8");
    }
    if !target.is_rewritten() {
        return Ok(());
    }
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        target
            .canonical()
            .parse()
            .expect("a canonical target is a valid path and query"),
    );
    *req.uri_mut() = http::Uri::from_parts(parts).expect("only the path and query changed");
    debug!(
        canonical = target.canonical(),
        "streaming request target rewritten to its canonical form"
    );
    Ok(())
}

/// A followed pod log over plain HTTP (`kubectl logs -f`), forwarded as any request and
/// audited as a session from the request to the end of its body.
async fn followed_log(
    state: &ProxyState,
    req: Request<Incoming>,
    peer: SocketAddr,
    caller: &Caller,
    target: &RequestTarget,
) -> Response<ProxyBody> {
    let method = req.method().clone();
    let http_version = req.version();
    let started = Instant::now();
    let audit_id = request_layers::audit_id(req.headers());
    // The credentials as they go upstream: in passthrough mode, the caller's own.
    let credentials = req.headers().get(http::header::AUTHORIZATION).cloned();
    let (resp, identity) = tokio::join!(
        forward(state, req, peer, caller),
        session_audit::identify(state, caller, credentials),
    );
    state
        .metrics
        .request(&method, resp.status().as_u16(), started.elapsed());
    let audit = session_audit::start(
        state,
        session_audit::session_info(
            next_session_id(),
            &StreamTarget::read(target),
            SessionClient::new(peer, http_version),
            identity,
            ProtocolPath::Http,
            None,
            audit_id,
        ),
    );
    AuditedBody::wrap(resp, audit)
}

/// The streaming handler a classified upgrade goes to.
enum Session {
    Translate(Subresource),
    Tunnel(Vec<String>),
    Relay(RelayKind),
}

/// Who the caller is, or the refusal to send (401, 403 or 503 with a Status).
async fn authenticate(
    state: &ProxyState,
    headers: &http::HeaderMap,
    bearer: Option<BearerToken>,
    conn: &Connection,
) -> Result<Caller, Response<ProxyBody>> {
    state
        .auth
        .authenticate(
            headers,
            bearer,
            &conn.certificate,
            caller_address(headers, conn.peer.ip(), state.trust_forwarded_for),
        )
        .await
        .map_err(|rejection| {
            state.metrics.auth_rejected(rejection.label());
            state.auth.log_rejection(&rejection, conn.peer);
            rejection.response()
        })
}

/// The answer to a session the proxy will not start: 429 with Retry-After when full, 503
/// while draining, each with a Kubernetes Status.
fn refuse(state: &ProxyState, refusal: Refusal) -> Response<ProxyBody> {
    match refusal {
        Refusal::Full => {
            state
                .metrics
                .handshake_rejected(HandshakeRejection::TooManySessions);
            let mut resp = failure(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "kube-ws-proxy is at its session limit (--max-sessions); try again later",
            );
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            resp
        }
        Refusal::Draining => {
            state
                .metrics
                .handshake_rejected(HandshakeRejection::Draining);
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "kube-ws-proxy is shutting down; retry on another replica",
            )
        }
    }
}
