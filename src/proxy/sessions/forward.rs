//! The streaming reverse proxy for requests that do not upgrade: bodies flow through as they
//! come (watches, `logs -f`), nothing is buffered.

use std::net::SocketAddr;

use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::state::ProxyState;
use crate::proxy::auth::Caller;
use crate::proxy::upstream::error::{reported, Chained};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::headers::{remove_hop_by_hop, set_forwarding_headers};
use crate::proxy::wire::status_response::failure;

/// Forwards one request and streams the answer back.
pub async fn forward(
    state: &ProxyState,
    req: Request<Incoming>,
    peer: SocketAddr,
    caller: &Caller,
) -> Response<ProxyBody> {
    forward_body(state, req.map(BodyExt::boxed), peer, caller).await
}

/// [`forward`], for a request whose body the proxy holds (read whole, or made here).
pub async fn forward_body(
    state: &ProxyState,
    req: Request<ProxyBody>,
    peer: SocketAddr,
    caller: &Caller,
) -> Response<ProxyBody> {
    let upstream = &state.cluster.upstream;
    let client = state.cluster.client.get();
    let (mut parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    parts.uri = match upstream.uri(&pq) {
        Ok(uri) => uri,
        Err(e) => return failure(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    // The upstream connection is HTTP/1.1 whatever the client spoke.
    parts.version = http::Version::HTTP_11;
    remove_hop_by_hop(&mut parts.headers);
    set_forwarding_headers(&mut parts.headers, peer.ip(), state.trust_forwarded_for);
    state.cluster.auth.apply(caller, &mut parts.headers);
    if let Ok(host) = HeaderValue::from_str(&upstream.authority()) {
        parts.headers.insert(header::HOST, host);
    }
    let req = Request::from_parts(parts, body);
    match client.request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            remove_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        // The cause goes to the log; the client, who may be anyone, gets its kind.
        Err(e) => failure(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            format!(
                "error trying to reach the upstream API server: {}",
                reported(&Chained(&e))
            ),
        ),
    }
}
