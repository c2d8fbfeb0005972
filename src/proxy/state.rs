//! What every request handler shares: the upstream, the pooled client and the limits.

use std::sync::Arc;
use std::time::Duration;

use super::metrics::Metrics;
use super::sessions::Sessions;
use super::upstream::{HttpClient, Upstream};
use crate::translate::remote_command::SessionLimits;

/// Shared, read-only proxy state.
#[derive(Debug)]
pub struct ProxyState {
    pub upstream: Upstream,
    /// Pooled client for plain (non-upgrade) requests.
    pub client: HttpClient,
    pub session_limits: SessionLimits,
    /// Largest WebSocket message accepted from a client.
    pub max_message_size: usize,
    /// How often translated sessions ping the upstream (keeps middleboxes from cutting them).
    pub upstream_ping_interval: Duration,
    /// Prometheus metrics served on the admin listener.
    pub metrics: Metrics,
    /// Running streaming sessions: admission (`--max-sessions`) and drain signals.
    pub sessions: Arc<Sessions>,
}

impl ProxyState {
    /// State with default limits for `upstream`.
    pub fn new(upstream: Upstream) -> Self {
        let client = upstream.http_client();
        ProxyState {
            upstream,
            client,
            session_limits: SessionLimits::default(),
            max_message_size: 32 * 1024 * 1024,
            upstream_ping_interval: Duration::from_secs(5),
            metrics: Metrics::new(),
            sessions: Sessions::new(None),
        }
    }
}
