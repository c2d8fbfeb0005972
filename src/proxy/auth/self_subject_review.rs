//! Who a passthrough caller is, for audit events: the proxy does not authenticate callers in
//! passthrough mode, so it asks the upstream with the caller's own credentials
//! (`SelfSubjectReview`, `kubectl auth whoami`). `authentication.k8s.io/v1` from 1.28,
//! `v1beta1` on 1.27; a cluster with neither, a refused review or a caller without
//! credentials is "unknown". A 401 is definite on any version: the API server authenticates
//! before it routes, so credentials it does not authenticate for the review it does not
//! authenticate for a session either ([`SelfReview::Unauthenticated`]). Answers are kept
//! briefly per credential, so a burst of sessions costs one review.

use super::review_request::review_request;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use tracing::debug;

use crate::proxy::upstream::endpoint::{PooledClient, Upstream};

/// Versions tried, newest first.
const VERSIONS: [&str; 2] = ["v1", "v1beta1"];
/// Largest answer read.
const MAX_ANSWER: usize = 256 * 1024;
/// How long an answer is reused for the same credentials.
const TTL: Duration = Duration::from_secs(10);
/// Credentials remembered at most; past that, expired entries go, then the cache is skipped.
const CAPACITY: usize = 4096;

/// A user as the upstream named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedUser {
    pub user: String,
    pub groups: Vec<String>,
}

/// What the upstream said of a caller's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelfReview {
    /// Who they belong to.
    User(ReviewedUser),
    /// It does not authenticate them (401).
    Unauthenticated,
    /// It could not say (no credentials, an older cluster, a refusal other than 401, no
    /// answer in time).
    Unknown,
}

impl SelfReview {
    /// The user, if the upstream named one.
    pub fn user(self) -> Option<ReviewedUser> {
        match self {
            SelfReview::User(user) => Some(user),
            _ => None,
        }
    }
}

/// Makes and remembers SelfSubjectReviews.
#[derive(Debug, Default)]
pub struct SelfSubjectReviews {
    /// Keyed by the `Authorization` value (empty: none).
    cache: Mutex<HashMap<HeaderValue, (Instant, SelfReview)>>,
}

#[derive(Deserialize, Default)]
struct Answer {
    #[serde(default)]
    status: AnswerStatus,
}

#[derive(Deserialize, Default)]
struct AnswerStatus {
    #[serde(default, rename = "userInfo")]
    user_info: AnswerUser,
}

#[derive(Deserialize, Default)]
struct AnswerUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
}

impl SelfSubjectReviews {
    /// Who `credentials` (an `Authorization` value as it goes upstream) belong to; `None` when
    /// there are none or the upstream cannot say within `timeout`.
    pub async fn who(
        &self,
        client: &PooledClient,
        upstream: &Upstream,
        credentials: Option<HeaderValue>,
        timeout: Duration,
    ) -> Option<ReviewedUser> {
        let credentials = credentials?;
        self.review(client, upstream, credentials, timeout)
            .await
            .user()
    }

    /// What the upstream says of `credentials` (an `Authorization` value as it goes upstream,
    /// or an empty one for a request without: asked anonymously), within `timeout`.
    pub async fn review(
        &self,
        client: &PooledClient,
        upstream: &Upstream,
        credentials: HeaderValue,
        timeout: Duration,
    ) -> SelfReview {
        if let Some(cached) = self.cached(&credentials) {
            return cached;
        }
        let answer = tokio::time::timeout(timeout, ask(client, upstream, &credentials))
            .await
            .unwrap_or(SelfReview::Unknown);
        self.remember(credentials, answer.clone());
        answer
    }

    fn cached(&self, credentials: &HeaderValue) -> Option<SelfReview> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(credentials)
            .filter(|(expires, _)| *expires > Instant::now())
            .map(|(_, user)| user.clone())
    }

    fn remember(&self, credentials: HeaderValue, user: SelfReview) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if cache.len() >= CAPACITY {
            cache.retain(|_, (expires, _)| *expires > now);
            if cache.len() >= CAPACITY {
                return;
            }
        }
        cache.insert(credentials, (now + TTL, user));
    }
}

/// Asks each version in turn; a version the upstream does not serve (404) moves on.
async fn ask(client: &PooledClient, upstream: &Upstream, credentials: &HeaderValue) -> SelfReview {
    for version in VERSIONS {
        let path = format!("/apis/authentication.k8s.io/{version}/selfsubjectreviews");
        let body = serde_json::json!({
            "apiVersion": format!("authentication.k8s.io/{version}"),
            "kind": "SelfSubjectReview",
        });
        let Ok(uri) = upstream.uri(&path) else {
            return SelfReview::Unknown;
        };
        let authorization = (!credentials.is_empty()).then(|| credentials.clone());
        let req = review_request(uri, body.to_string(), authorization);
        let resp = match client.get().request(req).await {
            Ok(resp) => resp,
            Err(e) => {
                debug!(error = %e, "SelfSubjectReview failed");
                return SelfReview::Unknown;
            }
        };
        match resp.status() {
            StatusCode::NOT_FOUND => continue,
            StatusCode::UNAUTHORIZED => return SelfReview::Unauthenticated,
            s if s.is_success() => {
                let Ok(body) = Limited::new(resp.into_body(), MAX_ANSWER).collect().await else {
                    return SelfReview::Unknown;
                };
                return parse_answer(&body.to_bytes())
                    .map_or(SelfReview::Unknown, SelfReview::User);
            }
            s => {
                debug!(status = s.as_u16(), "SelfSubjectReview refused");
                return SelfReview::Unknown;
            }
        }
    }
    SelfReview::Unknown
}

fn parse_answer(bytes: &[u8]) -> Option<ReviewedUser> {
    let answer: Answer = serde_json::from_slice(bytes).ok()?;
    let user = answer.status.user_info;
    (!user.username.is_empty()).then_some(ReviewedUser {
        user: user.username,
        groups: user.groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let json = br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview",
            "status":{"userInfo":{"username":"tina","groups":["dev","system:authenticated"]}}}"#;
        assert_eq!(
            parse_answer(json),
            Some(ReviewedUser {
                user: "tina".into(),
                groups: vec!["dev".into(), "system:authenticated".into()],
            })
        );
        assert_eq!(parse_answer(br#"{"status":{}}"#), None);
        assert_eq!(parse_answer(b"not json"), None);
    }

    #[test]
    fn the_cache_keeps_answers_and_stays_bounded() {
        let reviews = SelfSubjectReviews::default();
        let a = HeaderValue::from_static("Bearer a");
        assert_eq!(reviews.cached(&a), None);
        let tina = ReviewedUser {
            user: "tina".into(),
            groups: vec![],
        };
        reviews.remember(a.clone(), SelfReview::User(tina.clone()));
        assert_eq!(reviews.cached(&a), Some(SelfReview::User(tina)));
        for n in 0..CAPACITY + 10 {
            let key = HeaderValue::from_str(&format!("Bearer {n}")).unwrap();
            reviews.remember(key, SelfReview::Unauthenticated);
        }
        assert!(reviews.cache.lock().unwrap().len() <= CAPACITY);
    }
}
