//! The layers every request on the main listener passes through before it is routed, built
//! from tower-http: a panic in a handler becomes a 500 Status for that request (not a dropped
//! connection), credentials are marked sensitive so no log prints them, every request carries
//! an `Audit-ID` (the header kube-apiserver takes as its audit id, so the proxy's log lines and
//! session audit events name the same id as the cluster's audit log), and each request runs in
//! a tracing span that names it.

use std::any::Any;

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::sensitive_headers::SetSensitiveHeadersLayer;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::{error, Level, Span};

use crate::proxy::observability::metrics::Metrics;
use crate::translate::status::Status;

/// kube-apiserver's audit id header: a request that carries one is audited under that id (and
/// the API server answers with it); the proxy sets one where the client did not.
pub static AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

/// Headers whose values never reach a log: credentials, and `Sec-WebSocket-Protocol`, which
/// may carry a bearer token (`base64url.bearer.authorization.k8s.io.<token>`).
const SENSITIVE: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::SET_COOKIE,
    header::SEC_WEBSOCKET_PROTOCOL,
];

/// Longest client `Audit-ID` kept. kube-apiserver makes UUIDs (36 bytes) and cuts any id to
/// 64 bytes where it logs it; an id longer than that names no request better, and is copied
/// into every log line and audit event of the request.
pub const MAX_CLIENT_AUDIT_ID: usize = 64;

/// Wraps the routing service in the request layers (outermost first: panics, sensitive
/// headers, a client audit id that is not acceptable dropped, the audit id, the span, the
/// audit id echoed in the answer).
pub fn wrap<S, ReqBody, ResBody>(
    service: S,
    metrics: Metrics,
) -> impl tower::Service<
    Request<ReqBody>,
    Response = Response<impl hyper::body::Body<Data = Bytes, Error = tower_http::BoxError>>,
    Error = S::Error,
    Future = impl std::future::Future<
        Output = Result<
            Response<impl hyper::body::Body<Data = Bytes, Error = tower_http::BoxError>>,
            S::Error,
        >,
    > + Send,
> + Clone
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    ReqBody: hyper::body::Body + Send + 'static,
    ResBody: hyper::body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tower_http::BoxError> + std::fmt::Display,
{
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(PanicResponse { metrics }))
        .layer(SetSensitiveHeadersLayer::new(SENSITIVE))
        .map_request(drop_unacceptable_audit_id::<ReqBody>)
        .layer(SetRequestIdLayer::new(AUDIT_ID.clone(), MakeAuditId))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                // Per-request lines only when asked for (RUST_LOG=debug); the session lines at
                // info already say what each session did.
                .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                // An upstream's 5xx is its answer, not the proxy's failure.
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        .layer(PropagateRequestIdLayer::new(AUDIT_ID.clone()))
        .service(service)
}

/// The span a request's log lines carry: method, path (the query may hold a command's
/// arguments), audit id, and the cluster it goes to once it is routed (its session's lines
/// carry the span too).
fn request_span<B>(req: &Request<B>) -> Span {
    let audit_id = req
        .headers()
        .get(&AUDIT_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        audit_id = %audit_id,
        cluster = tracing::field::Empty,
    )
}

/// The audit id of a request, as set by [`wrap`] (or by the client).
pub fn audit_id(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(&AUDIT_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Whether a client's `Audit-ID` value is kept: 1 to [`MAX_CLIENT_AUDIT_ID`] bytes, each an
/// HTTP token character (RFC 9110 §5.6.2: letters, digits and ``!#$%&'*+-.^_`|~``). That takes
/// UUIDs and the other id forms in use (ULIDs, base64url, dotted or prefixed ids) and keeps
/// out what would make an id mean something else where it is written: spaces and controls
/// (a text log line's field separators), `"` and `\` (escapes in JSON), `,` and `;` (list
/// and parameter separators in a header), and bytes that are not ASCII.
pub fn is_acceptable_audit_id(value: &[u8]) -> bool {
    (1..=MAX_CLIENT_AUDIT_ID).contains(&value.len()) && value.iter().all(|b| is_tchar(*b))
}

/// An RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Removes a client `Audit-ID` the proxy will not pass on, so that the next layer makes one as
/// for a request without: a value that is not [acceptable](is_acceptable_audit_id), or more
/// than one line (which one the API server would take is its reading, not ours).
fn drop_unacceptable_audit_id<B>(mut req: Request<B>) -> Request<B> {
    let mut values = req.headers().get_all(&AUDIT_ID).iter();
    let keep = match (values.next(), values.next()) {
        (None, _) => true,
        (Some(one), None) => is_acceptable_audit_id(one.as_bytes()),
        (Some(_), Some(_)) => false,
    };
    if !keep {
        req.headers_mut().remove(&AUDIT_ID);
    }
    req
}

/// Makes a random (version 4) UUID, the form kube-apiserver makes its own audit ids in.
#[derive(Debug, Clone, Copy, Default)]
pub struct MakeAuditId;

impl MakeRequestId for MakeAuditId {
    fn make_request_id<B>(&mut self, _request: &Request<B>) -> Option<RequestId> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).ok()?;
        HeaderValue::from_str(&uuid_v4(bytes))
            .ok()
            .map(RequestId::new)
    }
}

/// Formats 16 random bytes as a version 4, variant 1 UUID (RFC 9562 §5.4).
fn uuid_v4(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0x0f), 16).unwrap_or('0'));
    }
    out
}

/// The answer to a request whose handler panicked: 500 with a Status, an error line and a
/// count (`kube_ws_proxy_handler_panics_total`); the connection and every other request go on.
#[derive(Clone)]
struct PanicResponse {
    metrics: Metrics,
}

impl tower_http::catch_panic::ResponseForPanic for PanicResponse {
    type ResponseBody = http_body_util::combinators::UnsyncBoxBody<Bytes, tower_http::BoxError>;

    fn response_for_panic(
        &mut self,
        err: Box<dyn Any + Send + 'static>,
    ) -> Response<Self::ResponseBody> {
        let what = panic_message(err.as_ref());
        error!(panic = %what, "a request handler panicked: answered 500");
        self.metrics.handler_panicked();
        let status = Status::failure(
            500,
            "InternalError",
            "kube-ws-proxy failed while handling this request (see its log)".to_owned(),
        );
        let body = serde_json::to_vec(&status).unwrap_or_default();
        let mut resp = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// The text a panic was raised with, where it is one.
fn panic_message(err: &(dyn Any + Send)) -> &str {
    err.downcast_ref::<&str>()
        .copied()
        .or_else(|| err.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not text)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use std::convert::Infallible;
    use tower::{service_fn, ServiceExt};

    fn ok_service() -> impl tower::Service<
        Request<Empty<Bytes>>,
        Response = Response<crate::proxy::wire::body::ProxyBody>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        service_fn(|req: Request<Empty<Bytes>>| async move {
            if req.uri().path() == "/panic" {
                panic!("handler bug");
            }
            // What the handler saw, so the tests can check the layers' effect on the request.
            let seen = format!(
                "{}|{}",
                audit_id(req.headers()).unwrap_or_default(),
                req.headers()
                    .get(header::AUTHORIZATION)
                    .map(|v| v.is_sensitive())
                    .unwrap_or_default()
            );
            Ok::<_, Infallible>(Response::new(
                Full::new(Bytes::from(seen))
                    .map_err(|never| match never {})
                    .boxed(),
            ))
        })
    }

    async fn call(req: Request<Empty<Bytes>>) -> (Response<()>, String) {
        let metrics = Metrics::new();
        let resp = wrap(ok_service(), metrics).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (
            Response::from_parts(parts, ()),
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn a_request_without_an_audit_id_gets_one_and_the_answer_names_it() {
        let req = Request::builder()
            .uri("/api")
            .header(header::AUTHORIZATION, "Bearer secret")
            .body(Empty::new())
            .unwrap();
        let (resp, seen) = call(req).await;
        let (id, sensitive) = seen.split_once('|').unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "version 4: {id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_eq!(resp.headers()[&AUDIT_ID], id);
        assert_eq!(sensitive, "true", "credentials are marked sensitive");
    }

    #[tokio::test]
    async fn a_callers_audit_id_is_kept() {
        let req = Request::builder()
            .uri("/api")
            .header("Audit-ID", "from-the-client")
            .body(Empty::new())
            .unwrap();
        let (resp, seen) = call(req).await;
        assert!(seen.starts_with("from-the-client|"), "{seen}");
        assert_eq!(resp.headers()[&AUDIT_ID], "from-the-client");
    }

    #[tokio::test]
    async fn a_callers_audit_id_that_is_long_or_odd_or_repeated_is_replaced() {
        let long = "a".repeat(MAX_CLIENT_AUDIT_ID + 1);
        for bad in [&long[..], "two words", "quote\"d", "a,b", "caf\u{e9}", ""] {
            let req = Request::builder()
                .uri("/api")
                .header("Audit-ID", HeaderValue::from_bytes(bad.as_bytes()).unwrap())
                .body(Empty::new())
                .unwrap();
            let (resp, seen) = call(req).await;
            let (id, _) = seen.split_once('|').unwrap();
            assert_eq!(id.len(), 36, "{bad:?} replaced by a UUID: {id}");
            assert_eq!(resp.headers()[&AUDIT_ID], id);
        }
        let req = Request::builder()
            .uri("/api")
            .header("Audit-ID", "one")
            .header("Audit-ID", "two")
            .body(Empty::new())
            .unwrap();
        let (resp, seen) = call(req).await;
        assert_eq!(seen.split_once('|').unwrap().0.len(), 36, "{seen}");
        assert_eq!(resp.headers().get_all(&AUDIT_ID).iter().count(), 1);
    }

    #[test]
    fn acceptable_audit_ids() {
        for good in [
            "8b0f6a52-1d2e-4c3b-9a8f-0e1d2c3b4a59",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "trace.span_1~x",
            &"x".repeat(MAX_CLIENT_AUDIT_ID),
        ] {
            assert!(is_acceptable_audit_id(good.as_bytes()), "{good}");
        }
        for bad in [
            &b""[..],
            b"a b",
            b"a\tb",
            b"a\"b",
            b"a\\b",
            b"a,b",
            b"a;b",
            b"\xe9",
            &[b'x'; MAX_CLIENT_AUDIT_ID + 1],
        ] {
            assert!(!is_acceptable_audit_id(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_with_a_status() {
        let metrics = Metrics::new();
        let req = Request::builder().uri("/panic").body(Empty::new()).unwrap();
        let resp = wrap(ok_service(), metrics.clone())
            .oneshot(req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "InternalError");
        assert_eq!(status["code"], 500);
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(
            text.contains("kube_ws_proxy_handler_panics_total 1"),
            "{text}"
        );
    }

    #[test]
    fn uuid_v4_vector() {
        assert_eq!(uuid_v4([0; 16]), "00000000-0000-4000-8000-000000000000");
        assert_eq!(uuid_v4([0xff; 16]), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(
            uuid_v4(*b"\x01\x23\x45\x67\x89\xab\xcd\xef\x01\x23\x45\x67\x89\xab\xcd\xef"),
            "01234567-89ab-4def-8123-456789abcdef"
        );
    }
}
