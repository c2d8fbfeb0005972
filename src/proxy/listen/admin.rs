//! The admin listener: the proxy's own health endpoints. They live apart from the main port
//! because `/healthz` there belongs to the upstream API server.
//!
//! It has no authentication and the manifests bind it on the pod network, so it is held to the
//! main listener's clocks (`--request-header-timeout` from the accept,
//! `--idle-connection-timeout`, `--max-request-header-bytes`) and to a small cap of its own
//! (`--admin-max-connections`), so silent connections to it can never take the descriptors the
//! main listener needs. When the cap is reached, a new connection takes the place of the one
//! that has been idle longest (no request in flight: the main listener's
//! [`WaitingConnections`] rule), so keep-alive connections that ask something now and then
//! cannot lock the kubelet's probes out. Only when every connection has a request in flight is
//! the new one closed at once.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn, Instrument};

use super::front_door::FrontDoor;
use crate::proxy::client::connection_deadline::{Activity, Expiry, InFlightBody};
use crate::proxy::client::waiting_connections::{WaitingConnections, WaitingGuard};
use crate::proxy::observability::metrics::ConnectionShed;
use crate::proxy::observability::readiness::Verdict;
use crate::proxy::route::cluster::Cluster;
use crate::proxy::sessions::state::Shared;
use crate::proxy::upstream::error::reported;

/// Connections the admin listener serves at once by default (`--admin-max-connections`):
/// plenty for kubelet probes and a few scrapers, few enough to cost nothing when flooded.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 64;

/// What bounds the admin listener beyond the main listener's clocks.
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    /// Connections served at once; beyond it a new connection takes the place of the one idle
    /// longest, or is closed as soon as accepted when none is idle.
    pub max_connections: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
        }
    }
}

/// The admin listener's connections: a slot each; those without a request in flight (idle
/// ones, and new ones waiting for a slot) in the order they began to wait.
struct Connections {
    slots: Arc<Semaphore>,
    idle: Arc<WaitingConnections>,
}

/// Serves `/healthz` (the process is alive), `/readyz` (the upstream answers TCP and TLS, and
/// we are not draining; one check shared by every probe for a second) and `/metrics`
/// (Prometheus text format), and keeps every cluster's `kube_ws_proxy_upstream_ready` fresh
/// ([`READY_REFRESH`]).
pub async fn serve(
    listener: TcpListener,
    front: Arc<FrontDoor>,
    limits: AdminLimits,
) -> std::io::Result<()> {
    let state = front.shared().clone();
    tokio::spawn(refresh_readiness(front.clone()));
    let connections = Arc::new(Connections {
        slots: Arc::new(Semaphore::new(limits.max_connections)),
        // Idle ones hold a slot each and each one waiting for a slot made one leave, so at most
        // twice the cap wait; the registry's own cap is only a backstop.
        idle: WaitingConnections::new(limits.max_connections.saturating_mul(2)),
    });
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(_) => {
                // Out of descriptors: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let first_request_by = Instant::now() + state.request_header_timeout;
        let slot = connections.slot();
        // Full: the connection that has waited longest for a request head (an idle keep-alive
        // one, or a newer one still waiting for its slot) leaves its place to this one.
        if !slot.is_free() && !connections.idle.shed_oldest() {
            // Every connection has a request in flight (bounded by its clocks and the readiness
            // check's 2 s): closing at once keeps a flood from holding descriptors.
            debug!(%peer, "admin connection closed: --admin-max-connections reached, none idle");
            state
                .metrics
                .connection_shed(ConnectionShed::AdminConnectionLimit);
            continue;
        }
        let client = Client {
            peer,
            first_request_by,
            // Waits for a request head from the accept (and for its slot, if it has none yet).
            waiting: connections.idle.join(),
        };
        tokio::spawn(serve_connection(tcp, client, slot, front.clone()));
    }
}

impl Connections {
    /// A slot now, or a place in the queue for one taken now: a slot a leaving connection
    /// frees goes to the connections waiting in the order they came, never to a later one
    /// that happens to ask first.
    fn slot(&self) -> Slot {
        let mut acquire: Queued = Box::pin(self.slots.clone().acquire_owned());
        // The first poll takes a free slot or joins the semaphore's queue; the connection's
        // task polls it again with its own waker.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match acquire.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(slot)) => Slot::Free(slot),
            _ => Slot::Queued(acquire),
        }
    }
}

/// A new connection's slot.
enum Slot {
    /// Its own from the accept.
    Free(OwnedSemaphorePermit),
    /// In the queue for the one the connection it displaced leaves.
    Queued(Queued),
}

impl Slot {
    fn is_free(&self) -> bool {
        matches!(self, Slot::Free(_))
    }
}

/// A place in the semaphore's queue.
type Queued = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Who connected, by when its first request head is due, and its place among the connections
/// waiting for one.
struct Client {
    peer: SocketAddr,
    first_request_by: Instant,
    waiting: WaitingGuard,
}

/// One admin connection (HTTP/1.1), from its slot (`slot`, or the one the connection it
/// displaced leaves) to its end, within the main listener's clocks; shed whenever it has waited
/// longest for a request head and a newer connection needs room.
async fn serve_connection(tcp: TcpStream, client: Client, slot: Slot, front: Arc<FrontDoor>) {
    let state = front.shared().clone();
    let waiter = client.waiting.waiter();
    let Some(_slot) = (match slot {
        Slot::Free(slot) => Some(slot),
        Slot::Queued(queued) => wait_for_slot(queued, &client, &state).await,
    }) else {
        return;
    };
    let (peer, first_request_by) = (client.peer, client.first_request_by);
    let activity = Activity::counted(waiter.clone());
    let service = {
        let activity = activity.clone();
        service_fn(move |req: Request<Incoming>| {
            let in_flight = activity.request_started();
            let front = front.clone();
            async move {
                let resp = answer(&front, req.uri()).await;
                Ok::<_, Infallible>(resp.map(|body| InFlightBody::new(body, in_flight)))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(state.request_header_timeout)
        .max_buf_size(state.max_request_header_bytes);
    let served = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(served);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => return,
            () = waiter.evicted() => return shed_idle(&state, peer),
            expiry = activity.expired(first_request_by, state.idle_connection_timeout) => {
                debug!(%peer, reason = expiry.label(), "closing the admin connection");
                if closing || expiry == Expiry::FirstRequest {
                    // Never asked anything, or told to close an idle period ago: cut.
                    return;
                }
                // Idle keep-alive: closed, unless a request slipped in meanwhile.
                served.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The slot a new connection waits for while the one it displaced leaves; `None` (the
/// connection is dropped) if a newer one displaces it first, or its first request head is due.
async fn wait_for_slot(
    queued: Queued,
    client: &Client,
    state: &Shared,
) -> Option<OwnedSemaphorePermit> {
    let waiter = client.waiting.waiter();
    tokio::select! {
        slot = tokio::time::timeout_at(client.first_request_by, queued) => match slot {
            Ok(Ok(slot)) => Some(slot),
            _ => {
                state
                    .metrics
                    .connection_shed(ConnectionShed::RequestHeaderTimeout);
                None
            }
        },
        () = waiter.evicted() => {
            shed_idle(state, client.peer);
            None
        }
    }
}

/// Counts a connection shed because it had waited longest for a request head while a newer one
/// needed room; it is closed (dropped) by returning.
fn shed_idle(state: &Shared, peer: SocketAddr) {
    debug!(%peer, "admin connection closed: it had waited longest while --admin-max-connections were open");
    state.metrics.connection_shed(ConnectionShed::AdminIdleShed);
}

async fn answer(front: &FrontDoor, uri: &http::Uri) -> Response<Full<Bytes>> {
    let state = front.shared();
    match uri.path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok"),
        "/metrics" => {
            let mut resp = Response::new(Full::new(Bytes::from(state.metrics.render())));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        "/readyz" => {
            if state.sessions.is_draining() {
                return text(StatusCode::SERVICE_UNAVAILABLE, "draining");
            }
            ready(front, asked_cluster(uri).as_deref()).await
        }
        "/clusters" => clusters_page(front).await,
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

/// The `cluster` a `/readyz?cluster=NAME` asks about, if any.
fn asked_cluster(uri: &http::Uri) -> Option<String> {
    url::form_urlencoded::parse(uri.query()?.as_bytes())
        .find(|(k, _)| k == "cluster")
        .map(|(_, v)| v.into_owned())
}

/// `/readyz`: ready when every cluster is (or the one `only` names); the body names the
/// clusters that are not, each with the step that failed.
async fn ready(front: &FrontDoor, only: Option<&str>) -> Response<Full<Bytes>> {
    let fleet = front.fleet();
    let clusters: Vec<Arc<Cluster>> = match only {
        Some(name) => match fleet.get(name) {
            Some(cluster) => vec![cluster.clone()],
            None => return text(StatusCode::NOT_FOUND, "no such cluster"),
        },
        None => fleet.clusters().cloned().collect(),
    };
    let state = front.shared();
    let verdicts =
        futures_util::future::join_all(clusters.iter().map(|c| check_cluster(state, c))).await;
    let named = fleet.is_named();
    let failed: Vec<String> = clusters
        .iter()
        .zip(verdicts)
        .filter_map(|(cluster, verdict)| {
            let why = verdict.err()?;
            Some(if named {
                format!("cluster {}: {why}", cluster.label())
            } else {
                why
            })
        })
        .collect();
    if failed.is_empty() {
        text(StatusCode::OK, "ok")
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, &failed.join("\n"))
    }
}

/// `cluster`'s readiness: one check shared by every probe for [`READY_CACHE`](crate::proxy::observability::readiness::READY_CACHE),
/// shown in `kube_ws_proxy_upstream_ready`.
async fn check_cluster(state: &Shared, cluster: &Arc<Cluster>) -> Verdict {
    let dialled = cluster.clone();
    // The check runs on its own task: its lines name the cluster through their own span.
    let span = tracing::info_span!("readiness", cluster = cluster.label());
    let verdict = cluster
        .readiness
        .check(|| async move { dial_upstream(&dialled).await }.instrument(span))
        .await;
    state
        .metrics
        .upstream_ready(cluster.metrics_label(), verdict.is_ok());
    verdict
}

/// How often every cluster's readiness is checked besides the probes: `/readyz` is asked only
/// as often as the probes come, and `kube_ws_proxy_upstream_ready` must be fresh whenever it
/// is scraped, with or without them. One dial per cluster per period (probes within a second of
/// it share it).
pub const READY_REFRESH: Duration = Duration::from_secs(10);

/// Checks every cluster of the current configuration each [`READY_REFRESH`], from the start;
/// a cluster no longer configured leaves `kube_ws_proxy_upstream_ready`.
async fn refresh_readiness(front: Arc<FrontDoor>) {
    let state = front.shared();
    let mut tick = tokio::time::interval(READY_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let fleet = front.fleet();
        let checks = fleet.clusters().map(|c| check_cluster(state, c));
        futures_util::future::join_all(checks).await;
        state
            .metrics
            .retain_upstream_ready(|label| fleet.get(label).is_some());
    }
}

/// `/clusters`: every cluster with its upstream, streaming mode, readiness, running sessions
/// and their limit (`null`: only the proxy's), as JSON.
async fn clusters_page(front: &FrontDoor) -> Response<Full<Bytes>> {
    let fleet = front.fleet();
    let clusters: Vec<&Arc<Cluster>> = fleet.clusters().collect();
    let state = front.shared();
    let verdicts =
        futures_util::future::join_all(clusters.iter().map(|c| check_cluster(state, c))).await;
    let rows: Vec<serde_json::Value> = clusters
        .iter()
        .zip(verdicts)
        .map(|(cluster, verdict)| {
            serde_json::json!({
                "name": cluster.label(),
                "upstream": cluster.upstream.to_string(),
                "authMode": cluster.auth.mode(),
                "upstreamStreaming": cluster.upstream_streaming,
                "ready": verdict.is_ok(),
                "notReadyBecause": verdict.err(),
                "sessions": cluster.active_sessions(),
                "maxSessions": cluster.max_sessions(),
            })
        })
        .collect();
    let body =
        serde_json::to_vec_pretty(&serde_json::json!({ "clusters": rows })).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Whether `cluster`'s upstream accepts a connection (TCP, and TLS when it is https) within
/// 2 s. The answer, which anyone who reaches the admin port reads, says only which step
/// failed; the log gets the cause (the upstream's address, what TLS said).
async fn dial_upstream(cluster: &Cluster) -> Verdict {
    match tokio::time::timeout(READY_DIAL, cluster.upstream.connect_raw()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(reported(&e)),
        Err(_) => {
            warn!(cluster = cluster.label(), timeout = ?READY_DIAL, "readiness check: the upstream API server did not accept a connection in time");
            Err("timed out connecting to the upstream API server".into())
        }
    }
}

/// How long the readiness check waits for the upstream to accept a connection.
const READY_DIAL: Duration = Duration::from_secs(2);

fn text(code: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_owned())));
    *resp.status_mut() = code;
    resp
}
