//! `authentication.k8s.io/v1`: TokenReview (is this token valid, and whose is it?) and
//! SelfSubjectReview (who am I? — `kubectl auth whoami`).
//!
//! Any caller that passed authentication may create either; a real cluster would ask RBAC
//! (`create tokenreviews` is usually reserved to front proxies and webhooks).

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::authn::token_user;
use super::identity::SimIdentity;
use super::response::{bad_request, json_response, Body};
use super::Inner;

/// Group and version of the review APIs.
pub(crate) const GROUP_VERSION: &str = "authentication.k8s.io/v1";
/// Largest review body read.
const MAX_BODY: usize = 1024 * 1024;
/// What a TokenReview says about a token the cluster does not know (the token authenticator's
/// wording).
const INVALID_TOKEN: &str = "invalid bearer token";

pub(crate) async fn read_json(req: Request<Incoming>) -> Result<Map<String, Value>, String> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("cannot read the request body: {e}"))?
        .to_bytes();
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err("the request body is not a JSON object".to_owned()),
        Err(e) => Err(format!("the request body is not JSON: {e}")),
    }
}

/// `POST …/tokenreviews`: answers for `spec.token`, echoing the review (201, as a create).
pub(crate) async fn token_review(inner: &Inner, req: Request<Incoming>) -> Response<Body> {
    let review = match read_json(req).await {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    if review
        .get("kind")
        .is_some_and(|k| k.as_str() != Some("TokenReview"))
    {
        return bad_request("the request body is not a TokenReview");
    }
    inner.count_token_review();
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let token = spec.get("token").and_then(Value::as_str).unwrap_or("");
    let mut status = Map::new();
    match token_user(&inner.config, token) {
        Some(user) => {
            status.insert("authenticated".into(), true.into());
            status.insert("user".into(), user.to_user_info());
            // The cluster's tokens are not audience-bound: valid for whatever was asked.
            if let Some(aud) = spec.get("audiences").filter(|a| a.as_array().is_some()) {
                status.insert("audiences".into(), aud.clone());
            }
        }
        None => {
            status.insert("authenticated".into(), false.into());
            status.insert("user".into(), json!({}));
            status.insert("error".into(), INVALID_TOKEN.into());
        }
    }
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "TokenReview",
            "apiVersion": GROUP_VERSION,
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    )
}

/// `POST …/selfsubjectreviews`: the caller's effective identity (201, as a create).
pub(crate) fn self_subject_review(user: &SimIdentity) -> Response<Body> {
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "SelfSubjectReview",
            "apiVersion": GROUP_VERSION,
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": user.to_user_info()},
        }),
    )
}
