//! Whether a caller may do what it asks of the proxy's sessions API, decided by the cluster's
//! own authorizer (RBAC), per cluster:
//!
//! - impersonate and front-proxy modes (the proxy authenticated the caller): a
//!   SubjectAccessReview made with the proxy's own credentials, naming the caller's user,
//!   groups and extra;
//! - passthrough: a SelfSubjectAccessReview made with the caller's own credentials, as its
//!   requests carry them upstream (its bearer token; none, so anonymously, for a caller
//!   without one), so the proxy spends no privilege of its own.
//!
//! Decisions are kept briefly ([`ALLOWED_TTL`], [`DENIED_TTL`]) per caller (its identity, or a
//! hash of its credentials) and request, in a bounded cache; reviews made are charged to the
//! caller's address ([`ReviewLimiter`]), and each must be answered within a time limit. A
//! review that fails is never "allowed": it is an [`AccessReviewError`], which [`answer`]
//! turns into a Status.

use super::review_request::review_request;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::access_attributes::{AccessAttributes, Decision};
use super::review_cache::ReviewCache;
use super::review_limiter::{ReviewLimiter, ReviewLimits};
use super::self_subject_review::SelfSubjectReviews;
use super::token_review::status_message;
use super::Caller;
use crate::proxy::observability::log_throttle::{LogThrottle, Verdict};
use crate::proxy::upstream::endpoint::{PooledClient, Upstream};
use crate::proxy::upstream::error::{Chained, UpstreamFailure};
use crate::proxy::upstream::token_source::TokenSource;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// Where SubjectAccessReviews are posted.
pub const SUBJECT_ACCESS_REVIEW_PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
/// Where SelfSubjectAccessReviews are posted.
pub const SELF_SUBJECT_ACCESS_REVIEW_PATH: &str =
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
/// How long an allowed request stays allowed without asking again.
pub const ALLOWED_TTL: Duration = Duration::from_secs(10);
/// How long a denied request stays denied without asking again: short, so a grant takes
/// effect soon, yet a caller retrying a forbidden call costs the API server one review per
/// this time.
pub const DENIED_TTL: Duration = Duration::from_secs(2);
/// Largest review answer read.
const MAX_ANSWER: usize = 256 * 1024;

/// Why the cluster could not decide (as opposed to deciding no).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AccessReviewError {
    #[error("too many access reviews from this address; try again shortly")]
    RateLimited,
    #[error(
        "kube-ws-proxy does not serve its sessions API to requests with Impersonate-* headers"
    )]
    Impersonation,
    /// Passthrough: the upstream does not authenticate the caller's credentials (401).
    #[error("Unauthorized")]
    Unauthenticated,
    /// The caller is not of the kind this cluster's reviews are made for (a passthrough caller
    /// at a cluster that impersonates, or the reverse): a bug, never a decision.
    #[error("the caller does not match the cluster's auth mode")]
    WrongMode,
    #[error("the access review did not answer within {0:?}")]
    Timeout(Duration),
    /// `cause` for the log (the whole error chain), `reason` for the client.
    #[error("the access review request failed: {cause}")]
    Request { cause: String, reason: String },
    /// The API server refused the review itself (the proxy's credentials lack `create
    /// subjectaccessreviews`, an expired token): its Status `message` is the cause.
    #[error("the access review was answered {status}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused {
        status: StatusCode,
        message: Option<String>,
    },
    #[error("the access review's answer is not valid: {0}")]
    Answer(String),
}

impl AccessReviewError {
    /// What the caller is told: the kind of failure, never the upstream's address or its
    /// message about the proxy's credentials (the log has them).
    pub fn client_reason(&self) -> String {
        match self {
            AccessReviewError::Request { reason, .. } => {
                format!("the access review failed: {reason}")
            }
            AccessReviewError::Refused { status, .. } => format!(
                "the access review was refused with HTTP {}",
                status.as_u16()
            ),
            AccessReviewError::Answer(_) => "the access review's answer is not valid".to_owned(),
            _ => self.to_string(),
        }
    }

    /// The Kubernetes Status answer: 429 (with `Retry-After`) for a spent budget, 401 for
    /// credentials the upstream does not authenticate, 403 for impersonation, 500 for what
    /// is the proxy's fault, 503 when the cluster could not decide.
    pub fn response(&self) -> Response<ProxyBody> {
        let (code, reason) = match self {
            AccessReviewError::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests"),
            AccessReviewError::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            AccessReviewError::Impersonation => (StatusCode::FORBIDDEN, "Forbidden"),
            AccessReviewError::WrongMode | AccessReviewError::Answer(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "InternalError")
            }
            _ => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        };
        let message = match self {
            AccessReviewError::Unauthenticated | AccessReviewError::Impersonation => {
                self.to_string()
            }
            _ => format!(
                "kube-ws-proxy cannot authorize the request: {}",
                self.client_reason()
            ),
        };
        let mut resp = failure(code, reason, message);
        if code == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }

    /// A bounded label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            AccessReviewError::RateLimited => "access_review_rate_limited",
            AccessReviewError::Impersonation => "impersonation_headers",
            AccessReviewError::Unauthenticated => "unauthenticated",
            AccessReviewError::WrongMode => "access_review_wrong_mode",
            AccessReviewError::Timeout(_) => "access_review_timeout",
            AccessReviewError::Request { .. } => "access_review_failed",
            AccessReviewError::Refused { .. } => "access_review_refused",
            AccessReviewError::Answer(_) => "access_review_invalid_answer",
        }
    }
}

/// The answer to a sessions API call before it is served: `None` when the cluster allowed
/// it (serve it), else the Status to answer with (403 worded as kube-apiserver's for a
/// denial, [`AccessReviewError::response`] for a failure).
pub fn answer(
    outcome: &Result<Decision, AccessReviewError>,
    attrs: &AccessAttributes,
) -> Option<Response<ProxyBody>> {
    match outcome {
        Ok(decision) if decision.allowed => None,
        Ok(decision) => Some(attrs.forbidden(decision)),
        Err(e) => Some(e.response()),
    }
}

/// Which review the cluster's callers get.
enum Reviewer {
    /// SubjectAccessReviews, sent with the proxy's own bearer token (its client certificate,
    /// if any, is in the upstream's TLS).
    Subject {
        credentials: Option<Arc<TokenSource>>,
    },
    /// SelfSubjectAccessReviews with the caller's credentials; `who` names a denied caller.
    SelfSubject { who: SelfSubjectReviews },
}

/// Asks one cluster whether callers may use the sessions API.
pub struct AccessReviews {
    upstream: Upstream,
    client: PooledClient,
    reviewer: Reviewer,
    timeout: Duration,
    limiter: Arc<ReviewLimiter>,
    cache: Mutex<ReviewCache<Decision>>,
    /// Failures are logged a few times per interval, not once per request.
    log: LogThrottle,
}

impl std::fmt::Debug for AccessReviews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.reviewer {
            Reviewer::Subject { .. } => "SubjectAccessReview",
            Reviewer::SelfSubject { .. } => "SelfSubjectAccessReview",
        };
        f.debug_struct("AccessReviews")
            .field("upstream", &self.upstream)
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

/// One review ready to be made: its cache key, where it goes, its body and credentials.
struct Prepared {
    key: String,
    path: &'static str,
    body: Vec<u8>,
    authorization: Option<HeaderValue>,
    /// The subject's user (SubjectAccessReview); `None`: ask who on a denial.
    user: Option<String>,
}

#[derive(Deserialize, Default)]
struct ReviewAnswer {
    #[serde(default)]
    status: ReviewStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ReviewStatus {
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    denied: bool,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    evaluation_error: String,
}

impl AccessReviews {
    /// SubjectAccessReviews (impersonate and front-proxy modes) posted to `upstream`, whose TLS
    /// carries the proxy's own client certificate if it has one, with `credentials` as its
    /// bearer token.
    pub fn subject(
        upstream: Upstream,
        credentials: Option<Arc<TokenSource>>,
        timeout: Duration,
        limits: ReviewLimits,
    ) -> AccessReviews {
        Self::new(upstream, Reviewer::Subject { credentials }, timeout, limits)
    }

    /// SelfSubjectAccessReviews (passthrough) posted to `upstream` (no credentials of the
    /// proxy's in its TLS) with each caller's own.
    pub fn self_subject(upstream: Upstream, timeout: Duration, limits: ReviewLimits) -> Self {
        let who = SelfSubjectReviews::default();
        Self::new(upstream, Reviewer::SelfSubject { who }, timeout, limits)
    }

    fn new(
        upstream: Upstream,
        reviewer: Reviewer,
        timeout: Duration,
        limits: ReviewLimits,
    ) -> Self {
        AccessReviews {
            client: upstream.pooled_client(),
            upstream,
            reviewer,
            timeout,
            limiter: ReviewLimiter::new(limits),
            cache: Mutex::new(ReviewCache::default()),
            log: LogThrottle::default(),
        }
    }

    /// Whether `caller`, whose request has `headers`, may do `attrs`: from the cache, or the
    /// cluster (charged to the caller's address).
    pub async fn authorize(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        attrs: &AccessAttributes,
    ) -> Result<Decision, AccessReviewError> {
        // Whom to review for an impersonating caller would be the cluster's call (its
        // `impersonate` rules): the proxy does not serve such calls rather than guess.
        if caller.impersonating().is_some() {
            return Err(AccessReviewError::Impersonation);
        }
        let prepared = self.prepare(caller, headers, attrs)?;
        if let Some(cached) = self.lock().get(&prepared.key) {
            return Ok(cached);
        }
        let _permit = self
            .limiter
            .acquire(caller.address())
            .map_err(|_| AccessReviewError::RateLimited)?;
        let decision = tokio::time::timeout(self.timeout, self.review(&prepared))
            .await
            .unwrap_or(Err(AccessReviewError::Timeout(self.timeout)));
        match &decision {
            Ok(d) => {
                let ttl = if d.allowed { ALLOWED_TTL } else { DENIED_TTL };
                self.lock().insert(&prepared.key, d.clone(), ttl);
            }
            Err(e) => self.log_failure(e),
        }
        decision
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReviewCache<Decision>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The review for `caller`, if this cluster's reviews are made for its kind.
    fn prepare(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        attrs: &AccessAttributes,
    ) -> Result<Prepared, AccessReviewError> {
        match (caller, &self.reviewer) {
            (Caller::Identified { identity, .. }, Reviewer::Subject { credentials }) => {
                let mut key = CacheKey::new("identity");
                key.part(identity.user());
                key.parts(identity.groups());
                key.part((identity.extra().len() as u64).to_be_bytes());
                for (name, values) in identity.extra() {
                    key.part(name);
                    key.parts(values);
                }
                let own = credentials.as_ref().and_then(|t| t.current());
                Ok(Prepared {
                    key: key.finish(attrs),
                    path: SUBJECT_ACCESS_REVIEW_PATH,
                    body: attrs.subject_access_review(identity),
                    authorization: own
                        .and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok()),
                    user: Some(identity.user().to_owned()),
                })
            }
            (Caller::Passthrough { bearer, .. }, Reviewer::SelfSubject { .. }) => {
                // As the passthrough path sends them: a subprotocol token replaces the header.
                let authorization = match bearer {
                    Some(token) => {
                        HeaderValue::from_str(&format!("Bearer {}", token.expose())).ok()
                    }
                    None => headers.get(header::AUTHORIZATION).cloned(),
                };
                let mut key = CacheKey::new("credentials");
                key.part(
                    authorization
                        .as_ref()
                        .map_or(&b""[..], HeaderValue::as_bytes),
                );
                Ok(Prepared {
                    key: key.finish(attrs),
                    path: SELF_SUBJECT_ACCESS_REVIEW_PATH,
                    body: attrs.self_subject_access_review(),
                    authorization,
                    user: None,
                })
            }
            _ => Err(AccessReviewError::WrongMode),
        }
    }

    /// Makes the review and reads the decision.
    async fn review(&self, prepared: &Prepared) -> Result<Decision, AccessReviewError> {
        let (status, body) = self.post(prepared).await?;
        if status == StatusCode::UNAUTHORIZED && prepared.user.is_none() {
            return Err(AccessReviewError::Unauthenticated);
        }
        if !status.is_success() {
            return Err(AccessReviewError::Refused {
                status,
                message: status_message(&body),
            });
        }
        let (allowed, reason) = read_decision(&body)?;
        let user = match (&prepared.user, &self.reviewer) {
            (Some(user), _) => user.clone(),
            (None, Reviewer::SelfSubject { who }) if !allowed => {
                let credentials = prepared.authorization.clone();
                let credentials = credentials.unwrap_or(HeaderValue::from_static(""));
                who.review(&self.client, &self.upstream, credentials, self.timeout)
                    .await
                    .user()
                    .map(|u| u.user)
                    .unwrap_or_default()
            }
            (None, _) => String::new(),
        };
        Ok(Decision {
            allowed,
            reason,
            user,
        })
    }

    /// POSTs the review; the status and (bounded) body of the answer.
    async fn post(&self, prepared: &Prepared) -> Result<(StatusCode, Bytes), AccessReviewError> {
        let local = |why: &dyn std::fmt::Display| AccessReviewError::Request {
            cause: why.to_string(),
            reason: "kube-ws-proxy could not make the request".to_owned(),
        };
        let uri = self.upstream.uri(prepared.path).map_err(|e| local(&e))?;
        let req = review_request(uri, prepared.body.clone(), prepared.authorization.clone());
        let resp = self.client.get().request(req).await.map_err(|e| {
            let chained = Chained(&e);
            AccessReviewError::Request {
                cause: chained.to_string(),
                reason: chained.client_reason(),
            }
        })?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| AccessReviewError::Answer(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }

    /// A review that could not be made is a warning operators must see (RBAC of the proxy's,
    /// the upstream down); aggregated per kind, as a caller can cause one per request.
    fn log_failure(&self, e: &AccessReviewError) {
        if matches!(e, AccessReviewError::Unauthenticated) {
            return;
        }
        if let Verdict::Log { suppressed } = self.log.check(e.label()) {
            warn!(error = %e, reason = e.label(), suppressed, "cannot authorize a sessions API call");
        }
    }
}

/// Whether a review's answer allows, and the authorizer's reason. `denied` wins over
/// `allowed` (an answer claiming both is not an allowance).
fn read_decision(body: &[u8]) -> Result<(bool, String), AccessReviewError> {
    let answer: ReviewAnswer =
        serde_json::from_slice(body).map_err(|e| AccessReviewError::Answer(e.to_string()))?;
    let status = answer.status;
    if !status.evaluation_error.is_empty() {
        tracing::debug!(error = %status.evaluation_error, "access review evaluation error");
    }
    Ok((status.allowed && !status.denied, status.reason))
}

/// A cache key: a hash of who asks (never their credentials themselves) and what.
struct CacheKey(Sha256);

impl CacheKey {
    fn new(kind: &str) -> CacheKey {
        let mut key = CacheKey(Sha256::new());
        key.part(kind);
        key
    }

    /// One field, length-prefixed so that no two different sequences hash alike.
    fn part(&mut self, field: impl AsRef<[u8]>) {
        let field = field.as_ref();
        self.0.update((field.len() as u64).to_be_bytes());
        self.0.update(field);
    }

    fn parts(&mut self, fields: &[String]) {
        self.part((fields.len() as u64).to_be_bytes());
        for f in fields {
            self.part(f);
        }
    }

    fn finish(mut self, attrs: &AccessAttributes) -> String {
        self.part(attrs.verb.as_str());
        for field in [
            attrs.namespace.as_deref(),
            attrs.subresource,
            attrs.name.as_deref(),
        ] {
            match field {
                None => self.part([0u8]),
                Some(value) => {
                    self.part([1u8]);
                    self.part(value);
                }
            }
        }
        format!("{:x}", self.0.finalize())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::audit::ImpersonatedUser;
    use crate::proxy::auth::access_attributes::SessionVerb;
    use crate::proxy::auth::Identity;
    use crate::proxy::upstream::endpoint::UpstreamTls;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn upstream() -> Upstream {
        Upstream::from_url("http://127.0.0.1:1", UpstreamTls::default()).unwrap()
    }

    fn reviews(subject: bool) -> AccessReviews {
        let (t, l) = (Duration::from_secs(1), ReviewLimits::default());
        if subject {
            AccessReviews::subject(upstream(), None, t, l)
        } else {
            AccessReviews::self_subject(upstream(), t, l)
        }
    }

    fn identified(user: &str, groups: &[&str]) -> Caller {
        let groups = groups.iter().map(|g| g.to_string()).collect();
        Caller::Identified {
            identity: Arc::new(Identity::new(user, groups, BTreeMap::new()).unwrap()),
            impersonating: None,
            address: LOCAL,
        }
    }

    fn passthrough() -> Caller {
        Caller::Passthrough {
            bearer: None,
            impersonating: None,
            address: LOCAL,
        }
    }

    fn attrs(verb: SessionVerb, ns: Option<&str>, name: Option<&str>) -> AccessAttributes {
        AccessAttributes {
            verb,
            namespace: ns.map(str::to_owned),
            subresource: None,
            name: name.map(str::to_owned),
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[test]
    fn cache_keys_tell_callers_and_requests_apart() {
        let r = reviews(true);
        let none = HeaderMap::new();
        let key = |caller: &Caller, a: &AccessAttributes| r.prepare(caller, &none, a).unwrap().key;
        let list = attrs(SessionVerb::List, None, None);
        let alice = identified("alice", &["dev"]);
        assert_eq!(
            key(&alice, &list),
            key(&identified("alice", &["dev"]), &list)
        );
        for other in [
            identified("bob", &["dev"]),
            identified("alice", &[]),
            identified("alice", &["dev", "ops"]),
            // The boundary between user and groups is not a place to hide in.
            identified("alicedev", &[]),
        ] {
            assert_ne!(key(&alice, &list), key(&other, &list), "{other:?}");
        }
        for a in [
            attrs(SessionVerb::Watch, None, None),
            attrs(SessionVerb::List, Some(""), None),
            attrs(SessionVerb::List, Some("team-a"), None),
            attrs(SessionVerb::List, None, Some("team-a")),
            AccessAttributes {
                subresource: Some("recording"),
                ..list.clone()
            },
        ] {
            assert_ne!(key(&alice, &list), key(&alice, &a), "{a:?}");
        }
    }

    #[test]
    fn passthrough_keys_are_a_hash_of_the_credentials_never_the_credentials() {
        let r = reviews(false);
        let list = attrs(SessionVerb::List, None, None);
        let key = |h: &HeaderMap| r.prepare(&passthrough(), h, &list).unwrap();
        let a = key(&bearer("secret-a"));
        assert!(!a.key.contains("secret-a"));
        assert_eq!(a.key.len(), 64);
        assert_eq!(a.authorization.unwrap(), "Bearer secret-a");
        assert_ne!(a.key, key(&bearer("secret-b")).key);
        assert_ne!(a.key, key(&HeaderMap::new()).key);
        // No credentials: asked anonymously, as the passthrough path would send the call.
        assert!(key(&HeaderMap::new()).authorization.is_none());
    }

    #[test]
    fn a_caller_of_the_other_kind_or_impersonating_is_refused_before_any_review() {
        let list = attrs(SessionVerb::List, None, None);
        let none = HeaderMap::new();
        assert!(matches!(
            reviews(false).prepare(&identified("alice", &[]), &none, &list),
            Err(AccessReviewError::WrongMode)
        ));
        assert!(matches!(
            reviews(true).prepare(&passthrough(), &none, &list),
            Err(AccessReviewError::WrongMode)
        ));
        let impersonating = Caller::Passthrough {
            bearer: None,
            impersonating: Some(ImpersonatedUser {
                user: Some("root".into()),
                uid: None,
                groups: vec![],
                extra: BTreeMap::new(),
            }),
            address: LOCAL,
        };
        let outcome = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(reviews(false).authorize(&impersonating, &none, &list));
        assert!(matches!(outcome, Err(AccessReviewError::Impersonation)));
        assert_eq!(
            answer(&outcome, &list).unwrap().status(),
            StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn failures_are_statuses_and_never_tell_the_caller_the_upstreams_words() {
        let cases = [
            (
                AccessReviewError::RateLimited,
                StatusCode::TOO_MANY_REQUESTS,
            ),
            (AccessReviewError::Unauthenticated, StatusCode::UNAUTHORIZED),
            (AccessReviewError::Impersonation, StatusCode::FORBIDDEN),
            (
                AccessReviewError::WrongMode,
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                AccessReviewError::Answer("eof".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                AccessReviewError::Timeout(Duration::from_secs(5)),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                AccessReviewError::Request {
                    cause: "TLS handshake with 10.0.0.1:6443 failed: UnknownIssuer".into(),
                    reason: "the TLS handshake with the upstream API server failed".into(),
                },
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                AccessReviewError::Refused {
                    status: StatusCode::FORBIDDEN,
                    message: Some("User \"system:serviceaccount:p:p\" cannot create".into()),
                },
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ];
        for (e, code) in cases {
            let resp = e.response();
            assert_eq!(resp.status(), code, "{e}");
            let reason = e.client_reason();
            assert!(
                !reason.contains("10.0.0.1") && !reason.contains("serviceaccount"),
                "{reason}"
            );
        }
        assert_eq!(
            AccessReviewError::RateLimited.response().headers()[header::RETRY_AFTER],
            "1"
        );
    }

    #[test]
    fn answers_are_read_as_the_api_server_writes_them() {
        let allowed = br#"{"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},"spec":{},"status":{"allowed":true,"reason":"RBAC: allowed by ClusterRoleBinding \"v\""}}"#;
        assert_eq!(
            read_decision(allowed).unwrap(),
            (
                true,
                r#"RBAC: allowed by ClusterRoleBinding "v""#.to_owned()
            )
        );
        let no_opinion = br#"{"status":{"allowed":false,"evaluationError":"role not found"}}"#;
        assert_eq!(read_decision(no_opinion).unwrap(), (false, String::new()));
        let both = br#"{"status":{"allowed":true,"denied":true,"reason":"webhook says no"}}"#;
        assert!(!read_decision(both).unwrap().0);
        assert!(!read_decision(b"{}").unwrap().0);
        assert!(matches!(
            read_decision(b"<html>"),
            Err(AccessReviewError::Answer(_))
        ));
    }

    #[test]
    fn an_allowed_decision_answers_nothing() {
        let list = attrs(SessionVerb::List, None, None);
        let allowed = Decision {
            allowed: true,
            reason: String::new(),
            user: "alice".into(),
        };
        assert!(answer(&Ok(allowed.clone()), &list).is_none());
        let denied = Decision {
            allowed: false,
            ..allowed
        };
        assert_eq!(
            answer(&Ok(denied), &list).unwrap().status(),
            StatusCode::FORBIDDEN
        );
    }
}
