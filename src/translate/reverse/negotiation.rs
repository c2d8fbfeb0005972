//! Which remote-command version a SPDY client gets (PROTOCOL.md §3.1): the first name it lists
//! that a kubelet would also accept, so an old kubectl sees exactly the answer it gets from a
//! SPDY cluster (v4 in practice). v5 is never chosen: over SPDY it means v4 to client-go, and no
//! kubelet answers it.

use http::HeaderMap;

use crate::translate::protocol::{UpstreamVersion, PORT_FORWARD_PROTOCOL};

/// The `X-Stream-Protocol-Version` header.
pub const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";
/// The header a refusal lists the versions we accept in.
pub const ACCEPTED_VERSIONS_HEADER: &str = "x-accepted-stream-protocol-versions";

/// The versions a SPDY client may get, in the kubelet's order.
pub const SUPPORTED: [UpstreamVersion; 4] = [
    UpstreamVersion::V4,
    UpstreamVersion::V3,
    UpstreamVersion::V2,
    UpstreamVersion::V1,
];

/// Why a SPDY client's offer cannot be served; the texts are the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    /// 400: no version offered at all.
    #[error("unable to upgrade: header X-Stream-Protocol-Version does not exist in request")]
    NoOffer,
    /// 403 with the accepted versions listed.
    #[error("unable to upgrade: unable to negotiate protocol: client supports [{offered}], server accepts [{accepted}]")]
    NoOverlap { offered: String, accepted: String },
}

impl NegotiationError {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> http::StatusCode {
        match self {
            NegotiationError::NoOffer => http::StatusCode::BAD_REQUEST,
            NegotiationError::NoOverlap { .. } => http::StatusCode::FORBIDDEN,
        }
    }
}

/// What the client offered, in its order: every header line, comma lists split.
pub fn offered(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(STREAM_PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

/// The remote-command version for an exec/attach offer.
pub fn remote_command(offered: &[&str]) -> Result<UpstreamVersion, NegotiationError> {
    if offered.is_empty() {
        return Err(NegotiationError::NoOffer);
    }
    offered
        .iter()
        .find_map(|name| SUPPORTED.into_iter().find(|v| v.name() == *name))
        .ok_or_else(|| NegotiationError::NoOverlap {
            offered: offered.join(" "),
            accepted: SUPPORTED.map(UpstreamVersion::name).join(" "),
        })
}

/// Checks a port-forward offer: `portforward.k8s.io` must be in it.
pub fn port_forward(offered: &[&str]) -> Result<&'static str, NegotiationError> {
    if offered.is_empty() {
        return Err(NegotiationError::NoOffer);
    }
    if offered.contains(&PORT_FORWARD_PROTOCOL) {
        Ok(PORT_FORWARD_PROTOCOL)
    } else {
        Err(NegotiationError::NoOverlap {
            offered: offered.join(" "),
            accepted: PORT_FORWARD_PROTOCOL.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(STREAM_PROTOCOL_HEADER, l.parse().unwrap());
        }
        h
    }

    #[test]
    fn kubectl_offers_get_v4() {
        // kubectl 1.27/1.28: v4…v1, one header line each.
        let h = headers(&[
            "v4.channel.k8s.io",
            "v3.channel.k8s.io",
            "v2.channel.k8s.io",
            "channel.k8s.io",
        ]);
        assert_eq!(remote_command(&offered(&h)), Ok(UpstreamVersion::V4));
        // kubectl 1.29/1.30 put v5 first: still v4, as from a kubelet.
        let h = headers(&["v5.channel.k8s.io, v4.channel.k8s.io", "channel.k8s.io"]);
        assert_eq!(remote_command(&offered(&h)), Ok(UpstreamVersion::V4));
    }

    #[test]
    fn the_clients_order_decides() {
        let h = headers(&["v2.channel.k8s.io", "v4.channel.k8s.io"]);
        assert_eq!(remote_command(&offered(&h)), Ok(UpstreamVersion::V2));
        assert_eq!(remote_command(&["channel.k8s.io"]), Ok(UpstreamVersion::V1));
        assert_eq!(
            remote_command(&["v3.channel.k8s.io"]),
            Ok(UpstreamVersion::V3)
        );
    }

    #[test]
    fn refusals_are_the_kubelets() {
        assert_eq!(remote_command(&[]), Err(NegotiationError::NoOffer));
        assert_eq!(
            NegotiationError::NoOffer.status(),
            http::StatusCode::BAD_REQUEST
        );
        let e = remote_command(&["v5.channel.k8s.io"]).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::FORBIDDEN);
        assert_eq!(
            e.to_string(),
            "unable to upgrade: unable to negotiate protocol: client supports [v5.channel.k8s.io], \
             server accepts [v4.channel.k8s.io v3.channel.k8s.io v2.channel.k8s.io channel.k8s.io]"
        );
    }

    #[test]
    fn port_forward_offers() {
        let h = headers(&["portforward.k8s.io"]);
        assert_eq!(port_forward(&offered(&h)), Ok("portforward.k8s.io"));
        assert!(port_forward(&["v4.channel.k8s.io"]).is_err());
        assert_eq!(port_forward(&[]), Err(NegotiationError::NoOffer));
    }
}
