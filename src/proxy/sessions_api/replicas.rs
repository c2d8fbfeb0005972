//! The sessions of every replica (`--peers`): each replica knows only its own, so an
//! operator's `?allReplicas=true` list is passed on to every peer, and a session this replica
//! does not have is looked for on the others. A call is passed on with the caller's own bearer
//! token and nothing else of theirs or of the proxy's: each replica authenticates and
//! authorizes the caller again, so the fleet shows nobody more than the cluster's RBAC allows.
//! Passed-on calls carry [`PASSED_ON`] and are answered from the replica's own sessions only,
//! so a call never goes round.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

use crate::proxy::route::sessions_api::PASSED_ON;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::upstream::peers::Peer;
use crate::proxy::wire::body::ProxyBody;

/// How long one replica may take to answer a passed-on call (its body included, for a list).
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest list a replica's answer may hold.
const PEER_LIST_LIMIT: usize = 16 * 1024 * 1024;

/// A call to pass on: what of the caller's request the replicas are sent.
pub struct PassOn {
    method: Method,
    /// Path (with the cluster's prefix, in a fleet) and query, without `allReplicas`.
    path_and_query: String,
    /// The caller's `Authorization: Bearer …`; `None` for a caller known by its client
    /// certificate, which only the replica it connected to can see.
    authorization: Option<HeaderValue>,
    body: Bytes,
}

impl PassOn {
    /// `method` on `path` (as routed, without a cluster prefix) with `query`, for the caller
    /// whose request carried `headers`.
    pub fn new(
        state: &ProxyState,
        method: Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> PassOn {
        let prefix = match &state.cluster.name {
            Some(name) => format!("/clusters/{}", name.as_str()),
            None => String::new(),
        };
        let query: Vec<&str> = query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("allReplicas="))
            .collect();
        let path_and_query = match query.is_empty() {
            true => format!("{prefix}{path}"),
            false => format!("{prefix}{path}?{}", query.join("&")),
        };
        let authorization = headers
            .get(header::AUTHORIZATION)
            .filter(|v| v.as_bytes().starts_with(b"Bearer "))
            .cloned();
        PassOn {
            method,
            path_and_query,
            authorization,
            body: Bytes::new(),
        }
    }

    /// The call with `body` (a terminate's reason).
    pub fn with_body(self, body: Bytes) -> PassOn {
        PassOn { body, ..self }
    }

    /// Whether the caller can be passed on (it has a bearer token).
    pub fn can_pass_on(&self) -> bool {
        self.authorization.is_some()
    }

    /// The call as sent to `peer`.
    fn request(&self, peer: &Peer) -> Result<Request<ProxyBody>, http::Error> {
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(peer.upstream.uri(&self.path_and_query)?)
            .header(PASSED_ON, "1")
            .header(header::ACCEPT, "application/json");
        if let Some(auth) = &self.authorization {
            req = req.header(header::AUTHORIZATION, auth.clone());
        }
        if !self.body.is_empty() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        req.body(
            Full::new(self.body.clone())
                .map_err(|never| match never {})
                .boxed(),
        )
    }
}

/// What one replica answered.
enum Answered {
    Response(Response<hyper::body::Incoming>),
    Failed(String),
}

/// Sends `call` to `peer`; the answer's head, within [`PEER_TIMEOUT`].
async fn ask(peer: &Peer, call: &PassOn) -> Answered {
    let req = match call.request(peer) {
        Ok(req) => req,
        Err(e) => return Answered::Failed(format!("replica at {}: {e}", peer.addr)),
    };
    let client = peer.upstream.http_client();
    match tokio::time::timeout(PEER_TIMEOUT, client.request(req)).await {
        Ok(Ok(resp)) => Answered::Response(resp),
        Ok(Err(e)) => Answered::Failed(format!(
            "replica at {} did not answer: {}",
            peer.addr,
            crate::proxy::upstream::error::error_chain(&e)
        )),
        Err(_) => Answered::Failed(format!("replica at {} did not answer in time", peer.addr)),
    }
}

/// The sessions `local` (this replica's list, as JSON) and every peer's, merged: one list,
/// with a `Warning` for each replica that did not answer.
pub async fn list_everywhere(
    state: &ProxyState,
    call: PassOn,
    mut local: Value,
) -> Response<ProxyBody> {
    let mut warnings = Vec::new();
    let own = crate::audit::instance::instance_id();
    if let Some(peers) = state.peers.as_ref().filter(|_| call.can_pass_on()) {
        let (found, unresolved) = peers.resolve().await;
        warnings.extend(
            unresolved
                .into_iter()
                .map(|e| format!("peers not found: {e}")),
        );
        let answers = join_all(found.iter().map(|peer| list_of(peer, &call))).await;
        let items = local["items"].as_array_mut().expect("a list has items");
        for answer in answers {
            match answer {
                Ok(theirs) => items.extend(
                    theirs
                        .into_iter()
                        .filter(|s| s["status"]["replica"].as_str() != Some(own)),
                ),
                Err(why) => warnings.push(why),
            }
        }
    } else if state.peers.is_some() {
        warnings.push(
            "only this replica's sessions: a caller without a bearer token cannot be passed on \
             to the other replicas"
                .into(),
        );
    }
    // The merged list has no one version to watch from.
    local["metadata"] = serde_json::json!({});
    super::with_warnings(super::json(StatusCode::OK, &local), &warnings)
}

/// The sessions `peer` lists for `call`, or why not.
async fn list_of(peer: &Peer, call: &PassOn) -> Result<Vec<Value>, String> {
    let resp = match ask(peer, call).await {
        Answered::Response(resp) => resp,
        Answered::Failed(why) => return Err(why),
    };
    let status = resp.status();
    let body = tokio::time::timeout(
        PEER_TIMEOUT,
        Limited::new(resp.into_body(), PEER_LIST_LIMIT).collect(),
    )
    .await
    .map_err(|_| format!("replica at {} did not finish its answer in time", peer.addr))?
    .map_err(|e| format!("replica at {}: {e}", peer.addr))?
    .to_bytes();
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("replica at {} answered no JSON: {e}", peer.addr))?;
    if !status.is_success() {
        let message = value["message"].as_str().unwrap_or("no message");
        return Err(format!(
            "replica at {} refused: {status}: {message}",
            peer.addr
        ));
    }
    match value["items"].as_array() {
        Some(items) => Ok(items.clone()),
        None => Err(format!("replica at {} answered no list", peer.addr)),
    }
}

/// The answer of the first peer that has the session `call` names (any answer but 404), as
/// it gave it (a followed recording streams through), or `None` when no replica has it.
pub async fn find_elsewhere(state: &ProxyState, call: PassOn) -> Option<Response<ProxyBody>> {
    let peers = state.peers.as_ref().filter(|_| call.can_pass_on())?;
    let own = crate::audit::instance::instance_id();
    let (found, _) = peers.resolve().await;
    for peer in &found {
        let Answered::Response(resp) = ask(peer, &call).await else {
            continue;
        };
        let replica = resp.headers().get(REPLICA).and_then(|v| v.to_str().ok());
        if resp.status() == StatusCode::NOT_FOUND || replica == Some(own) {
            continue;
        }
        let (mut parts, body) = resp.into_parts();
        // The connection to the peer is not the caller's: its framing is hyper's to set.
        for hop in [
            header::CONNECTION,
            header::TRANSFER_ENCODING,
            header::CONTENT_LENGTH,
        ] {
            parts.headers.remove(hop);
        }
        return Some(Response::from_parts(parts, body.boxed()));
    }
    None
}

/// The header naming the replica that answered a sessions API call.
pub const REPLICA: &str = "kube-ws-proxy-replica";
