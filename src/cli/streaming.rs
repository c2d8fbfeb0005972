//! How streaming sessions (exec, attach, port-forward) go upstream, and how they end.

use std::time::Duration;

use clap::Args;

use super::values::parse_duration;
use crate::proxy::upstream::streaming::UpstreamStreaming;

/// Streaming.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Streaming")]
pub struct StreamingArgs {
    /// How v5 exec/attach and the port-forward tunnel go upstream.
    ///
    /// `spdy`: translated to SPDY (clusters before 1.31, paths that carry only SPDY).
    /// `websocket`: passed through unchanged, for clusters that serve them (1.31+ with
    /// TranslateStreamCloseWebsocketRequests and PortForwardWebsockets). `auto`: WebSocket
    /// first, SPDY when the upstream refuses the upgrade the way an old cluster does; what
    /// worked is remembered for 10 minutes. SPDY clients (kubectl ≤ 1.30) are relayed, or
    /// translated to WebSocket under `websocket`, and under `auto` once the path refuses SPDY.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_STREAMING", value_enum, default_value_t = UpstreamStreaming::Auto)]
    pub upstream_streaming: UpstreamStreaming,

    /// Largest WebSocket message accepted from a client, in bytes.
    ///
    /// The Kubernetes API server closes the connection above 32 MiB, the default.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_MAX_MESSAGE_SIZE",
        default_value_t = 32 * 1024 * 1024,
        value_name = "BYTES"
    )]
    pub max_message_size: usize,

    /// End a streaming session that carries no data either way for this long (0: never).
    ///
    /// Exec, attach and port-forward, relayed or translated; pings do not count. Followed logs
    /// are exempt, as with the kubelet's `--streaming-connection-idle-timeout`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_STREAM_IDLE_TIMEOUT",
        default_value = "4h",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub stream_idle_timeout: Duration,

    /// How long an ending session waits on a client that stopped reading.
    ///
    /// First for the session's final status and Close to reach the client, then for the
    /// client's Close before the connection is dropped (reading on prevents truncated output).
    /// On relays: how long one direction may go on after the other ended.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_CLOSE_DRAIN_TIMEOUT",
        default_value = "10s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub close_drain_timeout: Duration,
}
