//! Liveness checks on quiet connections: WebSocket and SPDY pings, TCP keepalive.

use std::time::Duration;

use clap::Args;

use super::values::parse_duration;

/// Keepalive.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Keepalive")]
pub struct KeepaliveArgs {
    /// How often WebSocket sessions ping the client (0: never).
    ///
    /// So gateways that cut idle connections see traffic (browsers never ping on their own).
    /// Translated sessions, port-forward tunnels and relayed ones (pass-through and legacy
    /// protocols, between the upstream's frames) all ping.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_CLIENT_PING_INTERVAL",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub client_ping_interval: Duration,

    /// How long after a ping was due a silent client counts as gone (0: never).
    ///
    /// Its session ends and the upstream streams are reset.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_CLIENT_PING_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub client_ping_timeout: Duration,

    /// How often translated sessions send an SPDY PING upstream (0: never).
    ///
    /// Keeps idle sessions alive through middleboxes between the proxy and the cluster.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_PING_INTERVAL",
        default_value = "5s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub upstream_ping_interval: Duration,

    /// How long after a ping was due a silent upstream ends a translated session (0: never).
    ///
    /// The session ends with a Status saying the upstream stopped answering.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_PING_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub upstream_ping_timeout: Duration,

    /// TCP keepalive on client and upstream sockets: idle time before the first probe (0: off).
    ///
    /// Probes follow every third of it, and a peer that answers none of three is dropped
    /// (after about twice this). The only liveness check byte relays have.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TCP_KEEPALIVE",
        default_value = "30s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub tcp_keepalive: Duration,
}
