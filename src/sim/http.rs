//! The API server front: accept loop (HTTP or HTTPS), request log, authentication and
//! impersonation, routing, JSON reads and the checks an API server and kubelet make before a
//! streaming upgrade.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use super::access;
use super::authn::{self, Authenticated};
use super::exec::Target;
use super::identity::SimIdentity;
use super::impersonation;
use super::kill::KillSwitch;
use super::objects::{self, CONTAINERS};
use super::peer_cert::PeerCert;
use super::query::Query;
use super::response::{bad_request, full, json_response, status_response, text_response, Body};
use super::status::Status;
use super::watch;
use super::{
    kubelet, logs, portforward, reviews, spdy, tunnel, websocket, Inner, SeenRequest, SessionKind,
};

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

/// Longest TLS handshake a client may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one connection tells about its client, shared by its requests.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    /// The verified client certificate, if one was presented.
    pub peer: Option<PeerCert>,
}

/// Accepts connections until the task is aborted; one connection per task.
pub(crate) async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_tcp(inner.clone(), tcp, peer));
    }
}

/// Serves one TCP connection: plain HTTP/1.1, or TLS and then HTTP/1.1 or h2 by ALPN.
async fn serve_tcp(inner: Arc<Inner>, tcp: TcpStream, peer: std::net::SocketAddr) {
    // Made before any TLS wrapping: a `dying-*` pod cuts the TCP connection underneath.
    let kill = KillSwitch::for_stream(&tcp);
    let Some(tls) = &inner.tls else {
        return serve_http(inner, kill, Connection::default(), tcp, false, peer).await;
    };
    let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let (_, session) = stream.get_ref();
    let h2 = session.alpn_protocol() == Some(b"h2");
    let conn = Connection {
        peer: session
            .peer_certificates()
            .and_then(|chain| tls.verifiers.classify(chain)),
    };
    serve_http(inner, kill, conn, stream, h2, peer).await;
}

async fn serve_http<S>(
    inner: Arc<Inner>,
    kill: KillSwitch,
    conn: Connection,
    io: S,
    h2: bool,
    peer: std::net::SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(conn);
    let service = hyper::service::service_fn(move |req| {
        let inner = inner.clone();
        let kill = kill.clone();
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(handle(inner, kill, &conn, req).await) }
    });
    let result = if h2 {
        // Plain API calls only: upgrades (SPDY, WebSocket) are HTTP/1.1, and clients that
        // want them offer only http/1.1.
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(TokioIo::new(io), service)
            .await
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new());
        builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades()
            .await
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
}

fn unauthorized() -> Response<Body> {
    status_response(&Status::api_error(401, "Unauthorized", "Unauthorized"), 401)
}

/// Kubernetes object names: a conservative character set, never `.` or `..`.
pub(crate) fn valid_name(name: &str) -> bool {
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

/// The identity a request acts as.
struct Effective {
    user: SimIdentity,
    impersonated: bool,
}

/// The outcome of authentication and impersonation for one request.
struct Identified {
    /// The caller as authenticated; `None`: 401.
    authn: Option<Authenticated>,
    /// Who to act as, or the refusal to answer with.
    effective: Result<Effective, Response<Body>>,
}

/// Authenticates, then impersonates.
fn identify(inner: &Inner, conn: &Connection, headers: &HeaderMap) -> Identified {
    let Some(authn) = authn::authenticate(&inner.config, conn.peer.as_ref(), headers) else {
        return Identified {
            authn: None,
            effective: Err(unauthorized()),
        };
    };
    let effective =
        match impersonation::apply(&inner.config.impersonators, &authn.identity, headers) {
            Ok(Some(user)) => Ok(Effective {
                user,
                impersonated: true,
            }),
            Ok(None) => Ok(Effective {
                user: authn.identity.clone(),
                impersonated: false,
            }),
            Err(e) => {
                let (status, code) = e.status();
                Err(status_response(&status, code))
            }
        };
    Identified {
        authn: Some(authn),
        effective,
    }
}

/// One request: identify and record the caller, the checks before any handler, then route.
async fn handle(
    inner: Arc<Inner>,
    kill: KillSwitch,
    conn: &Connection,
    req: Request<Incoming>,
) -> Response<Body> {
    let Identified { authn, effective } = identify(&inner, conn, req.headers());
    record(&inner, &req, authn, &effective);
    if !inner.config.streaming.accepts_spdy() && spdy::wants_spdy(req.headers()) {
        // What a gateway that dropped SPDY answers, before the API server sees the request.
        return text_response(
            StatusCode::BAD_REQUEST,
            "SPDY upgrades are not allowed on this path; use WebSocket",
        );
    }
    if has_bad_escape(req.uri().path()) {
        return go_bad_request();
    }
    let user = match effective {
        Ok(e) => e.user,
        Err(refusal) => return refusal,
    };
    route(inner, kill, req, &user).await
}

/// Adds the request, and who it came from and acts as, to the requests the sim has seen.
fn record(
    inner: &Inner,
    req: &Request<Incoming>,
    authn: Option<Authenticated>,
    effective: &Result<Effective, Response<Body>>,
) {
    let (user, impersonated) = match effective {
        Ok(e) => (Some(e.user.clone()), e.impersonated),
        Err(_) => (None, false),
    };
    inner.record_request(SeenRequest {
        version: format!("{:?}", req.version()),
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
        user,
        authenticated_by: authn.as_ref().map(|a| a.by),
        authenticated_user: authn.map(|a| a.identity),
        impersonated,
    });
}

/// The handler for the path and method: reviews, a pod's subresources, reads; 405 for a
/// known path with another method, 404 for the rest.
async fn route(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    user: &SimIdentity,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .collect();
    let method = req.method().clone();
    match segments.as_slice() {
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if method == Method::POST => {
            slow(inner.config.delays.reviews).await;
            reviews::token_review(&inner, req).await
        }
        ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"] if method == Method::POST => {
            slow(inner.config.delays.reviews).await;
            reviews::self_subject_review(user)
        }
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]
            if method == Method::POST =>
        {
            slow(inner.config.delays.reviews).await;
            access::subject_access_review(&inner, req, user).await
        }
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]
            if method == Method::POST =>
        {
            slow(inner.config.delays.reviews).await;
            access::self_subject_access_review(&inner, req, user).await
        }
        ["api", "v1", "namespaces", ns, "pods", pod, sub]
            if matches!(*sub, "exec" | "attach" | "portforward" | "log") =>
        {
            let (ns, pod, sub) = (ns.to_string(), pod.to_string(), sub.to_string());
            subresource(inner, kill, req, user, &ns, &pod, &sub).await
        }
        // The segments after `proxy`, empty ones kept as the request info keeps them.
        ["api", "v1", "nodes", id, "proxy", ..] => {
            let id = id.to_string();
            let rest: Vec<String> = path
                .trim_start_matches('/')
                .splitn(6, '/')
                .nth(5)
                .unwrap_or("")
                .trim_end_matches('/')
                .split('/')
                .map(str::to_owned)
                .collect();
            let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
            kubelet::serve(inner, kill, req, user, &id, &rest).await
        }
        ["api", "v1", "pods"] | ["api", "v1", "namespaces", _, "pods"]
            if method == Method::GET
                && segments.get(3).is_none_or(|ns| valid_name(ns))
                && watch::wanted(&Query::parse(req.uri().query())) =>
        {
            let ns = segments.get(3).map(|ns| ns.to_string());
            watch::serve(inner, &Query::parse(req.uri().query()), ns.as_deref())
        }
        _ => {
            let is_read = method == Method::GET || method == Method::HEAD;
            let read = is_read
                .then(|| serve_read(&inner, &req, &segments))
                .flatten();
            read.unwrap_or_else(|| {
                if is_known_path(&segments) {
                    method_not_allowed(&method)
                } else {
                    not_found()
                }
            })
        }
    }
}

/// `/apis` as the client asks for it: the aggregated `APIGroupDiscoveryList` in the first of
/// `apidiscovery.k8s.io` `v2` or `v2beta1` its `Accept` names, else the v1 `APIGroupList`.
fn apis_response(req: &Request<Incoming>) -> Response<Body> {
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let version = accept.split(',').find_map(|range| {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        let aggregated = params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"as=APIGroupDiscoveryList");
        ["v2", "v2beta1"]
            .into_iter()
            .find(|v| aggregated && params.contains(&format!("v={v}").as_str()))
    });
    let Some(version) = version else {
        return json_response(StatusCode::OK, &objects::api_group_list());
    };
    let mut resp = json_response(StatusCode::OK, &objects::api_group_discovery_list(version));
    let content_type =
        format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList");
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// The answer to a GET or HEAD of `segments`: health, discovery, namespaces and pods; `None`
/// for a path no read serves.
fn serve_read(inner: &Inner, req: &Request<Incoming>, segments: &[&str]) -> Option<Response<Body>> {
    let ok = |value: &serde_json::Value| json_response(StatusCode::OK, value);
    let response = match segments {
        ["healthz"] | ["readyz"] | ["livez"] => {
            let mut r = Response::new(full("ok"));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        ["version"] => ok(&objects::version()),
        ["api"] => ok(&objects::api_versions(&inner.addr.to_string())),
        ["apis"] => apis_response(req),
        ["apis", "authentication.k8s.io"] => ok(&objects::authentication_group()),
        ["apis", "authentication.k8s.io", "v1"] => ok(&objects::authentication_v1_resources()),
        ["api", "v1"] => ok(&objects::core_v1_resources()),
        ["api", "v1", "namespaces"] => namespaces_response(inner, req),
        ["api", "v1", "pods"] => pods_response(inner, req, None),
        ["api", "v1", "namespaces", ns] if valid_name(ns) => namespace_response(inner, req, ns),
        ["api", "v1", "namespaces", ns, "pods"] if valid_name(ns) => {
            inner.touch_namespace(ns);
            pods_response(inner, req, Some(ns))
        }
        ["api", "v1", "namespaces", ns, "pods", pod] => pod_response(inner, req, ns, pod),
        _ => return None,
    };
    Some(response)
}

fn namespaces_response(inner: &Inner, req: &Request<Incoming>) -> Response<Body> {
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

fn namespace_response(inner: &Inner, req: &Request<Incoming>, ns: &str) -> Response<Body> {
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

fn pod_response(inner: &Inner, req: &Request<Incoming>, ns: &str, pod: &str) -> Response<Body> {
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

/// Waits `delay` ([`SimDelays`](super::SimDelays)); no wait at all when it is zero (a zero
/// sleep would still wait for the timer's next tick).
pub(super) async fn slow(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// Whether a path has a `%` that is not followed by two hex digits: Go's `net/http` refuses
/// such a request line before any handler (or authentication) sees it.
fn has_bad_escape(path: &str) -> bool {
    let b = path.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// Go's `net/http` answer to a request it cannot parse: plain text, and the connection closed.
fn go_bad_request() -> Response<Body> {
    let mut resp = Response::new(full("400 Bad Request"));
    *resp.status_mut() = StatusCode::BAD_REQUEST;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// How long a `denied-*` pod's admission denial is: larger than any 64 KiB buffer.
const DENIAL_LEN: usize = 96 * 1024;

/// The 403 an admission webhook (a policy engine denying `CONNECT` on pods/exec …) gives a
/// `denied-*` pod: a Kubernetes Status whose message lists every rule that failed, more than
/// 64 KiB of it, ending with `end of denial`.
fn admission_denial(pod: &str, sub: &str) -> Response<Body> {
    let mut message = format!(
        "admission webhook \"policy.sim.example\" denied the request: pods/{sub} of pod {pod}:"
    );
    let mut rule = 0;
    while message.len() < DENIAL_LEN {
        rule += 1;
        message.push_str(&format!(
            " rule {rule}: interactive access is not allowed here;"
        ));
    }
    message.push_str(" end of denial");
    status_response(
        &Status::api_error(403, "Forbidden", message).with_object(pod, "pods"),
        403,
    )
}

fn is_known_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["version"]
            | ["api"]
            | ["apis"]
            | ["apis", "authentication.k8s.io"]
            | ["apis", "authentication.k8s.io", "v1"]
            | ["apis", "authentication.k8s.io", "v1", "tokenreviews"]
            | ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]
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
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    sub: &str,
) -> Response<Body> {
    if let Err(refusal) = api_server_checks(&inner, req.method(), user, ns, pod, sub) {
        return refusal;
    }
    // A slow cluster: nothing of the session starts before this.
    slow(inner.config.delays.streaming).await;
    let query = Query::parse(req.uri().query());
    // A new API server serves these itself (translator, tunnel); everything else goes to the
    // kubelet's own handlers.
    let native =
        inner.config.streaming.accepts_websocket_streaming() && is_websocket_upgrade(req.headers());
    let translated = native && sub != "portforward" && websocket::offers_v5(req.headers());
    let tunnelled = native && sub == "portforward" && tunnel::offers_tunnel(req.headers());
    // The translator accepts the WebSocket before it dials the kubelet, so a kubelet error
    // comes inside the WebSocket (below); everywhere else it is the HTTP answer.
    if pod.starts_with("error500-") && !translated {
        return text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "container runtime is not responding",
        );
    }
    if sub == "portforward" {
        return port_forward(inner, kill, req, &query, ns, pod, tunnelled).await;
    }
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
    match exec_target(&query, user, ns, pod, sub, container) {
        Ok(target) => start_exec(inner, kill, req, target, translated).await,
        Err(refusal) => refusal,
    }
}

/// What the API server checks before it proxies a subresource: the method, the names, the
/// caller's rights (`forbidden-*` pods) and admission (`denied-*` pods).
// The refusal is the response itself; it is built once per refused request.
#[allow(clippy::result_large_err)]
fn api_server_checks(
    inner: &Inner,
    method: &Method,
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    sub: &str,
) -> Result<(), Response<Body>> {
    let allowed = match sub {
        "log" => method == Method::GET,
        _ => method == Method::GET || method == Method::POST,
    };
    if !allowed {
        return Err(method_not_allowed(method));
    }
    if !valid_name(ns) || !valid_name(pod) {
        return Err(pod_not_found(pod));
    }
    inner.touch_pod(ns, pod);
    // Fault-injection pods.
    if pod.starts_with("forbidden-") {
        return Err(forbidden(method, user, ns, pod, sub));
    }
    if pod.starts_with("denied-") && sub != "log" {
        return Err(admission_denial(pod, sub));
    }
    Ok(())
}

/// The 403 RBAC gives a `forbidden-*` pod.
fn forbidden(
    method: &Method,
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    sub: &str,
) -> Response<Body> {
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
        "pods \"{pod}\" is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\"",
        user.name
    );
    status_response(
        &Status::api_error(403, "Forbidden", message).with_object(pod, "pods"),
        403,
    )
}

/// The exec or attach session the query asks for, or the kubelet's 400.
// The refusal is the response itself; it is built once per refused request.
#[allow(clippy::result_large_err)]
fn exec_target(
    query: &Query,
    user: &SimIdentity,
    ns: &str,
    pod: &str,
    sub: &str,
    container: String,
) -> Result<Target, Response<Body>> {
    let command: Vec<String> = query.all("command").map(str::to_string).collect();
    if sub == "exec" && command.is_empty() {
        return Err(bad_request(
            "you must specify at least one command for the container",
        ));
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
        user: user.clone(),
    };
    with_a_stream(target)
}

/// `target`, or the kubelet's 400 when it asks for no stream at all.
// The refusal is the response itself; it is built once per refused request.
#[allow(clippy::result_large_err)]
pub(crate) fn with_a_stream(target: Target) -> Result<Target, Response<Body>> {
    if !target.stdin && !target.stdout && !target.stderr {
        return Err(text_response(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    Ok(target)
}

/// The exec or attach upgrade, by the transport the request asks for.
pub(crate) async fn start_exec(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    target: Target,
    translated: bool,
) -> Response<Body> {
    if translated && target.pod.starts_with("error500-") {
        let status = Status::internal_error(
            "unable to upgrade connection: container runtime is not responding",
        );
        return websocket::exec_refused(inner, req, target, status).await;
    }
    if is_websocket_upgrade(req.headers()) {
        return websocket::exec(inner, kill, req, target).await;
    }
    if spdy::wants_spdy(req.headers()) {
        return spdy_exec(inner, kill, req, target);
    }
    bad_request("Upgrade request required")
}

/// The port-forward upgrade: the API server's own tunnel, or the kubelet's WebSocket or SPDY.
pub(crate) async fn port_forward(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    query: &Query,
    ns: &str,
    pod: &str,
    tunnelled: bool,
) -> Response<Body> {
    if tunnelled {
        return portforward::tunnel(inner, kill, req, ns, pod);
    }
    if is_websocket_upgrade(req.headers()) {
        return portforward::websocket(inner, kill, req, query, ns, pod).await;
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
