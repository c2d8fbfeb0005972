//! The admin listener: the proxy's own health endpoints. They live apart from the main port
//! because `/healthz` there belongs to the upstream API server.
//!
//! It has no authentication and the manifests bind it on the pod network, so it is held to the
//! main listener's clocks (`--request-header-timeout` from the accept,
//! `--idle-connection-timeout`, `--max-request-header-bytes`) and to a small cap of its own
//! (`--admin-max-connections`): connections beyond the cap are closed at once. Silent
//! connections to it can then never take the descriptors the main listener needs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use crate::proxy::client::connection_deadline::{Activity, Expiry, InFlightBody};
use crate::proxy::observability::metrics::ConnectionShed;
use crate::proxy::observability::readiness::{Readiness, Verdict, READY_CACHE};
use crate::proxy::sessions::state::ProxyState;

/// Connections the admin listener serves at once by default (`--admin-max-connections`):
/// plenty for kubelet probes and a few scrapers, few enough to cost nothing when flooded.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 64;

/// What bounds the admin listener beyond the main listener's clocks.
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    /// Connections served at once; beyond it a new connection is closed as soon as accepted.
    pub max_connections: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
        }
    }
}

/// Serves `/healthz` (the process is alive), `/readyz` (the upstream answers TCP and TLS, and
/// we are not draining; one check shared by every probe for a second) and `/metrics`
/// (Prometheus text format).
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    limits: AdminLimits,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let readiness = Readiness::new(READY_CACHE);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(_) => {
                // Out of descriptors: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Full: closing at once (the drop) keeps a flood from holding descriptors, while
            // the connections already in are served within their clocks.
            debug!(%peer, "admin connection closed: --admin-max-connections reached");
            state
                .metrics
                .connection_shed(ConnectionShed::AdminConnectionLimit);
            continue;
        };
        tokio::spawn(serve_connection(
            tcp,
            peer,
            state.clone(),
            readiness.clone(),
            slot,
        ));
    }
}

/// One admin connection (HTTP/1.1), within the main listener's clocks; it holds `_slot` until
/// it ends.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    readiness: Arc<Readiness>,
    _slot: OwnedSemaphorePermit,
) {
    let first_request_by = tokio::time::Instant::now() + state.request_header_timeout;
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        let state = state.clone();
        service_fn(move |req: Request<Incoming>| {
            let in_flight = activity.request_started();
            let state = state.clone();
            let readiness = readiness.clone();
            async move {
                let resp = answer(&state, &readiness, req.uri().path()).await;
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

async fn answer(
    state: &Arc<ProxyState>,
    readiness: &Arc<Readiness>,
    path: &str,
) -> Response<Full<Bytes>> {
    match path {
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
            let state = state.clone();
            match readiness.check(|| dial_upstream(state)).await {
                Ok(()) => text(StatusCode::OK, "ok"),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, &why),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

/// Whether the upstream accepts a connection (TCP, and TLS when it is https) within 2 s.
async fn dial_upstream(state: Arc<ProxyState>) -> Verdict {
    match tokio::time::timeout(Duration::from_secs(2), state.upstream.connect_raw()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("upstream: {e}")),
        Err(_) => Err("upstream: timeout".into()),
    }
}

fn text(code: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_owned())));
    *resp.status_mut() = code;
    resp
}
