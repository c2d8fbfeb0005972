//! Which streaming protocols the simulated cluster speaks: an old SPDY-only cluster, a 1.31+
//! API server with the WebSocket gates on, or a path that refuses SPDY altogether.

use std::fmt;
use std::str::FromStr;

/// The exec/attach protocol kube-apiserver translates itself (PROTOCOL.md §4).
pub(crate) const V5_PROTOCOL: &str = "v5.channel.k8s.io";
/// The port-forward tunnel protocol kube-apiserver serves itself (PROTOCOL.md §2.1).
pub(crate) const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// The streaming generation of a [`super::SimCluster`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimStreaming {
    /// An old (≤ 1.28) API server and kubelet: exec/attach/port-forward over SPDY and the
    /// legacy WebSocket protocols; a `v5.channel.k8s.io` offer gets the kubelet's bare 403
    /// and a tunnel offer the kubelet's 400 `query parameter "port" is required`, which is
    /// what makes kubectl ≥ 1.31 fall back to SPDY.
    #[default]
    SpdyOnly,
    /// A 1.31+ API server with `TranslateStreamCloseWebsocketRequests` and
    /// `PortForwardWebsockets` on: `v5.channel.k8s.io` exec/attach and the
    /// `SPDY/3.1+portforward.k8s.io` tunnel are served natively, and everything `SpdyOnly`
    /// serves still is.
    New,
    /// `New` behind a path that dropped SPDY (a gateway, or a cluster that removed it): every
    /// `Upgrade: SPDY/3.1` request is answered `400 Bad Request` (text/plain, before
    /// authentication, as a gateway in front of the API server does); v5, the tunnel and the
    /// legacy WebSocket protocols are served.
    WebSocketOnly,
}

impl SimStreaming {
    /// Whether `Upgrade: SPDY/3.1` requests reach the cluster.
    pub fn accepts_spdy(self) -> bool {
        self != SimStreaming::WebSocketOnly
    }

    /// Whether `v5.channel.k8s.io` exec/attach and the port-forward tunnel are served.
    pub fn accepts_websocket_streaming(self) -> bool {
        self != SimStreaming::SpdyOnly
    }

    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            SimStreaming::SpdyOnly => "spdy-only",
            SimStreaming::New => "new",
            SimStreaming::WebSocketOnly => "websocket-only",
        }
    }
}

impl fmt::Display for SimStreaming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A streaming mode name that is none of `spdy-only`, `new`, `websocket-only`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown streaming mode {0:?} (expected spdy-only, new or websocket-only)")]
pub struct SimStreamingParseError(String);

impl FromStr for SimStreaming {
    type Err = SimStreamingParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            SimStreaming::SpdyOnly,
            SimStreaming::New,
            SimStreaming::WebSocketOnly,
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| SimStreamingParseError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in [
            SimStreaming::SpdyOnly,
            SimStreaming::New,
            SimStreaming::WebSocketOnly,
        ] {
            assert_eq!(m.name().parse::<SimStreaming>().unwrap(), m);
        }
        assert!("old".parse::<SimStreaming>().is_err());
        assert_eq!(SimStreaming::default(), SimStreaming::SpdyOnly);
    }

    #[test]
    fn what_each_mode_serves() {
        assert!(SimStreaming::SpdyOnly.accepts_spdy());
        assert!(!SimStreaming::SpdyOnly.accepts_websocket_streaming());
        assert!(SimStreaming::New.accepts_spdy());
        assert!(SimStreaming::New.accepts_websocket_streaming());
        assert!(!SimStreaming::WebSocketOnly.accepts_spdy());
        assert!(SimStreaming::WebSocketOnly.accepts_websocket_streaming());
    }
}
