//! The answers the simulated cluster's handlers build: the body type and plain, JSON, Status
//! and text responses, shared by the router and every handler.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use serde_json::Value;

use super::status::Status;

/// Response body of every answer.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

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

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
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

pub(crate) fn bad_request(message: impl Into<String>) -> Response<Body> {
    status_response(&Status::api_error(400, "BadRequest", message), 400)
}
