//! Bearer-token authentication for impersonate and front-proxy modes: a TokenReview against the
//! upstream API server, made with the proxy's own credentials, with a short-lived cache so an
//! interactive session's many requests cost one review.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde::Deserialize;
use tracing::warn;

use super::identity::Identity;
use super::token_source::TokenSource;
use crate::proxy::upstream::{PooledClient, Upstream};

/// Where TokenReviews are posted.
const TOKEN_REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Largest TokenReview answer read.
const MAX_ANSWER: usize = 1024 * 1024;
/// Most cached tokens; beyond it expired entries are dropped, then everything.
const MAX_CACHED: usize = 10_000;
/// How long a rejected token stays rejected without asking again (bounds the load a client
/// hammering with a bad token can put on the API server).
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Why a token could not be reviewed (as opposed to being reviewed and rejected).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview request failed: {0}")]
    Request(String),
    #[error("TokenReview answered {0}: the proxy's credentials may lack the permission to create tokenreviews")]
    Refused(StatusCode),
    #[error("TokenReview answer is not valid: {0}")]
    Answer(String),
}

/// The outcome of a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    /// The token belongs to this identity.
    Authenticated(Identity),
    /// The API server does not accept the token.
    Rejected,
}

/// Reviews bearer tokens with the upstream.
pub struct TokenReviewer {
    upstream: Upstream,
    client: PooledClient,
    credentials: Option<Arc<TokenSource>>,
    ttl: Duration,
    cache: Mutex<HashMap<String, (Review, Instant)>>,
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
    /// any) with `credentials` as its bearer token; answers are cached for `ttl`.
    pub fn new(upstream: Upstream, credentials: Option<Arc<TokenSource>>, ttl: Duration) -> Self {
        let client = upstream.pooled_client();
        TokenReviewer {
            upstream,
            client,
            credentials,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Who `token` belongs to, from the cache or the API server.
    pub async fn review(&self, token: &str) -> Result<Review, ReviewError> {
        if let Some(cached) = self.cached(token) {
            return Ok(cached);
        }
        let review = self.ask(token).await?;
        let ttl = match review {
            Review::Authenticated(_) => self.ttl,
            Review::Rejected => self.ttl.min(NEGATIVE_TTL),
        };
        self.remember(token, review.clone(), ttl);
        Ok(review)
    }

    fn cached(&self, token: &str) -> Option<Review> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(token)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(review, _)| review.clone())
    }

    fn remember(&self, token: &str, review: Review, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED {
            let now = Instant::now();
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(token.to_owned(), (review, Instant::now() + ttl));
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
            .map_err(|e| ReviewError::Request(e.to_string()))?;
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(
                Full::new(Bytes::from(body.to_string()))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .map_err(|e| ReviewError::Request(e.to_string()))?;
        if let Some(own) = self.credentials.as_ref().and_then(|t| t.current()) {
            let value = HeaderValue::from_str(&format!("Bearer {own}")).map_err(|_| {
                ReviewError::Request("the proxy's token is not a valid header".into())
            })?;
            req.headers_mut().insert(header::AUTHORIZATION, value);
        }
        let resp = self
            .client
            .get()
            .request(req)
            .await
            .map_err(|e| ReviewError::Request(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ReviewError::Refused(status));
        }
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| ReviewError::Answer(e.to_string()))?
            .to_bytes();
        parse_answer(&bytes)
    }
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
}
