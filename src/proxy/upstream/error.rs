//! Why the upstream could not be described or reached: its own file, because both the upstream
//! connector and the reloading client certificate report it. Also what a client is told of
//! such a failure, and how the log is told of it.

use std::io;
use std::path::PathBuf;

use tracing::warn;

use crate::proxy::observability::log_throttle::{LogThrottle, Verdict};

/// Why the upstream could not be described or reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid upstream URL {0:?}: {1}")]
    InvalidUrl(String, String),
    #[error("cannot read {path}: {source}")]
    File { path: PathBuf, source: io::Error },
    #[error("invalid TLS configuration: {0}")]
    TlsConfig(String),
    #[error("cannot connect to {addr}: {source}")]
    Dial { addr: String, source: io::Error },
    #[error("timed out connecting to {0}")]
    Timeout(String),
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls { addr: String, source: io::Error },
}

impl UpstreamError {
    /// What a client may be told (SECURITY.md, "What a client is told when the upstream
    /// fails"): the kind of failure, never the upstream's address, a file name or what TLS
    /// said. The log gets the whole error ([`reported`]).
    pub fn client_reason(&self) -> &'static str {
        match self {
            UpstreamError::Dial { .. } => "cannot connect to the upstream API server",
            UpstreamError::Tls { .. } => "the TLS handshake with the upstream API server failed",
            UpstreamError::Timeout(_) => "timed out connecting to the upstream API server",
            UpstreamError::InvalidUrl(..)
            | UpstreamError::File { .. }
            | UpstreamError::TlsConfig(_) => {
                "kube-ws-proxy's settings for the upstream API server cannot be used"
            }
        }
    }

    /// The kind of failure, for aggregating its log lines.
    fn log_kind(&self) -> &'static str {
        match self {
            UpstreamError::Dial { .. } => "upstream_dial",
            UpstreamError::Tls { .. } => "upstream_tls",
            UpstreamError::Timeout(_) => "upstream_timeout",
            UpstreamError::InvalidUrl(..)
            | UpstreamError::File { .. }
            | UpstreamError::TlsConfig(_) => "upstream_settings",
        }
    }
}

/// A failure on the way to the upstream (dialling it, or talking to it before it answered),
/// which a client is told of.
pub trait UpstreamFailure: std::fmt::Display {
    /// The short reason the client gets: nothing of the upstream's address, the proxy's files
    /// or what TLS said (an `UpstreamError`'s [`client_reason`](UpstreamError::client_reason);
    /// an I/O error on the upstream connection can carry a TLS alert, so it is not repeated).
    fn client_reason(&self) -> String;

    /// The kind of failure, for aggregating its log lines (a fixed set).
    fn log_kind(&self) -> &'static str;
}

impl UpstreamFailure for UpstreamError {
    fn client_reason(&self) -> String {
        UpstreamError::client_reason(self).to_owned()
    }

    fn log_kind(&self) -> &'static str {
        UpstreamError::log_kind(self)
    }
}

/// An error from the pooled client (a plain request, a TokenReview) with its causes: an
/// [`UpstreamError`] among them (the dial) says which kind of failure it is, anything else is
/// a connection that failed once made.
pub struct Chained<'a>(pub &'a (dyn std::error::Error + 'static));

impl Chained<'_> {
    fn dial(&self) -> Option<&UpstreamError> {
        let mut cause = Some(self.0);
        while let Some(e) = cause {
            if let Some(dial) = e.downcast_ref::<UpstreamError>() {
                return Some(dial);
            }
            cause = e.source();
        }
        None
    }
}

impl std::fmt::Display for Chained<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(self.0))
    }
}

impl UpstreamFailure for Chained<'_> {
    fn client_reason(&self) -> String {
        self.dial()
            .map_or(TALKING_FAILED, UpstreamError::client_reason)
            .to_owned()
    }

    fn log_kind(&self) -> &'static str {
        self.dial()
            .map_or("upstream_connection", UpstreamError::log_kind)
    }
}

/// The client's reason for a connection to the upstream that failed once made.
pub const TALKING_FAILED: &str = "error talking to the upstream API server";

/// An error with its causes (`client error (Connect): TLS handshake … failed: invalid peer
/// certificate: UnknownIssuer`): hyper's own message alone names no cause.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// Upstream failures logged, per kind, at most once per interval (an unauthenticated caller
/// can cause one per request while the upstream is down).
static FAILURE_LOG: std::sync::LazyLock<LogThrottle> =
    std::sync::LazyLock::new(LogThrottle::default);

/// Logs `e` whole for the operator (aggregated per kind: the first, then one line per 10 s with
/// the count left out) and returns what the client is told.
pub fn reported(e: &dyn UpstreamFailure) -> String {
    if let Verdict::Log { suppressed } = FAILURE_LOG.check(e.log_kind()) {
        warn!(error = %e, kind = e.log_kind(), suppressed, "upstream API server failure");
    }
    e.client_reason()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(text: &str) -> io::Error {
        io::Error::other(text.to_owned())
    }

    #[test]
    fn a_client_is_told_the_kind_of_failure_never_the_address_file_or_tls_detail() {
        let errors = [
            UpstreamError::Dial {
                addr: "10.9.8.7:6443".into(),
                source: io("connection refused"),
            },
            UpstreamError::Tls {
                addr: "10.9.8.7:6443".into(),
                source: io("invalid peer certificate: UnknownIssuer"),
            },
            UpstreamError::Timeout("10.9.8.7:6443".into()),
            UpstreamError::File {
                path: "/secret/ca.crt".into(),
                source: io("permission denied"),
            },
            UpstreamError::TlsConfig("/secret/key.pem: keys do not match".into()),
            UpstreamError::InvalidUrl("https://10.9.8.7:6443".into(), "bad".into()),
        ];
        for e in &errors {
            let told = UpstreamFailure::client_reason(e);
            for secret in [
                "10.9.8.7",
                "6443",
                "/secret",
                "UnknownIssuer",
                "refused",
                "denied",
            ] {
                assert!(!told.contains(secret), "{e}: {told}");
            }
        }
    }

    #[derive(Debug)]
    struct Wrapper(UpstreamError);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_pooled_clients_error_is_logged_with_its_causes_and_told_by_the_dial_among_them() {
        let e = Wrapper(UpstreamError::Tls {
            addr: "10.9.8.7:6443".into(),
            source: io("invalid peer certificate: UnknownIssuer"),
        });
        let chained = Chained(&e);
        assert_eq!(
            chained.to_string(),
            "client error (Connect): TLS handshake with 10.9.8.7:6443 failed: \
             invalid peer certificate: UnknownIssuer"
        );
        assert_eq!(
            chained.client_reason(),
            "the TLS handshake with the upstream API server failed"
        );
        let other = io("connection reset by peer");
        assert_eq!(Chained(&other).client_reason(), TALKING_FAILED);
    }
}
