//! Kubernetes `Status` bodies as HTTP responses, for errors answered before any upgrade.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::body::ProxyBody;
use crate::translate::status::Status;

/// An HTTP response carrying `status` as JSON with the given HTTP code.
pub fn status_response(code: StatusCode, status: &Status) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from(status.to_json_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A Failure Status with `reason` and `message` as an HTTP response.
pub fn failure(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<ProxyBody> {
    let status = Status::failure(code.as_u16(), reason, message.into());
    status_response(code, &status)
}
