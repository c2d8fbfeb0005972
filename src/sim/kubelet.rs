//! The kubelet's own API behind `/api/v1/nodes/{node}/proxy/...`, as a kubelet serves it to
//! the API server's node proxy: `exec` and `attach` (GET or POST,
//! `/{verb}/{namespace}/{pod}[/{uid}]/{container}`), `portForward` (GET or POST,
//! `/portForward/{namespace}/{pod}[/{uid}]`) and `run` (POST, `/run/{namespace}/{pod}[/{uid}]/{container}`).
//!
//! The node is `sim-node` (`[scheme:]sim-node[:port]` as the API server splits it); any other
//! is a 404. The remainder after `proxy` is cleaned as Go's `path.Join` cleans it. Options
//! are the kubelet's: every `command`, and `input`, `output`, `error`, `tty` each on when `1`;
//! a WebSocket port-forward's `port`; `run`'s first `cmd` (a form body's first), split at
//! each space, run to its end with stdout and stderr as the answer.
//!
//! The query reaches the kubelet here as it came. Today's kube-apiserver drops the query of an
//! upgrade it proxies to a node (kubernetes#77142), so an exec through it carries no command;
//! a kubelet reached directly, or an API server that keeps the query, gets it as here.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::exec::{self, Target};
use super::http::{valid_name, with_a_stream};
use super::identity::SimIdentity;
use super::kill::KillSwitch;
use super::objects::{CONTAINERS, NODE_NAME};
use super::query::Query;
use super::response::{full, text_response, Body};
use super::{Inner, SessionKind};

/// Serves a request for `rest`, the segments after `nodes/{id}/proxy`.
pub(crate) async fn serve(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    user: &SimIdentity,
    id: &str,
    rest: &[&str],
) -> Response<Body> {
    if node_name(id) != Some(NODE_NAME) {
        return text_response(StatusCode::NOT_FOUND, &format!("nodes \"{id}\" not found"));
    }
    let cleaned = clean(rest);
    let segments: Vec<&str> = cleaned.iter().map(String::as_str).collect();
    if let [_, ns, pod, ..] = segments.as_slice() {
        if !valid_name(ns) || !valid_name(pod) {
            return text_response(StatusCode::NOT_FOUND, "pod does not exist");
        }
    }
    let method = req.method().clone();
    let query = Query::parse(req.uri().query());
    if matches!(
        segments.first(),
        Some(&("exec" | "attach" | "portForward" | "run"))
    ) {
        // A slow kubelet: nothing of the session starts before this.
        super::http::slow(inner.config.delays.streaming).await;
    }
    match segments.as_slice() {
        ["exec" | "attach", ns, pod, .., container] if segments.len() <= 5 => {
            if method != Method::GET && method != Method::POST {
                return method_not_allowed();
            }
            let kind = if segments[0] == "exec" {
                SessionKind::Exec
            } else {
                SessionKind::Attach
            };
            let target = match target(kind, &query, user, ns, pod, container) {
                Ok(t) => t,
                Err(refusal) => return refusal,
            };
            inner.touch_pod(ns, pod);
            super::http::start_exec(inner, kill, req, target, false).await
        }
        ["portForward", ns, pod, ..] if segments.len() <= 4 => {
            if method != Method::GET && method != Method::POST {
                return method_not_allowed();
            }
            inner.touch_pod(ns, pod);
            let ports = Query::from_pairs(
                query
                    .all("port")
                    .map(|p| ("ports".to_owned(), p.to_owned())),
            );
            super::http::port_forward(inner, kill, req, &ports, ns, pod, false).await
        }
        ["run", ns, pod, .., container] if segments.len() <= 5 => {
            if method != Method::POST {
                return method_not_allowed();
            }
            run(inner, req, query, user, ns, pod, container).await
        }
        _ => text_response(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

fn method_not_allowed() -> Response<Body> {
    text_response(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

/// The name of a `[scheme:]name[:port]` node id.
fn node_name(id: &str) -> Option<&str> {
    let parts: Vec<&str> = id.split(':').collect();
    let name: &str = match parts.as_slice() {
        [name] | [name, _] => name,
        [scheme, name, _] if matches!(*scheme, "" | "http" | "https") => name,
        _ => return None,
    };
    (!name.is_empty()).then_some(name)
}

/// The segments of the rooted, cleaned remainder (`.`, `..` and empty segments resolved).
fn clean(rest: &[&str]) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for segment in rest {
        match *segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s.to_owned()),
        }
    }
    kept
}

/// The exec or attach a kubelet path asks for, or the kubelet's refusal.
// The refusal is the response itself; it is built once per refused request.
#[allow(clippy::result_large_err)]
fn target(
    kind: SessionKind,
    query: &Query,
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Target, Response<Body>> {
    if !CONTAINERS.contains(&container) {
        return Err(text_response(
            StatusCode::NOT_FOUND,
            &format!("container \"{container}\" not found in pod \"{pod}\""),
        ));
    }
    let on = |key: &str| query.first(key) == Some("1");
    let tty = on("tty");
    let target = Target {
        kind,
        namespace: ns.to_owned(),
        pod: pod.to_owned(),
        container: container.to_owned(),
        command: query.all("command").map(str::to_owned).collect(),
        stdin: on("input"),
        stdout: on("output"),
        // The kubelet forces stderr off under a tty.
        stderr: on("error") && !tty,
        tty,
        dying: pod.starts_with("dying-"),
        user: user.clone(),
    };
    with_a_stream(target)
}

/// `run`: the command runs to its end; its stdout then stderr are the answer.
async fn run(
    inner: Arc<Inner>,
    req: Request<Incoming>,
    query: Query,
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    container: &str,
) -> Response<Body> {
    let form = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';').next().is_some_and(|m| {
                m.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        });
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return text_response(StatusCode::BAD_REQUEST, "cannot read the body"),
    };
    let from_body = form
        .then(|| Query::parse(Some(&String::from_utf8_lossy(&body))))
        .and_then(|q| q.first("cmd").map(str::to_owned));
    let cmd = from_body
        .or_else(|| query.first("cmd").map(str::to_owned))
        .unwrap_or_default();
    let Ok(mut target) = self::target(
        SessionKind::Exec,
        &Query::from_pairs([("output".to_owned(), "1".to_owned())]),
        user,
        ns,
        pod,
        container,
    ) else {
        return text_response(StatusCode::NOT_FOUND, "container not found");
    };
    target.command = cmd.split(' ').map(str::to_owned).collect();
    inner.touch_pod(ns, pod);
    match exec::run_to_end(&inner, &target).await {
        Ok(output) => {
            let mut resp = Response::new(full(output));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => text_response(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}
