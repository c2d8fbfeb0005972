//! Bearer-token authentication for impersonate and front-proxy modes: a TokenReview against the
//! upstream API server, made with the proxy's own credentials, with a short-lived cache so an
//! interactive session's many requests cost one review.
//!
//! What a review may cost is bounded: requests with the same token wait for the one review in
//! flight instead of each making their own, each caller address has a budget of reviews
//! ([`ReviewLimiter`]), and the API server's answer must come within a time limit.

use super::review_request::review_request;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use tokio::sync::watch;
use tracing::warn;

use super::identity::Identity;
use super::review::Review;
use super::review_cache::ReviewCache;
use super::review_limiter::{ReviewLimiter, ReviewLimits};
use crate::proxy::upstream::endpoint::{PooledClient, Upstream};
use crate::proxy::upstream::error::{Chained, UpstreamFailure};
use crate::proxy::upstream::token_source::TokenSource;

/// Where TokenReviews are posted.
const TOKEN_REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Largest TokenReview answer read.
const MAX_ANSWER: usize = 1024 * 1024;
/// How long a rejected token stays rejected without asking again (bounds the load a client
/// hammering with a bad token can put on the API server).
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Why a token could not be reviewed (as opposed to being reviewed and rejected).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReviewError {
    #[error("too many token reviews from this address; try again shortly")]
    RateLimited,
    #[error("TokenReview did not answer within {0:?}")]
    Timeout(Duration),
    /// The request could not be made or got no answer: `cause` for the log (the whole error
    /// chain), `reason` for the client.
    #[error("TokenReview request failed: {cause}")]
    Request { cause: String, reason: String },
    /// The API server's `message`, if its answer was a Status, is the cause.
    #[error("TokenReview answered {status}{}: the proxy's credentials may lack the permission to create tokenreviews", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused {
        status: StatusCode,
        message: Option<String>,
    },
    #[error("TokenReview answer is not valid: {0}")]
    Answer(String),
}

impl ReviewError {
    /// What the caller (not authenticated yet) is told: the kind of failure, never the
    /// upstream's address, what TLS said or the API server's message about the proxy's
    /// credentials. The log gets the whole error ([`Authenticator::log_rejection`]).
    ///
    /// [`Authenticator::log_rejection`]: super::Authenticator::log_rejection
    pub fn client_reason(&self) -> String {
        match self {
            ReviewError::RateLimited | ReviewError::Timeout(_) => self.to_string(),
            ReviewError::Request { reason, .. } => format!("the TokenReview failed: {reason}"),
            ReviewError::Refused { status, .. } => {
                format!("the TokenReview was refused with HTTP {}", status.as_u16())
            }
            ReviewError::Answer(_) => "the TokenReview's answer is not valid".to_owned(),
        }
    }

    /// A request that failed before it was sent (the proxy's own making): nothing of the
    /// upstream in it.
    fn local(why: impl std::fmt::Display) -> ReviewError {
        ReviewError::Request {
            cause: why.to_string(),
            reason: "kube-ws-proxy could not make the request".to_owned(),
        }
    }
}

/// Largest part of a refusal's Status message kept for the log.
const MAX_REFUSAL_MESSAGE: usize = 512;

/// Reviews bearer tokens with the upstream.
pub struct TokenReviewer {
    upstream: Upstream,
    client: PooledClient,
    credentials: Option<Arc<TokenSource>>,
    ttl: Duration,
    timeout: Duration,
    limiter: Arc<ReviewLimiter>,
    state: Mutex<Reviews>,
}

/// Answers remembered and reviews in flight, by token.
#[derive(Default)]
struct Reviews {
    cache: ReviewCache,
    in_flight: HashMap<String, watch::Receiver<Option<Result<Review, ReviewError>>>>,
}

/// What a request with an uncached token does: wait for the review already in flight, or make
/// it.
enum Turn {
    Wait(watch::Receiver<Option<Result<Review, ReviewError>>>),
    Lead(watch::Sender<Option<Result<Review, ReviewError>>>),
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("upstream", &self.upstream)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    status: AnswerStatus,
}

#[derive(Deserialize, Default)]
struct AnswerStatus {
    #[serde(default)]
    authenticated: bool,
    #[serde(default)]
    user: AnswerUser,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize, Default)]
struct AnswerUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
}

impl TokenReviewer {
    /// A reviewer posting to `upstream` (whose TLS carries the proxy's client certificate, if
    /// any) with `credentials` as its bearer token; answers are cached for `ttl`, each must
    /// arrive within `timeout`, and each caller address gets the review budget `limits`.
    pub fn new(
        upstream: Upstream,
        credentials: Option<Arc<TokenSource>>,
        ttl: Duration,
        timeout: Duration,
        limits: ReviewLimits,
    ) -> Self {
        let client = upstream.pooled_client();
        TokenReviewer {
            upstream,
            client,
            credentials,
            ttl,
            timeout,
            limiter: ReviewLimiter::new(limits),
            state: Mutex::new(Reviews::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reviews> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Who `token` belongs to, from the cache, the review of it already in flight, or the API
    /// server (charged to `caller`'s budget).
    pub async fn review(&self, token: &str, caller: IpAddr) -> Result<Review, ReviewError> {
        loop {
            let turn = {
                let mut state = self.lock();
                if let Some(cached) = state.cache.get(token) {
                    return Ok(cached);
                }
                match state.in_flight.get(token) {
                    Some(rx) => Turn::Wait(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        state.in_flight.insert(token.to_owned(), rx);
                        Turn::Lead(tx)
                    }
                }
            };
            match turn {
                Turn::Wait(mut rx) => {
                    if let Ok(answer) = rx.wait_for(Option::is_some).await {
                        return answer.clone().expect("waited for an answer");
                    }
                    // The request making the review went away before its answer: take over.
                }
                Turn::Lead(tx) => {
                    let _in_flight = InFlight {
                        reviewer: self,
                        token,
                    };
                    let answer = self.review_now(token, caller).await;
                    if let Ok(review) = &answer {
                        let ttl = match review {
                            Review::Authenticated(_) => self.ttl,
                            Review::Rejected => self.ttl.min(NEGATIVE_TTL),
                        };
                        self.lock().cache.insert(token, review.clone(), ttl);
                    }
                    let _ = tx.send(Some(answer.clone()));
                    return answer;
                }
            }
        }
    }

    /// Makes one review, within `caller`'s budget and the time limit.
    async fn review_now(&self, token: &str, caller: IpAddr) -> Result<Review, ReviewError> {
        let _permit = self
            .limiter
            .acquire(caller)
            .map_err(|_| ReviewError::RateLimited)?;
        tokio::time::timeout(self.timeout, self.ask(token))
            .await
            .map_err(|_| ReviewError::Timeout(self.timeout))?
    }

    async fn ask(&self, token: &str) -> Result<Review, ReviewError> {
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": { "token": token },
        });
        let uri = self
            .upstream
            .uri(TOKEN_REVIEW_PATH)
            .map_err(ReviewError::local)?;
        let own = match self.credentials.as_ref().and_then(|t| t.current()) {
            Some(own) => Some(
                HeaderValue::from_str(&format!("Bearer {own}"))
                    .map_err(|_| ReviewError::local("the proxy's token is not a valid header"))?,
            ),
            None => None,
        };
        let req = review_request(uri, body.to_string(), own);
        let resp = self.client.get().request(req).await.map_err(|e| {
            let chained = Chained(&e);
            ReviewError::Request {
                cause: chained.to_string(),
                reason: chained.client_reason(),
            }
        })?;
        let status = resp.status();
        if !status.is_success() {
            let body = Limited::new(resp.into_body(), MAX_ANSWER).collect().await;
            let message = body.ok().and_then(|b| status_message(&b.to_bytes()));
            return Err(ReviewError::Refused { status, message });
        }
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| ReviewError::Answer(e.to_string()))?
            .to_bytes();
        parse_answer(&bytes)
    }
}

/// A review in flight: its entry goes when the review ends, however it ends.
struct InFlight<'a> {
    reviewer: &'a TokenReviewer,
    token: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.reviewer.lock().in_flight.remove(self.token);
    }
}

/// The `message` of a Kubernetes Status (why the API server refused the review: RBAC, an
/// expired token of the proxy's), cut to [`MAX_REFUSAL_MESSAGE`] bytes.
pub(super) fn status_message(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Status {
        message: String,
    }
    let mut message = serde_json::from_slice::<Status>(body).ok()?.message;
    if message.len() > MAX_REFUSAL_MESSAGE {
        let mut cut = MAX_REFUSAL_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    Some(message)
}

/// Reads a TokenReview answer.
fn parse_answer(bytes: &[u8]) -> Result<Review, ReviewError> {
    let answer: Answer =
        serde_json::from_slice(bytes).map_err(|e| ReviewError::Answer(e.to_string()))?;
    let status = answer.status;
    if !status.authenticated {
        if !status.error.is_empty() {
            // The API server's reason; never contains the token.
            tracing::debug!(reason = %status.error, "token rejected by TokenReview");
        }
        return Ok(Review::Rejected);
    }
    match Identity::new(status.user.username, status.user.groups, status.user.extra) {
        Ok(id) => Ok(Review::Authenticated(id)),
        Err(e) => {
            warn!(error = %e, "TokenReview returned an identity that cannot be forwarded");
            Ok(Review::Rejected)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_answer() {
        let json = br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview",
            "status":{"authenticated":true,"user":{"username":"alice","uid":"1",
            "groups":["dev","system:authenticated"],"extra":{"Scopes":["a"]}}}}"#;
        let Review::Authenticated(id) = parse_answer(json).unwrap() else {
            panic!("not authenticated")
        };
        assert_eq!(id.user(), "alice");
        assert_eq!(id.groups(), ["dev", "system:authenticated"]);
        assert_eq!(id.extra()["scopes"], ["a"]);
    }

    #[test]
    fn rejected_and_malformed_answers() {
        assert_eq!(
            parse_answer(br#"{"status":{"authenticated":false,"error":"invalid bearer token"}}"#)
                .unwrap(),
            Review::Rejected
        );
        assert_eq!(parse_answer(br#"{}"#).unwrap(), Review::Rejected);
        // Authenticated with an identity that cannot be forwarded is a rejection, not a pass.
        assert_eq!(
            parse_answer(br#"{"status":{"authenticated":true,"user":{"username":""}}}"#).unwrap(),
            Review::Rejected
        );
        assert!(matches!(
            parse_answer(b"not json"),
            Err(ReviewError::Answer(_))
        ));
    }

    #[test]
    fn a_refusal_logs_the_api_servers_message_and_tells_the_caller_only_its_code() {
        let message = status_message(
            br#"{"kind":"Status","message":"tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:p:p\" cannot create resource"}"#,
        );
        let e = ReviewError::Refused {
            status: StatusCode::FORBIDDEN,
            message,
        };
        assert!(e.to_string().contains("cannot create resource"), "{e}");
        assert_eq!(
            e.client_reason(),
            "the TokenReview was refused with HTTP 403"
        );
        // A long message is cut on a character boundary.
        let long = format!(r#"{{"message":"{}"}}"#, "é".repeat(MAX_REFUSAL_MESSAGE));
        let cut = status_message(long.as_bytes()).unwrap();
        assert!(cut.len() <= MAX_REFUSAL_MESSAGE + '…'.len_utf8() && cut.ends_with('…'));
        assert_eq!(status_message(b"not a status"), None);
    }

    #[test]
    fn a_request_that_failed_tells_the_caller_its_kind_and_the_log_its_cause() {
        let e = ReviewError::Request {
            cause: "client error (Connect): TLS handshake with 10.0.0.1:6443 failed: UnknownIssuer"
                .into(),
            reason: "the TLS handshake with the upstream API server failed".into(),
        };
        assert!(e.to_string().contains("UnknownIssuer"));
        assert_eq!(
            e.client_reason(),
            "the TokenReview failed: the TLS handshake with the upstream API server failed"
        );
    }
}
