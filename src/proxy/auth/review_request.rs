//! The request every review the proxy asks of a cluster is (TokenReview, SelfSubjectReview,
//! SubjectAccessReview, SelfSubjectAccessReview): a JSON object POSTed to the review's path,
//! with the credentials it is made with.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};

use crate::proxy::wire::body::ProxyBody;

/// `body` POSTed as JSON to `uri`, with `authorization` as its `Authorization` when given.
pub fn review_request(
    uri: Uri,
    body: impl Into<Bytes>,
    authorization: Option<HeaderValue>,
) -> Request<ProxyBody> {
    let body = Full::new(body.into())
        .map_err(|never| match never {})
        .boxed();
    let mut req = Request::new(body);
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri;
    let json = HeaderValue::from_static("application/json");
    req.headers_mut().insert(header::CONTENT_TYPE, json.clone());
    req.headers_mut().insert(header::ACCEPT, json);
    if let Some(credentials) = authorization {
        req.headers_mut().insert(header::AUTHORIZATION, credentials);
    }
    req
}
