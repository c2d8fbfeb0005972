//! The API server front: accept loop, request log, authentication, routing, JSON reads and
//! the checks an API server and kubelet make before a streaming upgrade.

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;

use super::exec::Target;
use super::kill::KillSwitch;
use super::objects::{self, CONTAINERS};
use super::status::Status;
use super::{logs, portforward, spdy, websocket, Inner, SeenRequest, SessionKind};

/// Response body of every answer.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The WebSocket subprotocol entry that carries a bearer token (PROTOCOL.md §1.2).
pub(crate) const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

pub(crate) fn empty() -> Body {
    Empty::new().boxed_unsync()
}

pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed_unsync()
}

/// A `text/plain` answer, as Go's `http.Error` writes it (kubelet errors).
pub(crate) fn text_response(status: StatusCode, text: &str) -> Response<Body> {
    let mut resp = Response::new(full(format!("{text}\n")));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A response with no header section beyond what HTTP needs (x/net's handshake refusals).
pub(crate) fn bare(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = status;
    resp
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An API server error (`kind: Status`) with its HTTP code.
pub(crate) fn status_response(status: &Status, code: u16) -> Response<Body> {
    let mut resp = Response::new(full(status.to_json_bytes()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn not_found() -> Response<Body> {
    status_response(
        &Status::api_error(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
        404,
    )
}

fn method_not_allowed(method: &Method) -> Response<Body> {
    status_response(
        &Status::api_error(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        ),
        405,
    )
}

fn bad_request(message: impl Into<String>) -> Response<Body> {
    status_response(&Status::api_error(400, "BadRequest", message), 400)
}

/// Accepts connections until the task is aborted; one HTTP/1.1 connection per task.
pub(crate) async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let kill = KillSwitch::for_stream(&tcp);
        let inner = inner.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let inner = inner.clone();
                let kill = kill.clone();
                async move { Ok::<_, Infallible>(handle(inner, kill, req).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new());
            let conn = builder
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Parsed query parameters, in order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(query: Option<&str>) -> Query {
        Query(
            query
                .map(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .into_owned()
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    pub(crate) fn first(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// API boolean: absent, `0` or `false` (any case) is false; anything else is true.
    pub(crate) fn flag(&self, name: &str) -> bool {
        match self.first(name) {
            None => false,
            Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
        }
    }
}

/// Comma-split, trimmed values of every `Sec-WebSocket-Protocol` line, in order.
pub(crate) fn offered_subprotocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether the request is authenticated (only checked when a token is configured).
fn authenticated(inner: &Inner, headers: &HeaderMap) -> bool {
    let Some(want) = &inner.config.require_bearer_token else {
        return true;
    };
    let from_header = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .any(|t| t == want);
    if from_header {
        return true;
    }
    let mut bearer = offered_subprotocols(headers)
        .into_iter()
        .filter_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX).map(str::to_string));
    match (bearer.next(), bearer.next()) {
        (Some(encoded), None) => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .is_some_and(|t| &t == want),
        _ => false,
    }
}

fn unauthorized() -> Response<Body> {
    status_response(&Status::api_error(401, "Unauthorized", "Unauthorized"), 401)
}

/// Kubernetes object names: a conservative character set, never `.` or `..`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=Table"))
}

async fn handle(inner: Arc<Inner>, kill: KillSwitch, req: Request<Incoming>) -> Response<Body> {
    inner.record_request(SeenRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: req.uri().query().map(str::to_string),
        headers: req
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    });
    if !authenticated(&inner, req.headers()) {
        return unauthorized();
    }
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .collect();
    let method = req.method().clone();
    let is_read = method == Method::GET || method == Method::HEAD;
    match segments.as_slice() {
        ["healthz"] | ["readyz"] | ["livez"] if is_read => {
            let mut r = Response::new(full("ok"));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        ["version"] if is_read => json_response(StatusCode::OK, &objects::version()),
        ["api"] if is_read => json_response(
            StatusCode::OK,
            &objects::api_versions(&inner.addr.to_string()),
        ),
        ["apis"] if is_read => json_response(StatusCode::OK, &objects::api_group_list()),
        ["api", "v1"] if is_read => json_response(StatusCode::OK, &objects::core_v1_resources()),
        ["api", "v1", "namespaces"] if is_read => {
            let names = inner.namespaces();
            if wants_table(req.headers()) {
                json_response(
                    StatusCode::OK,
                    &objects::namespace_table(&names, inner.started),
                )
            } else {
                json_response(
                    StatusCode::OK,
                    &objects::namespace_list(&names, inner.started),
                )
            }
        }
        ["api", "v1", "pods"] if is_read => pods_response(&inner, &req, None),
        ["api", "v1", "namespaces", ns] if is_read && valid_name(ns) => {
            inner.touch_namespace(ns);
            if wants_table(req.headers()) {
                json_response(
                    StatusCode::OK,
                    &objects::namespace_table(&[ns.to_string()], inner.started),
                )
            } else {
                json_response(StatusCode::OK, &objects::namespace(ns, inner.started))
            }
        }
        ["api", "v1", "namespaces", ns, "pods"] if is_read && valid_name(ns) => {
            inner.touch_namespace(ns);
            pods_response(&inner, &req, Some(ns))
        }
        ["api", "v1", "namespaces", ns, "pods", pod] if is_read => {
            if !valid_name(ns) || !valid_name(pod) {
                return pod_not_found(pod);
            }
            inner.touch_pod(ns, pod);
            if wants_table(req.headers()) {
                json_response(
                    StatusCode::OK,
                    &objects::pod_table(&[(ns.to_string(), pod.to_string())], inner.started),
                )
            } else {
                json_response(StatusCode::OK, &objects::pod(ns, pod, inner.started))
            }
        }
        ["api", "v1", "namespaces", ns, "pods", pod, sub]
            if matches!(*sub, "exec" | "attach" | "portforward" | "log") =>
        {
            let (ns, pod, sub) = (ns.to_string(), pod.to_string(), sub.to_string());
            subresource(inner, kill, req, &ns, &pod, &sub).await
        }
        _ if is_known_path(&segments) => method_not_allowed(&method),
        _ => not_found(),
    }
}

fn is_known_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["version"]
            | ["api"]
            | ["apis"]
            | ["api", "v1"]
            | ["api", "v1", "namespaces"]
            | ["api", "v1", "pods"]
            | ["api", "v1", "namespaces", _]
            | ["api", "v1", "namespaces", _, "pods"]
            | ["api", "v1", "namespaces", _, "pods", _]
    )
}

fn pod_not_found(pod: &str) -> Response<Body> {
    status_response(
        &Status::api_error(404, "NotFound", format!("pods \"{pod}\" not found"))
            .with_object(pod, "pods"),
        404,
    )
}

fn pods_response(inner: &Inner, req: &Request<Incoming>, ns: Option<&str>) -> Response<Body> {
    let pods = inner.pods(ns);
    if wants_table(req.headers()) {
        json_response(StatusCode::OK, &objects::pod_table(&pods, inner.started))
    } else {
        json_response(StatusCode::OK, &objects::pod_list(&pods, inner.started))
    }
}

/// exec / attach / portforward / log: API-server checks, kubelet checks, then the upgrade.
async fn subresource(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    ns: &str,
    pod: &str,
    sub: &str,
) -> Response<Body> {
    let method = req.method().clone();
    let allowed = match sub {
        "log" => method == Method::GET,
        _ => method == Method::GET || method == Method::POST,
    };
    if !allowed {
        return method_not_allowed(&method);
    }
    if !valid_name(ns) || !valid_name(pod) {
        return pod_not_found(pod);
    }
    inner.touch_pod(ns, pod);
    let query = Query::parse(req.uri().query());

    // Fault-injection pods.
    if pod.starts_with("forbidden-") {
        let verb = if method == Method::GET {
            "get"
        } else {
            "create"
        };
        let resource = match sub {
            "portforward" => "pods/portforward",
            "log" => "pods/log",
            "attach" => "pods/attach",
            _ => "pods/exec",
        };
        let message = format!(
            "pods \"{pod}\" is forbidden: User \"system:anonymous\" cannot {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\""
        );
        return status_response(
            &Status::api_error(403, "Forbidden", message).with_object(pod, "pods"),
            403,
        );
    }
    if pod.starts_with("error500-") {
        return text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "container runtime is not responding",
        );
    }

    if sub == "log" || sub == "exec" || sub == "attach" {
        let container = query
            .first("container")
            .unwrap_or(CONTAINERS[0])
            .to_string();
        if !CONTAINERS.contains(&container.as_str()) {
            return bad_request(format!("container {container} is not valid for pod {pod}"));
        }
        if sub == "log" {
            return logs::serve(inner, req, &query, ns, pod, &container).await;
        }
        let command: Vec<String> = query.all("command").map(str::to_string).collect();
        if sub == "exec" && command.is_empty() {
            return bad_request("you must specify at least one command for the container");
        }
        let tty = query.flag("tty");
        let target = Target {
            kind: if sub == "exec" {
                SessionKind::Exec
            } else {
                SessionKind::Attach
            },
            namespace: ns.to_string(),
            pod: pod.to_string(),
            container,
            command,
            stdin: query.flag("stdin"),
            stdout: query.flag("stdout"),
            // The kubelet forces stderr off under a tty.
            stderr: query.flag("stderr") && !tty,
            tty,
            dying: pod.starts_with("dying-"),
        };
        if !target.stdin && !target.stdout && !target.stderr {
            return text_response(
                StatusCode::BAD_REQUEST,
                "you must specify at least 1 of stdin, stdout, stderr",
            );
        }
        if is_websocket_upgrade(req.headers()) {
            return websocket::exec(inner, kill, req, target).await;
        }
        if spdy::wants_spdy(req.headers()) {
            return spdy_exec(inner, kill, req, target);
        }
        return bad_request("Upgrade request required");
    }

    // portforward
    if is_websocket_upgrade(req.headers()) {
        return portforward::websocket(inner, kill, req, &query, ns, pod).await;
    }
    if spdy::wants_spdy(req.headers()) {
        return portforward::spdy(inner, kill, req, ns, pod);
    }
    bad_request("Upgrade request required")
}

fn spdy_exec(
    inner: Arc<Inner>,
    kill: KillSwitch,
    mut req: Request<Incoming>,
    target: Target,
) -> Response<Body> {
    let version = match spdy::negotiate(req.headers(), &spdy::REMOTE_COMMAND_VERSIONS) {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = inner.next_session();
    let v = version.clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        inner.event(super::SimEvent::SessionStarted {
            session,
            kind: target.kind,
            transport: super::Transport::Spdy,
            protocol: v.clone(),
            namespace: target.namespace.clone(),
            pod: target.pod.clone(),
        });
        spdy::serve_exec(inner, TokioIo::new(upgraded), v, target, kill, session).await;
    });
    spdy::switching_protocols(&version)
}
