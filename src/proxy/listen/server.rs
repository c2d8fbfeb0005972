//! The main listener: client connections (HTTP/1.1 or HTTP/2, plain or TLS) within their
//! clocks, each request classified once and handed to the translator, the tunnel, the relay
//! or the reverse proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tower::service_fn;
use tracing::debug;

use std::time::Instant;

use super::extended_connect;
use super::front_door::FrontDoor;
use crate::audit::ProtocolPath;
use crate::proxy::auth::{Caller, PeerCertificate};
use crate::proxy::client::connection_deadline::{Activity, Expiry, InFlightBody, RequestInFlight};
use crate::proxy::client::request_layers;
use crate::proxy::client::upgrade_request::{
    HeldBody, UpgradeRequest, UpgradeRequestError, MAX_UPGRADE_BODY,
};
use crate::proxy::client::waiting_connections::{Waiter, SHED_GRACE};
use crate::proxy::client::write_timeout::{Responses, Stalled, WatchedBody};
use crate::proxy::console;
use crate::proxy::observability::metrics::ConnectionShed;
use crate::proxy::observability::metrics::{HandshakeRejection, SessionKind};
use crate::proxy::route::by_host::{cluster_by_host, HostFields, HostUnrouted};
use crate::proxy::route::classify::{classify, Class};
use crate::proxy::route::fleet::Unrouted;
use crate::proxy::route::kubelet::{kubelet_call, KubeletRun};
use crate::proxy::route::sessions_api as sessions_api_path;
use crate::proxy::route::stream_request::{is_followed_log, StreamRequest, StreamTarget};
use crate::proxy::sessions::admission::{Admissible, Requested};
use crate::proxy::sessions::forward::forward;
use crate::proxy::sessions::kubelet_run::{self, RunRequest};
use crate::proxy::sessions::lifecycle::audit::{self, AuditedBody, SessionClient};
use crate::proxy::sessions::lifecycle::end::Running;
use crate::proxy::sessions::lifecycle::{gate, task};
use crate::proxy::sessions::pass_through;
use crate::proxy::sessions::registry::{next_session_id, Refusal};
use crate::proxy::sessions::relay::run::relay;
use crate::proxy::sessions::reverse_handler;
use crate::proxy::sessions::spdy_auto;
use crate::proxy::sessions::state::{ProxyState, Shared};
use crate::proxy::sessions_api;
use crate::proxy::sessions_api::discovery;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::client_stream::{ConnectionId, HandshakeForm};
use crate::proxy::wire::headers::caller_address;
use crate::proxy::wire::maybe_tls::MaybeTls;
use crate::proxy::wire::status_response::failure;
use crate::request::host::HostName;
use crate::request::node::{form_media_type, FormBody, KubeletCall};
use crate::request::target::RequestTarget;
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
    front: Arc<FrontDoor>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let state = front.shared().clone();
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
        tokio::spawn(serve_connection(tcp, peer, front.clone(), shutdown.clone()));
    }
}

/// One client connection: the TLS handshake (if any), then HTTP/1.1 or HTTP/2, within the
/// connection's clocks ([`connection_deadline`](crate::proxy::client::connection_deadline)). When the proxy
/// starts draining (`shutdown`), an HTTP/2 connection gets a GOAWAY: no new streams, while
/// its running sessions go on to their end (or the drain timeout).
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    front: Arc<FrontDoor>,
    shutdown: watch::Receiver<bool>,
) {
    let state = front.shared();
    // The request-header clock starts at the accept: the TLS handshake counts against it, and
    // the connection waits for a head (`--max-pending-connections`) from here.
    let first_request_by = tokio::time::Instant::now() + state.request_header_timeout;
    let waiting = state.waiting_connections.join();
    let clocks = Clocks {
        first_request_by,
        waiter: waiting.waiter(),
    };
    let Some((io, certificate, sni)) = handshake(tcp, peer, state, &clocks).await else {
        return;
    };
    let conn = Arc::new(Connection {
        peer,
        certificate,
        sni,
        id: ConnectionId::next(),
        activity: Activity::counted(clocks.waiter.clone()),
        responses: state.response_write_timeout.map(Responses::new),
    });
    serve_http(io, conn, front, shutdown, &clocks).await;
}

/// The clocks a connection runs on from its accept: its first request head is due by
/// `first_request_by`, and while no request is in flight it waits among the pending
/// connections (`--max-pending-connections`), where `waiter` may be evicted.
struct Clocks {
    first_request_by: tokio::time::Instant,
    waiter: Arc<Waiter>,
}

/// The connection's stream, its client certificate and the server name its TLS handshake
/// asked for (SNI): TLS when configured, its handshake within the request-header clock. `None`
/// when the connection is dropped instead (handshake failed or timed out, or evicted while
/// waiting), each counted as a shed connection.
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    state: &Shared,
    clocks: &Clocks,
) -> Option<(ClientIo, PeerCertificate, Option<HostName>)> {
    let Some(acceptor) = &state.tls else {
        return Some((ClientIo::Plain(tcp), PeerCertificate::None, None));
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
            // At most one bounded name per connection; one rustls took but we cannot read
            // names no cluster.
            let sni = stream
                .get_ref()
                .1
                .server_name()
                .and_then(|name| HostName::parse(name.as_bytes()).ok());
            Some((ClientIo::Tls(Box::new(stream)), certificate, sni))
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
    front: Arc<FrontDoor>,
    mut shutdown: watch::Receiver<bool>,
    clocks: &Clocks,
) {
    let (peer, activity) = (conn.peer, conn.activity.clone());
    let responses = conn.responses.clone();
    let state = front.shared().clone();
    let service = {
        let metrics = state.metrics.clone();
        TowerToHyperService::new(request_layers::wrap(
            service_fn(move |req: Request<Incoming>| {
                let in_flight = conn.activity.request_started();
                let http1 = req.version() < http::Version::HTTP_2;
                let front = front.clone();
                let conn = conn.clone();
                async move {
                    let resp = route(&front, req, &conn).await;
                    let responses = conn.responses.as_deref();
                    Ok::<_, Infallible>(outgoing(resp, in_flight, http1, responses))
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
    let mut shed: Option<ShedGrace> = None;
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
            () = clocks.waiter.evicted(), if shed.is_none() => {
                shed_waiting(&state, peer);
                // Closed where it can be (an HTTP/2 GOAWAY, an idle HTTP/1.1 connection closed,
                // a head that completes meanwhile answered with `Connection: close`), within a
                // bounded grace; cut at once when too many are closing already.
                let Some(room) = state.waiting_connections.grace() else {
                    return;
                };
                served.as_mut().graceful_shutdown();
                shed = Some(ShedGrace::new(room));
            }
            () = ShedGrace::over(shed.as_mut()) => {
                if !activity.has_request_in_flight() {
                    return;
                }
                // A request that came in the grace is served; the connection closes after it.
            }
            stalled = stalled(responses.as_deref()) => {
                // The response's body is gone already; HTTP/1.1 can carry nothing else.
                debug!(%peer, "a client took nothing of its response for --response-write-timeout");
                state.metrics.connection_shed(ConnectionShed::ResponseWriteTimeout);
                if stalled.http1 {
                    return;
                }
            }
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

/// A connection shed from the waiting ones while it closes gracefully: its room among those
/// closing, until [`SHED_GRACE`] is over.
struct ShedGrace {
    until: tokio::time::Instant,
    room: Option<OwnedSemaphorePermit>,
}

impl ShedGrace {
    fn new(room: OwnedSemaphorePermit) -> ShedGrace {
        ShedGrace {
            until: tokio::time::Instant::now() + SHED_GRACE,
            room: Some(room),
        }
    }

    /// Resolves once, when the grace is over (giving its room back); never without one.
    async fn over(grace: Option<&mut ShedGrace>) {
        match grace {
            Some(grace) if grace.room.is_some() => {
                tokio::time::sleep_until(grace.until).await;
                grace.room = None;
            }
            _ => std::future::pending().await,
        }
    }
}

/// A response as it goes to the client: its request in flight until its body ends, on the
/// connection's write clock when it has one.
fn outgoing(
    resp: Response<ProxyBody>,
    in_flight: RequestInFlight,
    http1: bool,
    responses: Option<&Responses>,
) -> Response<Either<WatchedBody<InFlightBody<ProxyBody>>, InFlightBody<ProxyBody>>> {
    resp.map(|body| {
        let body = InFlightBody::new(body, in_flight);
        match responses {
            Some(responses) => Either::Left(responses.watch(body, http1)),
            None => Either::Right(body),
        }
    })
}

/// Resolves when one of the connection's responses was cut for want of progress
/// ([`Responses::stalled`]); never without a write timeout.
async fn stalled(responses: Option<&Responses>) -> Stalled {
    match responses {
        Some(responses) => responses.stalled().await,
        None => std::future::pending().await,
    }
}

/// hyper's settings for a client connection: the request head's time and size limits, and
/// HTTP/2's windows and stream limit (with WebSockets over HTTP/2 when enabled).
fn http_builder(state: &Shared) -> auto::Builder<TokioExecutor> {
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
    state: &Shared,
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
fn shed_expired(state: &Shared, peer: SocketAddr, expiry: Expiry) {
    debug!(%peer, reason = expiry.label(), "closing the client connection");
    state.metrics.connection_shed(match expiry {
        Expiry::FirstRequest => ConnectionShed::RequestHeaderTimeout,
        Expiry::Idle => ConnectionShed::IdleTimeout,
    });
}

/// Counts a connection shed because it had waited longest for a request head while more than
/// `--max-pending-connections` waited; the caller then closes it (gracefully where it can).
fn shed_waiting(state: &Shared, peer: SocketAddr) {
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
    /// The server name its TLS handshake asked for (SNI), if any.
    pub sni: Option<HostName>,
    /// Its number in logs.
    pub id: ConnectionId,
    /// Its requests in flight (the idle clock); an HTTP/2 session counts as one while it runs.
    pub activity: Arc<Activity>,
    /// Its plain responses, on the write clock (`--response-write-timeout`).
    pub responses: Option<Arc<Responses>>,
}

/// What the verified client certificate (`--client-ca-file`) of a connection says. A refused
/// one is logged here (aggregated with others); each request on it is then refused with 401.
fn peer_certificate(
    stream: &tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
    state: &Shared,
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
        crate::proxy::auth::log_refused_certificate(&state.refused_certificate_log, why, peer);
    }
    certificate
}

/// Classifies a request, authenticates its caller (`--auth-mode`) and runs its handler.
/// Streaming sessions are admitted first (`--max-sessions`, draining); plain requests are
/// counted with their latency.
pub async fn route(
    front: &FrontDoor,
    mut req: Request<Incoming>,
    conn: &Connection,
) -> Response<ProxyBody> {
    let shared = front.shared();
    // An HTTP/2 WebSocket (extended CONNECT) takes the HTTP/1.1 upgrade's form here, so that
    // everything below is one code path for both.
    if let Err(refusal) = extended_connect::normalize(&mut req) {
        shared
            .metrics
            .unrouted_rejected(HandshakeRejection::BadRequest);
        let (code, reason) = refusal.status();
        return failure(code, reason, refusal.to_string());
    }
    let (state, target) = match to_cluster(front, &mut req, conn.sni.as_ref()) {
        Ok(routed) => routed,
        Err(answer) => return *answer,
    };
    // Every line the request and its session log from here names the cluster.
    tracing::Span::current().record("cluster", state.cluster.label());
    // `Err` is an answer too: a refusal by authentication.
    route_authenticated(state, req, conn, target)
        .await
        .unwrap_or_else(|refusal| refusal)
}

/// The one reading of the request's target, as kube-apiserver will act on it, and the cluster
/// it goes to (by its host under `--cluster-host-suffix`, checked against the connection's
/// `sni`, else by its path): everything after this (classification, audit, recording, what
/// goes upstream) uses that reading, without the cluster prefix, which is also taken off the
/// request itself. `Err`: the answer to a request that is refused (400), misdirected (421) or
/// names no cluster (404), boxed: it is the rare case.
fn to_cluster<B>(
    front: &FrontDoor,
    req: &mut Request<B>,
    sni: Option<&HostName>,
) -> Result<(Arc<ProxyState>, RequestTarget), Box<Response<ProxyBody>>> {
    let shared = front.shared();
    let by_host = match &shared.cluster_host_suffix {
        Some(suffix) => {
            let fields = HostFields {
                authority: req.uri().authority().map(|a| a.as_str().as_bytes()),
                host_headers: req
                    .headers()
                    .get_all(http::header::HOST)
                    .iter()
                    .map(|h| h.as_bytes()),
                http11: req.version() == http::Version::HTTP_11,
            };
            cluster_by_host(suffix, fields, sni).map_err(|e| unrouted(shared, e))?
        }
        None => None,
    };
    let (path, query) = (req.uri().path(), req.uri().query());
    let routed = RequestTarget::parse(path, query)
        .map_err(Unrouted::from)
        .and_then(|target| front.fleet().route(by_host.as_deref(), path, query, target))
        .map_err(|e| unrouted(shared, e))?;
    if let Some(rewritten) = &routed.rewritten {
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = Some(
            rewritten
                .parse()
                .expect("a part of a valid path and query is one"),
        );
        *req.uri_mut() = http::Uri::from_parts(parts).expect("only the path and query changed");
    }
    let state = Arc::new(ProxyState::new(shared.clone(), routed.cluster));
    Ok((state, routed.target))
}

/// The answer to a request routed to no cluster, counted without a cluster label.
fn unrouted(shared: &Shared, e: impl Into<Unrouted>) -> Box<Response<ProxyBody>> {
    let e = e.into();
    let (reason, code, status) = match e {
        Unrouted::UnknownCluster | Unrouted::NoCluster => (
            HandshakeRejection::UnknownCluster,
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
        Unrouted::Host(HostUnrouted::Misdirected) => (
            HandshakeRejection::Misdirected,
            StatusCode::MISDIRECTED_REQUEST,
            "MisdirectedRequest",
        ),
        _ => (
            HandshakeRejection::BadRequest,
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
    };
    shared.metrics.unrouted_rejected(reason);
    Box::new(failure(code, status, e.to_string()))
}

async fn route_authenticated(
    state: Arc<ProxyState>,
    req: Request<Incoming>,
    conn: &Connection,
    target: RequestTarget,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    // The web console's files: public (they hold no data), so before authentication.
    if let Some(resp) = console::serve(req.method(), target.path()) {
        let label = state.cluster.metrics_label();
        state.metrics.request(
            label,
            req.method(),
            resp.status().as_u16(),
            std::time::Duration::ZERO,
        );
        return Ok(resp);
    }
    // The proxy's own API group, whatever the method or upgrade: it never goes upstream.
    if let Some(call) = sessions_api_path::read(req.method(), &target) {
        let caller = authenticate(&state, req.headers(), None, conn).await?;
        let (method, started) = (req.method().clone(), Instant::now());
        let reach = sessions_api_path::reach(&target, req.headers());
        let resp = sessions_api::serve(&state, req, &caller, call, reach).await;
        let label = state.cluster.metrics_label();
        let code = resp.status().as_u16();
        state
            .metrics
            .request(label, &method, code, started.elapsed());
        return Ok(resp);
    }
    let upgrade = match classify(req.method(), &target, req.headers()) {
        Class::BadRequest(reason) => return Ok(bad_request(&state, reason)),
        Class::Forward => return forward_request(&state, req, conn, &target).await,
        Class::Translate {
            bearer,
            subresource,
        } => Upgrade {
            bearer,
            session: Requested::RemoteCommand(subresource),
        },
        Class::Tunnel { bearer, protocols } => Upgrade {
            bearer,
            session: Requested::Tunnel(protocols),
        },
        Class::Relay { kind, bearer } => Upgrade {
            bearer,
            session: Requested::Relay(kind),
        },
    };
    // Boxed: a session's setup is the largest state a request can have (10-15 KB), and the
    // request's future is moved by every service layer; plain requests need not carry it.
    Box::pin(open_session(state, req, conn, &target, upgrade)).await
}

/// Counts a request refused as malformed before anything was done for it, and answers it
/// with 400 and a Kubernetes Status.
fn bad_request(state: &ProxyState, why: impl Into<String>) -> Response<ProxyBody> {
    state.metrics.handshake_rejected(
        state.cluster.metrics_label(),
        HandshakeRejection::BadRequest,
    );
    failure(StatusCode::BAD_REQUEST, "BadRequest", why)
}

/// A plain request (no upgrade): its caller authenticated, then forwarded and counted with its
/// latency, or, when audited, a followed pod log audited as a session. `Err` is the refusal
/// by authentication.
async fn forward_request(
    state: &Arc<ProxyState>,
    mut req: Request<Incoming>,
    conn: &Connection,
    target: &RequestTarget,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    let caller = authenticate(state, req.headers(), None, conn).await?;
    let method = req.method().clone();
    let started = Instant::now();
    if kubelet_call(&method, target).is_some_and(|c| c.call == KubeletCall::Run) {
        return Ok(Box::pin(kubelet_run(state, req, conn, caller, target)).await);
    }
    if state.audit.is_some() && is_followed_log(&method, target) {
        if let Some(refusal) = gate::check(state, &caller, req.headers(), false).await {
            return Ok(refusal);
        }
        if let Err(why) = canonical_target(&mut req, target) {
            return Ok(failure(StatusCode::BAD_REQUEST, "BadRequest", why));
        }
        return Ok(followed_log(state, req, conn.peer, &caller, target).await);
    }
    let merge = state.sessions_discovery && discovery::asks_groups(&method, target.path());
    if merge {
        discovery::ask_identity(req.headers_mut());
    }
    let resp = forward(state, req, conn.peer, &caller).await;
    let resp = match merge {
        true => discovery::merge(resp).await,
        false => resp,
    };
    state.metrics.request(
        state.cluster.metrics_label(),
        &method,
        resp.status().as_u16(),
        started.elapsed(),
    );
    Ok(resp)
}

/// A request classified as a streaming session: the handler it goes to, and the bearer token
/// its WebSocket subprotocol carried (if any).
struct Upgrade {
    bearer: Option<BearerToken>,
    session: Requested,
}

/// A streaming session, in the order that keeps the proxy from holding what it should not:
/// the target made canonical, the caller authenticated (from the headers alone, so that in the
/// modes that authenticate, a caller without credentials makes the proxy hold no body), the
/// request's body read and checked, and only then one of the `--max-sessions` slots taken.
/// From there the session is its own task ([`task`]), which the client hanging up
/// cannot cancel; this request only waits for its answer. `Err` is the refusal by
/// authentication.
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
    let stream_target = StreamTarget::read(req.method(), target);
    let kubelet = stream_target.node.is_some();
    if let Some(refusal) = gate::check(&state, &caller, req.headers(), kubelet).await {
        return Ok(refusal);
    }
    let req = match read_upgrade_request(&state, req, conn).await {
        Ok(req) => req,
        Err(resp) => return Ok(resp),
    };
    if let Some(refusal) = kubelet
        .then(|| gate::refuse_form_body(&req.parts.headers, &req.body))
        .flatten()
    {
        return Ok(refusal);
    }
    let stream = StreamRequest {
        target: stream_target,
        caller,
        peer: conn.peer,
        client: req.client,
        audit_id: request_layers::audit_id(&req.parts.headers),
    };
    let session = match Admissible::check(&state, &req, &stream.target, upgrade.session) {
        Ok(session) => session,
        Err(refusal) => {
            state.metrics.handshake_rejected(
                state.cluster.metrics_label(),
                HandshakeRejection::BadRequest,
            );
            return Ok(refusal.response());
        }
    };
    let slot = match state.sessions.admit(&state.cluster) {
        Ok(slot) => slot,
        Err(refusal) => return Ok(refuse(&state, refusal)),
    };
    let form = req.client.form;
    // An HTTP/1.1 upgrade takes its connection away from hyper; an HTTP/2 one is a stream the
    // connection must stay open for: it is busy (never idle-closed) until the session ends.
    let slot = slot
        .holding((form == HandshakeForm::ExtendedConnect).then(|| conn.activity.request_started()));
    let kind = session.first_kind(state.cluster.upstream_streaming);
    let (running, hangup) = task::admit(&state, slot, form, kind);
    let setup = Box::pin(run_session(state, req, stream, session, running));
    Ok(task::answer(setup, hangup).await)
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
        let reason = match e {
            UpgradeRequestError::OverBudget => HandshakeRejection::Busy,
            _ => HandshakeRejection::BadRequest,
        };
        state
            .metrics
            .handshake_rejected(state.cluster.metrics_label(), reason);
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

/// Runs an admitted session in its handler, to its answer for the client (the session itself
/// may run on after it, in the background).
async fn run_session(
    state: Arc<ProxyState>,
    req: UpgradeRequest,
    stream: StreamRequest,
    session: Admissible,
    running: Running,
) -> Response<ProxyBody> {
    match session {
        // `--upstream-streaming` decides whether these are translated or passed through.
        Admissible::RemoteCommand {
            subresource,
            answer,
        } => {
            let streamed = pass_through::Streamed::RemoteCommand(subresource);
            pass_through::handle(state, req, stream, streamed, answer, running).await
        }
        Admissible::Tunnel { protocols, answer } => {
            let streamed = pass_through::Streamed::Tunnel(protocols);
            pass_through::handle(state, req, stream, streamed, answer, running).await
        }
        // SPDY exec/attach/port-forward: relayed, or translated to WebSocket where the
        // upstream takes only that (`websocket`, or `auto` once SPDY was refused).
        Admissible::Reverse { version, .. } => {
            reverse_handler::handle(state, req, stream, version, running).await
        }
        Admissible::SpdyAuto {
            subresource,
            version,
        } => spdy_auto::handle(state, req, stream, subresource, version, running).await,
        Admissible::Relay(_) => relay(&state, req, stream, running).await,
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
        audit::identify(state, caller, credentials),
    );
    state.metrics.request(
        state.cluster.metrics_label(),
        &method,
        resp.status().as_u16(),
        started.elapsed(),
    );
    let audit = audit::start(
        state,
        audit::session_info(
            next_session_id(),
            &StreamTarget::read(&method, target),
            SessionClient::new(peer, http_version, caller.address()),
            identity,
            ProtocolPath::Http,
            None,
            audit_id,
        ),
    );
    AuditedBody::wrap(resp, audit)
}

/// The kubelet's `run` through `nodes/{node}/proxy`: refused, or (`--node-proxy-sessions=audit`)
/// read whole, admitted and run as an audited session ([`kubelet_run::run`]).
async fn kubelet_run(
    state: &Arc<ProxyState>,
    mut req: Request<Incoming>,
    conn: &Connection,
    caller: Caller,
    target: &RequestTarget,
) -> Response<ProxyBody> {
    if let Some(refusal) = gate::check(state, &caller, req.headers(), true).await {
        return refusal;
    }
    if let Err(why) = canonical_target(&mut req, target) {
        return bad_request(state, why);
    }
    if let Some(refusal) = gate::refuse_multipart(req.headers()) {
        return refusal;
    }
    let (parts, body) = req.into_parts();
    let timeout = state.handshake_timeout;
    let budget = &state.upgrade_body_budget;
    let body = match HeldBody::read(body, MAX_UPGRADE_BODY, timeout, budget).await {
        Ok(body) => body,
        Err(e) => {
            let (code, reason) = e.status();
            return failure(code, reason, e.to_string());
        }
    };
    let form = match form_body(&parts.headers, &body.bytes) {
        Ok(form) => form,
        Err(why) => return bad_request(state, why),
    };
    let Some(run) = KubeletRun::read(&parts.method, target, form) else {
        return bad_request(state, "not a kubelet run");
    };
    let slot = match state.sessions.admit(&state.cluster) {
        Ok(slot) => slot,
        Err(refusal) => return refuse(state, refusal),
    };
    let form = match parts.version {
        http::Version::HTTP_2 => HandshakeForm::ExtendedConnect,
        _ => HandshakeForm::Http1Upgrade,
    };
    // Owned from here by its own task, as every streaming session is (`lifecycle::task`).
    let (running, hangup) = task::admit(state, slot, form, SessionKind::KubeletRun);
    let audit_id = request_layers::audit_id(&parts.headers);
    let req = RunRequest {
        parts,
        body,
        run,
        caller,
        peer: conn.peer,
        audit_id,
    };
    let setup = Box::pin(kubelet_run::run(state.clone(), req, running));
    task::answer(setup, hangup).await
}

/// The form `body` a kubelet reads `cmd` from before the query, if the request has one; a form
/// that is not UTF-8 is refused, as a target that is not is.
fn form_body<'b>(
    headers: &http::HeaderMap,
    body: &'b [u8],
) -> Result<Option<&'b str>, &'static str> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if form_media_type(content_type) != Some(FormBody::UrlEncoded) {
        return Ok(None);
    }
    std::str::from_utf8(body)
        .map(Some)
        .map_err(|_| "the request's form body is not UTF-8")
}
/// Who the caller is, or the refusal to send (401, 403 or 503 with a Status).
async fn authenticate(
    state: &ProxyState,
    headers: &http::HeaderMap,
    bearer: Option<BearerToken>,
    conn: &Connection,
) -> Result<Caller, Response<ProxyBody>> {
    state
        .cluster
        .auth
        .authenticate(
            headers,
            bearer,
            &conn.certificate,
            caller_address(headers, conn.peer.ip(), state.trust_forwarded_for),
        )
        .await
        .map_err(|rejection| {
            state
                .metrics
                .auth_rejected(state.cluster.metrics_label(), rejection.label());
            state.cluster.auth.log_rejection(&rejection, conn.peer);
            rejection.response()
        })
}

/// The answer to a session the proxy will not start: 429 with Retry-After when full, 503
/// while draining, each with a Kubernetes Status.
fn refuse(state: &ProxyState, refusal: Refusal) -> Response<ProxyBody> {
    match refusal {
        Refusal::Full | Refusal::ClusterFull => {
            state.metrics.handshake_rejected(
                state.cluster.metrics_label(),
                HandshakeRejection::TooManySessions,
            );
            let message = if refusal == Refusal::Full {
                "kube-ws-proxy is at its session limit (--max-sessions); try again later"
            } else {
                "kube-ws-proxy runs as many sessions to this cluster as it may (its \
                 max-sessions); try again later"
            };
            let mut resp = failure(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message);
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            resp
        }
        Refusal::Draining => {
            state
                .metrics
                .handshake_rejected(state.cluster.metrics_label(), HandshakeRejection::Draining);
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "kube-ws-proxy is shutting down; retry on another replica",
            )
        }
    }
}
