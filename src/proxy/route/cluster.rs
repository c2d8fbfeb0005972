//! One cluster behind the proxy: its name, its upstream with the pooled client for plain
//! requests, the proxy's credentials and auth mode for it, and its streaming mode with what
//! `auto` learned about it. A request is routed to exactly one; nothing here is shared between
//! clusters, so credentials, review answers and auto-detection memory never cross over.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::proxy::auth::self_subject_review::SelfSubjectReviews;
use crate::proxy::auth::{AccessReviews, AuthMode, Authenticator, ReviewLimits};
use crate::proxy::observability::metrics::ClusterLabel;
use crate::proxy::observability::readiness::{Readiness, READY_CACHE};
use crate::proxy::upstream::endpoint::{PooledClient, Upstream};
use crate::proxy::upstream::streaming::{StreamingMemory, UpstreamStreaming};

/// A cluster's name: a DNS label (RFC 1123: at most 63 lower-case letters, digits and `-`,
/// starting and ending with a letter or digit), as it appears in `/clusters/NAME/`, a host
/// name, a metric label, a kubeconfig context and a recordings folder.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterName(String);

/// Why a cluster name is not a DNS label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster name {name:?} is not a DNS label (1-63 of a-z, 0-9 and '-', starting and ending with a letter or digit)")]
pub struct BadClusterName {
    /// The name as given.
    pub name: String,
}

impl ClusterName {
    /// `name`, if it is a DNS label.
    pub fn parse(name: &str) -> Result<ClusterName, BadClusterName> {
        let b = name.as_bytes();
        let label = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let ok = (1..=63).contains(&b.len())
            && b.iter().all(|c| label(c) || *c == b'-')
            && label(&b[0])
            && label(&b[b.len() - 1]);
        if ok {
            Ok(ClusterName(name.to_owned()))
        } else {
            Err(BadClusterName {
                name: name.to_owned(),
            })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The label value, audit field and log field of the one upstream of a proxy configured with
/// `--upstream`, `--kubeconfig` or `--in-cluster` (it has no name of its own).
pub const DEFAULT_CLUSTER: &str = "default";

/// One cluster and everything the proxy keeps for it.
pub struct Cluster {
    /// Its name; `None` for the upstream of `--upstream`, `--kubeconfig` or `--in-cluster`,
    /// which serves requests without a `/clusters/NAME/` prefix.
    pub name: Option<ClusterName>,
    /// Where it is and how to reach it.
    pub upstream: Upstream,
    /// Pooled client for its plain (non-upgrade) requests.
    pub client: PooledClient,
    /// Who its callers are and what its upstream is told (its `auth-mode`).
    pub auth: Authenticator,
    /// Passthrough callers' identities at this cluster, for audit events.
    pub self_reviews: SelfSubjectReviews,
    /// Whether its callers may use the sessions API, as its RBAC decides.
    pub access_reviews: AccessReviews,
    /// Whether v5 exec/attach and the tunnel are translated to SPDY or passed through
    /// (its `upstream-streaming`).
    pub upstream_streaming: UpstreamStreaming,
    /// What `auto` learned about this cluster.
    pub streaming_memory: StreamingMemory,
    /// Its `/readyz` check, shared by every probe for a second.
    pub readiness: Arc<Readiness>,
    /// Its running sessions.
    sessions: Arc<AtomicUsize>,
    /// At most this many of them at once (its `max-sessions`; `None`: only the proxy's limit).
    max_sessions: Option<usize>,
    /// Its `cluster` label in metrics: its name, or [`DEFAULT_CLUSTER`].
    label: ClusterLabel,
    /// Fires when its sessions must end now: the proxy's drain timeout has passed, or the
    /// cluster left the configuration and its own drain timeout has.
    stop: CancellationToken,
}

impl Cluster {
    /// A cluster reached at `upstream` with the given auth and streaming mode.
    pub fn new(
        name: Option<ClusterName>,
        upstream: Upstream,
        auth: Authenticator,
        upstream_streaming: UpstreamStreaming,
    ) -> Cluster {
        let label = ClusterLabel::new(name.as_ref().map_or(DEFAULT_CLUSTER, ClusterName::as_str));
        let access_reviews = default_access_reviews(auth.mode(), &upstream);
        Cluster {
            name,
            label,
            client: upstream.pooled_client(),
            upstream,
            auth,
            self_reviews: SelfSubjectReviews::default(),
            access_reviews,
            upstream_streaming,
            streaming_memory: StreamingMemory::default(),
            readiness: Readiness::new(READY_CACHE),
            sessions: Arc::default(),
            max_sessions: None,
            stop: CancellationToken::new(),
        }
    }

    /// The cluster, running at most `max` sessions at once (`None`: only the proxy's
    /// `--max-sessions` bounds them), so that one slow or hung cluster cannot hold every slot
    /// of the proxy.
    pub fn with_max_sessions(mut self, max: Option<usize>) -> Cluster {
        self.max_sessions = max;
        self
    }

    /// The cluster, its sessions API calls authorized by `reviews` (made with the proxy's own
    /// credentials for it in impersonate and front-proxy modes).
    pub fn with_access_reviews(mut self, reviews: AccessReviews) -> Cluster {
        self.access_reviews = reviews;
        self
    }

    /// The cluster, its sessions told to stop by `stop` (a child of the proxy's own stop
    /// signal, so that a shutdown reaches them too).
    pub fn stopped_by(mut self, stop: CancellationToken) -> Cluster {
        self.stop = stop;
        self
    }

    /// Fires when its sessions must end now.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Tells its running sessions to end now (it has left the configuration and its drain
    /// timeout has passed): each ends as a shutdown ends it.
    pub fn stop_sessions(&self) {
        self.stop.cancel();
    }

    /// The counter of its running sessions (a session's slot holds it while it runs; the
    /// session registry admits against [`Cluster::max_sessions`]).
    pub fn session_count(&self) -> Arc<AtomicUsize> {
        self.sessions.clone()
    }

    /// Its `max-sessions`, if it has one.
    pub fn max_sessions(&self) -> Option<usize> {
        self.max_sessions
    }

    /// How many of its sessions run now.
    pub fn active_sessions(&self) -> usize {
        self.sessions.load(Ordering::Acquire)
    }

    /// Its name as logs, metrics and audit events show it ([`DEFAULT_CLUSTER`] for the unnamed
    /// one).
    pub fn label(&self) -> &str {
        self.label.as_str()
    }

    /// Its `cluster` label in metrics (the same value).
    pub fn metrics_label(&self) -> &ClusterLabel {
        &self.label
    }
}

/// Access reviews until [`Cluster::with_access_reviews`] says otherwise: self-subject ones in
/// passthrough; in the other modes subject ones on `upstream` without a token (they fail, and
/// fail closed, where the upstream wants the proxy's credentials).
fn default_access_reviews(mode: AuthMode, upstream: &Upstream) -> AccessReviews {
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    let limits = ReviewLimits::default();
    match mode {
        AuthMode::Passthrough => AccessReviews::self_subject(upstream.clone(), TIMEOUT, limits),
        _ => AccessReviews::subject(upstream.clone(), None, TIMEOUT, limits),
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.label())
            .field("upstream", &self.upstream)
            .field("auth", &self.auth.mode())
            .field("upstream_streaming", &self.upstream_streaming)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for good in ["a", "prod-eu", "0", "a-1-b", &"x".repeat(63)] {
            assert_eq!(ClusterName::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Prod",
            "a_b",
            "a.b",
            "a/b",
            "é",
            &"x".repeat(64),
        ] {
            assert!(ClusterName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
