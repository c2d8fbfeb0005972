//! How callers are authenticated and asserted to the upstream, and what TokenReviews may cost.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::{parse_duration, parse_header_name};
use crate::proxy::auth::AuthMode;

/// Authentication.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthArgs {
    /// How the proxy treats the caller's identity.
    ///
    /// `impersonate` and `front-proxy` authenticate the caller by client certificate or
    /// TokenReview; `impersonate` then acts as it with Impersonate-* headers over the proxy's
    /// own credentials, `front-proxy` asserts it with X-Remote-* headers over its front-proxy
    /// client certificate.
    #[arg(long, env = "KUBE_WS_PROXY_AUTH_MODE", value_enum, default_value_t = AuthMode::Passthrough)]
    pub auth_mode: AuthMode,

    /// Front-proxy client certificate (PEM); required in front-proxy mode.
    ///
    /// Signed by the CA of the API server's `--requestheader-client-ca-file`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_CLIENT_CERT_FILE",
        requires = "front_proxy_client_key_file",
        value_name = "FILE"
    )]
    pub front_proxy_client_cert_file: Option<PathBuf>,

    /// Private key of `--front-proxy-client-cert-file` (PEM).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_CLIENT_KEY_FILE",
        requires = "front_proxy_client_cert_file",
        value_name = "FILE"
    )]
    pub front_proxy_client_key_file: Option<PathBuf>,

    /// Header carrying the user name in front-proxy mode.
    ///
    /// One of the API server's `--requestheader-username-headers`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_USERNAME_HEADER",
        default_value = "X-Remote-User",
        value_parser = parse_header_name,
        value_name = "HEADER"
    )]
    pub front_proxy_username_header: http::HeaderName,

    /// Header carrying the groups in front-proxy mode.
    ///
    /// One of the API server's `--requestheader-group-headers`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_GROUP_HEADER",
        default_value = "X-Remote-Group",
        value_parser = parse_header_name,
        value_name = "HEADER"
    )]
    pub front_proxy_group_header: http::HeaderName,

    /// Prefix of the extra-attribute headers in front-proxy mode.
    ///
    /// One of the API server's `--requestheader-extra-headers-prefix`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_EXTRA_HEADER_PREFIX",
        default_value = "X-Remote-Extra-",
        value_parser = parse_header_name,
        value_name = "PREFIX"
    )]
    pub front_proxy_extra_header_prefix: http::HeaderName,

    /// How long a TokenReview answer is reused for the same token.
    ///
    /// Rejections are reused for at most 2 s.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUTHENTICATION_CACHE_TTL",
        default_value = "10s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub authentication_cache_ttl: Duration,

    /// TokenReviews per second one caller address may cause, sustained.
    ///
    /// Impersonate and front-proxy modes. Cached tokens cost nothing; beyond it callers get
    /// 429.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TOKEN_REVIEW_RATE",
        default_value_t = 10.0,
        value_name = "PER_SECOND"
    )]
    pub token_review_rate: f64,

    /// TokenReviews one caller address may cause in a burst above `--token-review-rate`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TOKEN_REVIEW_BURST",
        default_value_t = 50,
        value_name = "COUNT"
    )]
    pub token_review_burst: u32,

    /// TokenReviews of one caller address in flight at once.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TOKEN_REVIEW_MAX_IN_FLIGHT",
        default_value_t = 8,
        value_name = "COUNT"
    )]
    pub token_review_max_in_flight: usize,
}
