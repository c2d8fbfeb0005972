//! How much the proxy takes on at once, and how long it waits for a peer.

use std::time::Duration;

use clap::Args;

use super::values::parse_duration;

/// Limits and timeouts.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits and timeouts")]
pub struct LimitArgs {
    /// Most streaming sessions running at once (unlimited if unset).
    ///
    /// Exec, attach, port-forward and relayed upgrades; beyond it new ones get 429 with a
    /// Kubernetes Status and Retry-After.
    #[arg(long, env = "KUBE_WS_PROXY_MAX_SESSIONS", value_name = "COUNT")]
    pub max_sessions: Option<usize>,

    /// Largest request head (request line and headers) from a client, in bytes.
    ///
    /// Larger ones are refused with 431. At least 8192.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_MAX_REQUEST_HEADER_BYTES",
        default_value_t = 64 * 1024,
        value_name = "BYTES"
    )]
    pub max_request_header_bytes: usize,

    /// Most bytes of upgrade request bodies held at once, all callers together.
    ///
    /// One body is at most 1 MiB (kubectl sends none). An upgrade whose body would go past it
    /// is refused with 503.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPGRADE_BODY_BUDGET",
        default_value_t = 16 * 1024 * 1024,
        value_name = "BYTES"
    )]
    pub upgrade_body_budget: usize,

    /// Most bytes streaming sessions may hold beyond their own small floors, all together.
    ///
    /// What sessions read and have not passed on yet: messages being put together, queued
    /// stdin and output, frames being followed. Each direction of a session holds up to 64 KiB
    /// on its own and at most one largest message (`--max-message-size`) and 1 MiB behind it.
    /// Past the budget, reading waits (backpressure), and a session that needs a large message
    /// held whole ends (WebSocket close 1009). The default suits the manifests' 1 GiB limit
    /// with 2,000 sessions; see SECURITY.md ("Memory") to size it for another.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_SESSION_MEMORY_BUDGET",
        default_value_t = crate::proxy::sessions::state::DEFAULT_SESSION_MEMORY_BUDGET,
        value_name = "BYTES"
    )]
    pub session_memory_budget: usize,

    /// Most client connections waiting for a request head at once.
    ///
    /// A connection waits from its accept (TLS handshake included) to a complete request head,
    /// and again while idle between requests. Each may hold an unfinished head of up to
    /// `--max-request-header-bytes` before anyone knows who sent it; beyond the cap the
    /// connection that has waited longest is closed.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_MAX_PENDING_CONNECTIONS",
        default_value_t = crate::proxy::client::waiting_connections::DEFAULT_MAX_PENDING,
        value_parser = clap::value_parser!(u32).range(1..),
        value_name = "COUNT"
    )]
    pub max_pending_connections: u32,

    /// Most connections the admin listener serves at once.
    ///
    /// Beyond it a new connection takes the place of the one that has waited longest for a
    /// request head (idle keep-alive or silent), so probes always get in; when every one has a
    /// request in flight the new one is closed at once. The admin listener also applies
    /// `--request-header-timeout`, `--idle-connection-timeout` and
    /// `--max-request-header-bytes`, so silent connections to it cannot take the descriptors
    /// the main listener needs.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_ADMIN_MAX_CONNECTIONS",
        default_value_t = crate::proxy::listen::admin::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..),
        value_name = "COUNT"
    )]
    pub admin_max_connections: u32,

    /// Longest time to dial the upstream (TCP and TLS).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_DIAL_TIMEOUT",
        default_value = "10s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub upstream_dial_timeout: Duration,

    /// Longest wait for each step of setting up a streaming session.
    ///
    /// The upstream's answer to an upgrade (SPDY or relayed, and the exec streams it opens), a
    /// TokenReview, the body of a client's upgrade request, and a client's WebSocket upgrade to
    /// complete after the proxy accepted it.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_HANDSHAKE_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub handshake_timeout: Duration,

    /// Longest wait for each complete request head from a client.
    ///
    /// From the connection (TLS handshake included) to its first request head, and for every
    /// later one; slower connections are closed.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_REQUEST_HEADER_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub request_header_timeout: Duration,

    /// How long a client connection with no request in flight stays open.
    ///
    /// HTTP/1.1 keep-alive or HTTP/2. A watch or followed log is a request in flight, however
    /// quiet.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_IDLE_CONNECTION_TIMEOUT",
        default_value = "90s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub idle_connection_timeout: Duration,

    /// How long a plain response may wait for its client to take any of it (0: for ever).
    ///
    /// A client that stops reading a forwarded response (a big LIST, a log) is cut after this
    /// long without progress: the upstream's response is closed, and the connection (HTTP/1.1)
    /// or the stream (HTTP/2) ends. Watches and followed logs that are quiet, or read slowly,
    /// are not affected.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RESPONSE_WRITE_TIMEOUT",
        default_value = "60s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub response_write_timeout: Duration,
}
