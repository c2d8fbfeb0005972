//! The main listener: one HTTP/1.1 connection per client, each request classified once and
//! handed to the translator, the tunnel, the relay or the reverse proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use std::time::Instant;

use super::auth::{identity_from_certificate, Caller, Identity, Rejection};
use super::classify::{classify, Class};
use super::forward::{forward, ProxyBody};
use super::metrics::HandshakeRejection;
use super::relay::relay;
use super::sessions::Refusal;
use super::state::ProxyState;
use super::status_response::failure;
use super::{exec_handler, tunnel_handler};
use crate::translate::subprotocol::{BearerToken, OfferedProtocols};

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
        let header_timeout = state.request_header_timeout;
        let max_head = state.max_request_header_bytes;
        let tls = state.tls.clone();
        tokio::spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(max_head);
            let service = |conn: Arc<Connection>| {
                service_fn(move |req| {
                    let state = state.clone();
                    let conn = conn.clone();
                    async move { Ok::<_, Infallible>(route(state, req, &conn).await) }
                })
            };
            let result = match tls {
                None => {
                    let conn = Arc::new(Connection {
                        peer,
                        certificate: None,
                    });
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(tcp), service(conn))
                        .await
                }
                Some(acceptor) => {
                    // The TLS handshake counts against the request-head timeout.
                    let accepted = tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await;
                    match accepted {
                        Ok(Ok(stream)) => {
                            let conn = Arc::new(Connection {
                                peer,
                                certificate: certificate_identity(&stream, peer),
                            });
                            builder
                                .serve_connection_with_upgrades(TokioIo::new(stream), service(conn))
                                .await
                        }
                        Ok(Err(e)) => {
                            debug!(error = %e, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            if let Err(e) = result {
                debug!(error = %e, %peer, "client connection ended with an error");
            }
        });
    }
}

/// One client connection, as every request on it sees it.
#[derive(Debug)]
pub struct Connection {
    /// The client's address.
    pub peer: SocketAddr,
    /// The identity of the client certificate the TLS layer verified, if one was presented.
    pub certificate: Option<Arc<Identity>>,
}

/// The identity in a verified client certificate (`--client-ca-file`). One without a usable
/// subject authenticates nobody; the caller may still present a token.
fn certificate_identity(
    stream: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
) -> Option<Arc<Identity>> {
    let leaf = stream.get_ref().1.peer_certificates()?.first()?;
    match identity_from_certificate(leaf) {
        Ok(id) => Some(Arc::new(id)),
        Err(e) => {
            debug!(error = %e, %peer, "client certificate identifies nobody");
            None
        }
    }
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
    req: Request<Incoming>,
    conn: &Connection,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    let peer = conn.peer;
    let auth = |bearer| authenticate(&state, req.headers(), bearer, conn);
    // A streaming session needs a slot; refused ones are answered at once.
    let answer = match classify(req.method(), req.uri().path(), req.headers()) {
        Class::Translate {
            bearer,
            subresource,
        } => {
            let caller = auth(bearer).await?;
            match state.sessions.admit() {
                Ok(slot) => {
                    exec_handler::handle(state.clone(), req, peer, caller, subresource, slot).await
                }
                Err(refusal) => refuse(&state, refusal),
            }
        }
        Class::Tunnel { bearer, protocols } => {
            let caller = auth(bearer).await?;
            match state.sessions.admit() {
                Ok(slot) => {
                    tunnel_handler::handle(state.clone(), req, peer, caller, protocols, slot).await
                }
                Err(refusal) => refuse(&state, refusal),
            }
        }
        Class::Relay(kind) => {
            // Classification already refused a malformed bearer entry.
            let bearer = OfferedProtocols::from_headers(req.headers())
                .ok()
                .and_then(|mut o| o.take_bearer());
            let caller = auth(bearer).await?;
            match state.sessions.admit() {
                Ok(slot) => relay(&state, req, peer, kind, slot, &caller).await,
                Err(refusal) => refuse(&state, refusal),
            }
        }
        Class::BadRequest(reason) => {
            state
                .metrics
                .handshake_rejected(HandshakeRejection::BadRequest);
            failure(StatusCode::BAD_REQUEST, "BadRequest", reason)
        }
        Class::Forward => {
            let caller = auth(None).await?;
            let method = req.method().clone();
            let started = Instant::now();
            let resp = forward(
                &state.upstream,
                &state.client.get(),
                req,
                peer,
                &state.auth,
                &caller,
            )
            .await;
            state
                .metrics
                .request(&method, resp.status().as_u16(), started.elapsed());
            resp
        }
    };
    Ok(answer)
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
        .authenticate(headers, bearer, conn.certificate.as_ref())
        .await
        .map_err(|rejection| {
            state.metrics.auth_rejected(rejection.label());
            match &rejection {
                // The proxy's own problem (RBAC, upstream down): operators must see it.
                Rejection::Unavailable(cause) => {
                    warn!(peer = %conn.peer, error = %cause, "cannot authenticate the caller")
                }
                _ => debug!(peer = %conn.peer, reason = rejection.label(), "request refused by authentication"),
            }
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
