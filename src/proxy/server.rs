//! The main listener: one HTTP/1.1 connection per client, each request classified once and
//! handed to the translator, the tunnel, the relay or the reverse proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::debug;

use super::classify::{classify, Class};
use super::forward::{forward, ProxyBody};
use super::relay::relay;
use super::state::ProxyState;
use super::status_response::failure;
use super::{exec_handler, tunnel_handler};

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
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(state, req, peer).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                .await
            {
                debug!(error = %e, %peer, "client connection ended with an error");
            }
        });
    }
}

/// Classifies a request and runs its handler.
pub async fn route(
    state: Arc<ProxyState>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    match classify(req.method(), req.uri().path(), req.headers()) {
        Class::Translate { bearer, .. } => exec_handler::handle(state, req, peer, bearer).await,
        Class::Tunnel { bearer, protocols } => {
            tunnel_handler::handle(state, req, peer, bearer, protocols).await
        }
        Class::Relay(_) => relay(&state.upstream, req, peer).await,
        Class::Forward => forward(&state.upstream, &state.client, req, peer).await,
        Class::BadRequest(reason) => failure(StatusCode::BAD_REQUEST, "BadRequest", reason),
    }
}
