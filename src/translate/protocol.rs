//! Protocol names (PROTOCOL.md §1.2, §3.1, Appendix A): the WebSocket subprotocols clients
//! offer, and the remote-command versions negotiated with an SPDY upstream.

/// Prefix of tunnelled SPDY subprotocols (`SPDY/3.1+portforward.k8s.io`).
pub const TUNNEL_PREFIX: &str = "SPDY/3.1+";
/// Suffix every tunnelled protocol name has.
pub const TUNNEL_SUFFIX: &str = ".k8s.io";
/// The port-forward SPDY protocol.
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// A WebSocket remote-command subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelProtocol {
    /// `v5.channel.k8s.io`: binary, JSON status, CLOSE signal. What the proxy translates.
    V5,
    /// `v4.channel.k8s.io`: binary, JSON status.
    V4,
    /// `v4.base64.channel.k8s.io`.
    V4Base64,
    /// `channel.k8s.io`: binary, text status on failure only.
    V1,
    /// `base64.channel.k8s.io`.
    V1Base64,
}

impl ChannelProtocol {
    /// All of them, newest first.
    pub const ALL: [ChannelProtocol; 5] = [
        ChannelProtocol::V5,
        ChannelProtocol::V4,
        ChannelProtocol::V4Base64,
        ChannelProtocol::V1,
        ChannelProtocol::V1Base64,
    ];

    /// The subprotocol name.
    pub fn name(self) -> &'static str {
        match self {
            ChannelProtocol::V5 => "v5.channel.k8s.io",
            ChannelProtocol::V4 => "v4.channel.k8s.io",
            ChannelProtocol::V4Base64 => "v4.base64.channel.k8s.io",
            ChannelProtocol::V1 => "channel.k8s.io",
            ChannelProtocol::V1Base64 => "base64.channel.k8s.io",
        }
    }

    /// The protocol with this exact name.
    pub fn from_name(name: &str) -> Option<ChannelProtocol> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Text messages with base64 payloads instead of binary ones.
    pub fn is_base64(self) -> bool {
        matches!(self, ChannelProtocol::V4Base64 | ChannelProtocol::V1Base64)
    }

    /// The status is a JSON `Status`, always sent (v4, v5); otherwise text on failure only.
    pub fn json_status(self) -> bool {
        matches!(
            self,
            ChannelProtocol::V5 | ChannelProtocol::V4 | ChannelProtocol::V4Base64
        )
    }

    /// Supports the `FF <channel>` CLOSE signal.
    pub fn supports_close_signal(self) -> bool {
        self == ChannelProtocol::V5
    }
}

/// Remote-command version negotiated with an SPDY upstream (`X-Stream-Protocol-Version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UpstreamVersion {
    V1,
    V2,
    V3,
    V4,
    V5,
}

impl UpstreamVersion {
    /// What we offer, in order (what client-go offers; kubelets answer v4).
    pub fn offer_list() -> &'static [UpstreamVersion] {
        &[
            UpstreamVersion::V5,
            UpstreamVersion::V4,
            UpstreamVersion::V3,
            UpstreamVersion::V2,
            UpstreamVersion::V1,
        ]
    }

    /// The header value.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamVersion::V1 => "channel.k8s.io",
            UpstreamVersion::V2 => "v2.channel.k8s.io",
            UpstreamVersion::V3 => "v3.channel.k8s.io",
            UpstreamVersion::V4 => "v4.channel.k8s.io",
            UpstreamVersion::V5 => "v5.channel.k8s.io",
        }
    }

    /// The version an upstream's 101 announced; a missing or unknown header means v1, as in
    /// client-go.
    pub fn from_negotiated(header: Option<&str>) -> UpstreamVersion {
        let header = header.map(str::trim).unwrap_or("");
        Self::offer_list()
            .iter()
            .copied()
            .find(|v| v.name() == header)
            .unwrap_or(UpstreamVersion::V1)
    }

    /// v3 and later have a `resize` stream.
    pub fn has_resize_stream(self) -> bool {
        self >= UpstreamVersion::V3
    }

    /// v4 and later report a JSON Status on the error stream, success included.
    pub fn json_status(self) -> bool {
        self >= UpstreamVersion::V4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in ChannelProtocol::ALL {
            assert_eq!(ChannelProtocol::from_name(p.name()), Some(p));
        }
        assert_eq!(ChannelProtocol::from_name("v3.channel.k8s.io"), None);
    }

    #[test]
    fn upstream_negotiation() {
        let offered: Vec<_> = UpstreamVersion::offer_list()
            .iter()
            .map(|v| v.name())
            .collect();
        assert_eq!(
            offered,
            [
                "v5.channel.k8s.io",
                "v4.channel.k8s.io",
                "v3.channel.k8s.io",
                "v2.channel.k8s.io",
                "channel.k8s.io"
            ]
        );
        assert_eq!(
            UpstreamVersion::from_negotiated(Some("v4.channel.k8s.io")),
            UpstreamVersion::V4
        );
        assert_eq!(UpstreamVersion::from_negotiated(None), UpstreamVersion::V1);
        assert!(UpstreamVersion::V3.has_resize_stream());
        assert!(!UpstreamVersion::V2.has_resize_stream());
        assert!(UpstreamVersion::V4.json_status());
        assert!(!UpstreamVersion::V3.json_status());
    }
}
