//! Who the caller is (`--auth-mode`) and what the upstream is told about it.
//!
//! - `passthrough`: the caller's credentials go upstream unchanged; a bearer token from the
//!   WebSocket subprotocol list becomes `Authorization`. The proxy adds nothing of its own.
//! - `impersonate`: the proxy authenticates the caller (client certificate, else a bearer token
//!   checked by TokenReview) and calls upstream with its own credentials plus `Impersonate-*`.
//! - `front-proxy`: as `impersonate`, but the identity travels in request-header authentication
//!   (`X-Remote-User` …) on a connection made with the proxy's front-proxy client certificate.
//!
//! Calls to the proxy's own sessions API are authorized by the cluster ([`access_review`]:
//! a SubjectAccessReview, or in passthrough a SelfSubjectAccessReview with the caller's own
//! credentials).

pub mod access_attributes;
pub mod access_review;
mod client_cert;
mod identity;
mod impersonation;
mod outbound;
mod review;
mod review_cache;
mod review_limiter;
mod review_request;
pub mod self_subject_review;
mod token_review;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{self, HeaderMap};
use http::{Response, StatusCode};

pub use access_attributes::{AccessAttributes, Decision, SessionVerb};
pub use access_review::{AccessReviewError, AccessReviews};
pub use client_cert::{identity_from_certificate, ClientCertError, PeerCertificate};
pub use identity::{Identity, IdentityError, AUTHENTICATED_GROUP};
pub use impersonation::requested_impersonation;
pub use outbound::{is_impersonation_header, FrontProxyHeaders, Outbound};
pub use review::Review;
pub use review_limiter::ReviewLimits;
pub use token_review::{ReviewError, TokenReviewer};

use crate::audit::bounds::log_field;
use crate::audit::ImpersonatedUser;
use crate::proxy::observability::log_throttle::{LogThrottle, Verdict};
use crate::proxy::upstream::token_source::TokenSource;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::translate::subprotocol::BearerToken;

/// How the proxy treats the caller's identity.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// Forward the caller's own credentials; the proxy adds none.
    #[default]
    Passthrough,
    /// Authenticate the caller, then impersonate it with the proxy's credentials.
    Impersonate,
    /// Authenticate the caller, then assert it with request-header authentication.
    FrontProxy,
}

/// The caller of one request, as far as the upstream needs to know.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Passthrough: whatever credentials the request carries, plus a subprotocol token.
    Passthrough {
        bearer: Option<BearerToken>,
        /// Whom the caller's own `Impersonate-*` headers ask to act as (they go upstream).
        impersonating: Option<ImpersonatedUser>,
        /// Where it calls from ([`Caller::address`]).
        address: IpAddr,
    },
    /// An authenticated identity (impersonate and front-proxy modes).
    Identified {
        identity: Arc<Identity>,
        /// Front-proxy mode: whom the caller's own `Impersonate-*` headers ask to act as
        /// (they go upstream beside the asserted identity). Always `None` in impersonate
        /// mode, which refuses them.
        impersonating: Option<ImpersonatedUser>,
        /// Where it calls from ([`Caller::address`]).
        address: IpAddr,
    },
}

impl Caller {
    /// The authenticated user, if the proxy authenticated the caller, for log lines: its
    /// beginning, as [`log_field`] bounds it.
    pub fn user(&self) -> Option<&str> {
        match self {
            Caller::Passthrough { .. } => None,
            Caller::Identified { identity, .. } => Some(log_field(identity.user())),
        }
    }

    /// The address its per-address budgets are charged to (TokenReviews, refused sessions):
    /// the client's, or with `--trust-x-forwarded-for` the one its `X-Forwarded-For` names.
    pub fn address(&self) -> IpAddr {
        match self {
            Caller::Passthrough { address, .. } | Caller::Identified { address, .. } => *address,
        }
    }

    /// Whom the caller asks to act as with its own `Impersonate-*` headers, if it does.
    pub fn impersonating(&self) -> Option<&ImpersonatedUser> {
        match self {
            Caller::Passthrough { impersonating, .. }
            | Caller::Identified { impersonating, .. } => impersonating.as_ref(),
        }
    }
}

/// Why a request is refused before anything is forwarded.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    #[error("Unauthorized")]
    Unauthenticated,
    #[error("kube-ws-proxy does not accept Impersonate-* headers in impersonate mode: it impersonates the authenticated caller itself")]
    ImpersonationHeaders,
    #[error("kube-ws-proxy cannot authenticate the request: {0}")]
    Unavailable(#[from] ReviewError),
    /// The connection's client certificate names more than one user (several CNs).
    #[error("Unauthorized: the client certificate's subject has more than one common name")]
    AmbiguousCertificate,
}

impl Rejection {
    /// The Kubernetes Status answer.
    pub fn response(&self) -> Response<ProxyBody> {
        let (code, reason) = match self {
            Rejection::Unauthenticated | Rejection::AmbiguousCertificate => {
                (StatusCode::UNAUTHORIZED, "Unauthorized")
            }
            Rejection::ImpersonationHeaders => (StatusCode::FORBIDDEN, "Forbidden"),
            Rejection::Unavailable(ReviewError::RateLimited) => {
                (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests")
            }
            Rejection::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        };
        let message = match self {
            // The cause is logged; the caller, not authenticated yet, gets its kind.
            Rejection::Unavailable(e) => format!(
                "kube-ws-proxy cannot authenticate the request: {}",
                e.client_reason()
            ),
            _ => self.to_string(),
        };
        let mut resp = failure(code, reason, message);
        if code == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        resp
    }

    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::ImpersonationHeaders => "impersonation_headers",
            Rejection::Unavailable(ReviewError::RateLimited) => "token_review_rate_limited",
            Rejection::Unavailable(_) => "authentication_unavailable",
            Rejection::AmbiguousCertificate => "ambiguous_client_certificate",
        }
    }
}

/// Authenticates callers and writes what the upstream must know.
#[derive(Debug)]
pub struct Authenticator {
    mode: AuthMode,
    reviewer: Option<TokenReviewer>,
    outbound: Outbound,
    /// Refusals a caller can cause once per request are logged a few times, not each time.
    rejection_log: LogThrottle,
}

impl Authenticator {
    /// Passthrough: no authentication, no credentials added.
    pub fn passthrough() -> Self {
        Authenticator {
            mode: AuthMode::Passthrough,
            reviewer: None,
            outbound: Outbound {
                mode: AuthMode::Passthrough,
                token: None,
                front_proxy: FrontProxyHeaders::default(),
            },
            rejection_log: LogThrottle::default(),
        }
    }

    /// An authenticator for `mode`. `reviewer` checks bearer tokens (without it only client
    /// certificates authenticate); `token` is the proxy's own bearer token for impersonation.
    pub fn new(
        mode: AuthMode,
        reviewer: Option<TokenReviewer>,
        token: Option<Arc<TokenSource>>,
        front_proxy: FrontProxyHeaders,
    ) -> Self {
        Authenticator {
            mode,
            reviewer,
            outbound: Outbound {
                mode,
                token: if mode == AuthMode::Impersonate {
                    token
                } else {
                    None
                },
                front_proxy,
            },
            rejection_log: LogThrottle::default(),
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Decides who the caller is. `bearer` is the subprotocol token (WebSocket requests);
    /// `certificate` what the verified client certificate on this connection says.
    ///
    /// A certificate whose identity is ambiguous is refused in every mode, passthrough
    /// included: the proxy does not use it there, but nothing good comes from serving it.
    /// `caller` is the address a TokenReview is charged to.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        bearer: Option<BearerToken>,
        certificate: &PeerCertificate,
        caller: IpAddr,
    ) -> Result<Caller, Rejection> {
        let certificate = match certificate {
            PeerCertificate::Refused(_) => return Err(Rejection::AmbiguousCertificate),
            PeerCertificate::Identified(id) => Some(id),
            PeerCertificate::None => None,
        };
        // Kept for the audit where they go upstream (passthrough, front-proxy); refused below
        // in impersonate mode.
        let impersonating = requested_impersonation(headers);
        if self.mode == AuthMode::Passthrough {
            return Ok(Caller::Passthrough {
                bearer,
                impersonating,
                address: caller,
            });
        }
        if self.mode == AuthMode::Impersonate && headers.keys().any(is_impersonation_header) {
            return Err(Rejection::ImpersonationHeaders);
        }
        let identified = |identity| Caller::Identified {
            identity,
            impersonating,
            address: caller,
        };
        // The API server's order: a client certificate first, then tokens.
        if let Some(id) = certificate {
            return Ok(identified(id.clone()));
        }
        let header_token = bearer_from_authorization(headers);
        let token = match (&bearer, header_token) {
            (Some(b), _) => b.expose(),
            (None, Some(t)) => t,
            (None, None) => return Err(Rejection::Unauthenticated),
        };
        let Some(reviewer) = &self.reviewer else {
            return Err(Rejection::Unauthenticated);
        };
        match reviewer.review(token, caller).await? {
            Review::Authenticated(id) => Ok(identified(Arc::new(id))),
            Review::Rejected => Err(Rejection::Unauthenticated),
        }
    }

    /// Logs a refusal of a request from `peer`. A TokenReview that cannot be made (RBAC, the
    /// upstream down, the per-address rate limit) is a warning operators must see; the others
    /// are the caller's business (debug). Warnings are aggregated per reason: an
    /// unauthenticated flood past the rate limit would otherwise write one line per request.
    /// Every refusal is still counted in `auth_rejections_total`.
    pub fn log_rejection(&self, rejection: &Rejection, peer: SocketAddr) {
        let Rejection::Unavailable(cause) = rejection else {
            tracing::debug!(%peer, reason = rejection.label(), "request refused by authentication");
            return;
        };
        if let Verdict::Log { suppressed } = self.rejection_log.check(rejection.label()) {
            tracing::warn!(
                %peer,
                error = %cause,
                reason = rejection.label(),
                suppressed,
                "cannot authenticate the caller"
            );
        }
    }

    /// Rewrites upstream request headers for `caller`.
    pub fn apply(&self, caller: &Caller, headers: &mut HeaderMap) {
        self.outbound.apply(caller, headers);
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer_from_authorization(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Logs that a connection's client certificate was refused (each of its requests then gets
/// 401). Anyone with such a certificate can open connection after connection, so the warning is
/// aggregated (`log`) as the other refusals a caller can cause are.
pub fn log_refused_certificate(log: &LogThrottle, why: &dyn std::fmt::Display, peer: SocketAddr) {
    if let Verdict::Log { suppressed } = log.check("refused_client_certificate") {
        tracing::warn!(
            %peer,
            error = %why,
            suppressed,
            "client certificate refused: its requests get 401"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn alice() -> Arc<Identity> {
        Arc::new(Identity::new("alice", vec!["dev".into()], BTreeMap::new()).unwrap())
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn identified() -> PeerCertificate {
        PeerCertificate::Identified(alice())
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn passthrough_authenticates_nobody() {
        let auth = Authenticator::passthrough();
        let caller =
            block_on(auth.authenticate(&HeaderMap::new(), None, &PeerCertificate::None, LOCAL))
                .unwrap();
        assert!(matches!(
            caller,
            Caller::Passthrough {
                bearer: None,
                impersonating: None,
                ..
            }
        ));
    }

    #[test]
    fn certificate_identifies_the_caller() {
        for mode in [AuthMode::Impersonate, AuthMode::FrontProxy] {
            let auth = Authenticator::new(mode, None, None, FrontProxyHeaders::default());
            let caller =
                block_on(auth.authenticate(&HeaderMap::new(), None, &identified(), LOCAL)).unwrap();
            assert_eq!(caller.user(), Some("alice"));
        }
    }

    #[test]
    fn no_credentials_is_unauthenticated() {
        let auth = Authenticator::new(
            AuthMode::Impersonate,
            None,
            None,
            FrontProxyHeaders::default(),
        );
        let err =
            block_on(auth.authenticate(&HeaderMap::new(), None, &PeerCertificate::None, LOCAL))
                .unwrap_err();
        assert!(matches!(err, Rejection::Unauthenticated));
        assert_eq!(err.response().status(), StatusCode::UNAUTHORIZED);
        // A token but no way to review it: still unauthenticated, never forwarded as is.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert!(matches!(
            block_on(auth.authenticate(&h, None, &PeerCertificate::None, LOCAL)),
            Err(Rejection::Unauthenticated)
        ));
    }

    #[test]
    fn impersonation_headers_are_refused_in_impersonate_mode_only() {
        let mut h = HeaderMap::new();
        h.insert("impersonate-user", "root".parse().unwrap());
        let auth = Authenticator::new(
            AuthMode::Impersonate,
            None,
            None,
            FrontProxyHeaders::default(),
        );
        let err = block_on(auth.authenticate(&h, None, &identified(), LOCAL)).unwrap_err();
        assert_eq!(err.response().status(), StatusCode::FORBIDDEN);
        let auth = Authenticator::new(
            AuthMode::FrontProxy,
            None,
            None,
            FrontProxyHeaders::default(),
        );
        assert!(block_on(auth.authenticate(&h, None, &identified(), LOCAL)).is_ok());
    }

    #[test]
    fn a_callers_own_impersonation_is_kept_for_the_audit_where_it_goes_upstream() {
        let mut h = HeaderMap::new();
        h.insert("impersonate-user", "jane".parse().unwrap());
        h.append("impersonate-group", "team".parse().unwrap());
        let passthrough = block_on(Authenticator::passthrough().authenticate(
            &h,
            None,
            &PeerCertificate::None,
            LOCAL,
        ))
        .unwrap();
        let front_proxy = block_on(
            Authenticator::new(
                AuthMode::FrontProxy,
                None,
                None,
                FrontProxyHeaders::default(),
            )
            .authenticate(&h, None, &identified(), LOCAL),
        )
        .unwrap();
        for caller in [passthrough, front_proxy] {
            let asked = caller.impersonating().unwrap();
            assert_eq!(asked.user.as_deref(), Some("jane"));
            assert_eq!(asked.groups, ["team"]);
        }
        // Without the headers there is nothing to say.
        let caller = block_on(Authenticator::passthrough().authenticate(
            &HeaderMap::new(),
            None,
            &PeerCertificate::None,
            LOCAL,
        ))
        .unwrap();
        assert!(caller.impersonating().is_none());
    }

    #[test]
    fn an_ambiguous_certificate_is_refused_in_every_mode() {
        let refused = PeerCertificate::Refused(ClientCertError::MultipleCommonNames(2));
        for auth in [
            Authenticator::passthrough(),
            Authenticator::new(
                AuthMode::Impersonate,
                None,
                None,
                FrontProxyHeaders::default(),
            ),
            Authenticator::new(
                AuthMode::FrontProxy,
                None,
                None,
                FrontProxyHeaders::default(),
            ),
        ] {
            // Even with a token beside it: the connection's identity is in doubt.
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
            let err = block_on(auth.authenticate(&h, None, &refused, LOCAL)).unwrap_err();
            assert_eq!(err.label(), "ambiguous_client_certificate");
            assert_eq!(err.response().status(), StatusCode::UNAUTHORIZED);
        }
    }

    #[test]
    fn authorization_header_parsing() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "bearer  tok ".parse().unwrap());
        assert_eq!(bearer_from_authorization(&h), Some("tok"));
        h.insert(header::AUTHORIZATION, "Basic dTpw".parse().unwrap());
        assert_eq!(bearer_from_authorization(&h), None);
    }
}
