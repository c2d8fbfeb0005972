//! The sessions API: the proxy's own API group `kube-ws-proxy.io/v1`, resource `sessions`,
//! served on the main listener to callers the listener authenticated, each call authorized by
//! the cluster's RBAC ([`access`]). A call never goes upstream (only its reviews do).
//!
//! - `GET /apis/kube-ws-proxy.io/v1/sessions`, `…/namespaces/NS/sessions`: the live sessions of
//!   the cluster the request was routed to, on this replica.
//! - `?watch=true` on either: the same, then their changes as they happen ([`watch`]); a
//!   caller keeps a bounded number of watches open (429 past it).
//! - `GET …/namespaces/NS/sessions/ID`: one.
//! - `DELETE …/namespaces/NS/sessions/ID`: terminate it (`?reason=…`, or a JSON body with
//!   `reason`); its client is told who and why, its audit `ended` event names them.
//! - `GET …/namespaces/NS/sessions/ID/recording[?follow=true]`: its asciicast ([`recording`]).
//!
//! - `GET /apis` from upstream gets the group appended ([`discovery`], `--sessions-discovery`).
//! - `?allReplicas=true` on a list: every replica's sessions ([`replicas`], `--peers`); a
//!   session this replica does not have is looked for on the others.
//!
//! May use `sessions`, `route`, `auth`, `upstream`, `observability` and `wire`; used by
//! `listen`.

pub mod access;
pub mod discovery;
pub mod objects;
pub mod recording;
mod replicas;
pub mod table;
mod terminate;
mod watch;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::proxy::auth::Caller;
use crate::proxy::route::sessions_api::{NotServed, Reach, SessionsCall};
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use objects::{Session, SessionList};

/// Answers a request to the group: `call` as the front door read it, `caller` as the listener
/// authenticated it, `reach` which replicas it asks. Every answer names the replica that gave
/// it ([`replicas::REPLICA`]).
pub async fn serve(
    state: &ProxyState,
    req: Request<Incoming>,
    caller: &Caller,
    call: Result<SessionsCall, NotServed>,
    reach: Reach,
) -> Response<ProxyBody> {
    let mut resp = answer(state, req, caller, call, reach).await;
    resp.headers_mut().insert(
        replicas::REPLICA,
        HeaderValue::from_static(crate::audit::instance::instance_id()),
    );
    resp
}

async fn answer(
    state: &ProxyState,
    req: Request<Incoming>,
    caller: &Caller,
    call: Result<SessionsCall, NotServed>,
    reach: Reach,
) -> Response<ProxyBody> {
    let call = match call {
        Ok(call) => call,
        Err(not) => return not_served(not),
    };
    let operator = match access::check(state, caller, req.headers(), &call).await {
        Ok(operator) => operator,
        Err(refusal) => return refusal,
    };
    let cluster = state.cluster.name.as_ref().map(|n| n.as_str());
    let live = state.sessions.live();
    match call {
        SessionsCall::Group => json(StatusCode::OK, &objects::api_group()),
        SessionsCall::Resources => json(StatusCode::OK, &objects::api_resources()),
        SessionsCall::List { namespace } => {
            let (sessions, version) = live.of(cluster, namespace.as_deref());
            if !reach.everywhere() {
                if let Some(include) = table_asked(&req) {
                    return json(
                        StatusCode::OK,
                        &table::table(&sessions, Some(version), include),
                    );
                }
                return json(StatusCode::OK, &SessionList::of(&sessions, version));
            }
            let list = SessionList::of(&sessions, version);
            let local = serde_json::to_value(&list).unwrap_or_default();
            let call = pass_on(state, &req);
            replicas::list_everywhere(state, call, local).await
        }
        SessionsCall::Watch { .. } if reach.all_replicas => failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "allReplicas lists every replica's sessions once; a watch is of one replica's",
        ),
        SessionsCall::Watch { namespace, timeout } => {
            watch::watch(live, caller, cluster.map(str::to_owned), namespace, timeout)
        }
        SessionsCall::Get { namespace, name } => match live.find(cluster, &namespace, &name) {
            Some(session) => match table_asked(&req) {
                Some(include) => json(StatusCode::OK, &table::table(&[session], None, include)),
                None => json(StatusCode::OK, &Session::of(&session)),
            },
            None => elsewhere(state, pass_on(state, &req), reach, &name).await,
        },
        SessionsCall::Delete {
            namespace,
            name,
            reason,
        } => {
            let Some(session) = live.find(cluster, &namespace, &name) else {
                let call = pass_on(state, &req);
                let body = match terminate::read_body(req).await {
                    Ok(body) => body,
                    Err(why) => return failure(StatusCode::BAD_REQUEST, "BadRequest", why),
                };
                return elsewhere(state, call.with_body(body), reach, &name).await;
            };
            let answer = terminate::terminate(req, reason, &session, operator).await;
            if answer.status() == StatusCode::OK {
                live.modified(&session);
            }
            answer
        }
        SessionsCall::Recording {
            namespace,
            name,
            follow,
        } => {
            let call = recording::RecordingCall {
                namespace,
                name: name.clone(),
                follow,
            };
            match recording::serve(state, caller, call).await {
                Some(answer) => answer,
                None => elsewhere(state, pass_on(state, &req), reach, &name).await,
            }
        }
    }
}

/// What a `Table` row carries, when `req` asks for a table (`kubectl get`), else `None`.
fn table_asked<B>(req: &Request<B>) -> Option<table::IncludeObject> {
    if !table::wanted(req.headers()) {
        return None;
    }
    let include = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "includeObject")
            .map(|(_, v)| v.into_owned())
    });
    Some(table::IncludeObject::read(include.as_deref()))
}

/// `req` as the other replicas are asked it.
fn pass_on<B>(state: &ProxyState, req: &Request<B>) -> replicas::PassOn {
    let uri = req.uri();
    replicas::PassOn::new(
        state,
        req.method().clone(),
        uri.path(),
        uri.query(),
        req.headers(),
    )
}

/// The answer for the session `name`, which this replica does not have: another replica's,
/// when the call may be passed on and one has it, else 404.
async fn elsewhere(
    state: &ProxyState,
    call: replicas::PassOn,
    reach: Reach,
    name: &str,
) -> Response<ProxyBody> {
    if reach.passed_on {
        return not_found(name);
    }
    match replicas::find_elsewhere(state, call).await {
        Some(theirs) => theirs,
        None => not_found(name),
    }
}

/// `resp` with a `Warning` header (`299`, as the API server warns) for each of `warnings`.
fn with_warnings(mut resp: Response<ProxyBody>, warnings: &[String]) -> Response<ProxyBody> {
    for warning in warnings {
        let text = warning.replace(['"', '\\'], "'");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            resp.headers_mut().append(header::WARNING, value);
        }
    }
    resp
}

/// The answer to a request to the group that names no call.
fn not_served(not: NotServed) -> Response<ProxyBody> {
    match not {
        NotServed::NotFound(path) => failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        ),
        NotServed::MethodNotAllowed(method) => failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        ),
        NotServed::Unsupported(why) => failure(StatusCode::BAD_REQUEST, "BadRequest", why),
    }
}

/// The 404 for a session that is not live (here: on this replica, in that namespace).
fn not_found(name: &str) -> Response<ProxyBody> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("sessions.kube-ws-proxy.io \"{name}\" not found"),
    )
}

/// `value` as a JSON response.
fn json(code: StatusCode, value: &impl serde::Serialize) -> Response<ProxyBody> {
    // Plain strings, numbers and lists: serializing cannot fail.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
