//! The admin listener: the proxy's own health endpoints. They live apart from the main port
//! because `/healthz` there belongs to the upstream API server.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::state::ProxyState;

/// Serves `/healthz` (the process is alive), `/readyz` (the upstream answers TCP and TLS, and
/// we are not draining) and `/metrics` (Prometheus text format).
pub async fn serve(listener: TcpListener, state: Arc<ProxyState>) -> std::io::Result<()> {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(answer(&state, req.uri().path()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

async fn answer(state: &ProxyState, path: &str) -> Response<Full<Bytes>> {
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
            let probe = tokio::time::timeout(Duration::from_secs(2), state.upstream.connect_raw());
            match probe.await {
                Ok(Ok(_)) => text(StatusCode::OK, "ok"),
                Ok(Err(e)) => text(StatusCode::SERVICE_UNAVAILABLE, &format!("upstream: {e}")),
                Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "upstream: timeout"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

fn text(code: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_owned())));
    *resp.status_mut() = code;
    resp
}
