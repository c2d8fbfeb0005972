//! Hop-by-hop headers (RFC 9110 §7.6.1) and the headers that say where a request came from.
//!
//! `X-Forwarded-For`, `X-Real-Ip` and `Forwarded` (RFC 7239) are only as good as whoever wrote
//! them: kube-apiserver records a request's `sourceIPs` in its audit log from `X-Forwarded-For`,
//! then `X-Real-Ip`, then the connection's address. Unless the proxy is told it sits behind a
//! proxy it trusts, a caller's own values are thrown away.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Whether `name` is a hop-by-hop header.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Removes hop-by-hop headers and every header named in `Connection`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

/// Headers in which the sender names the request's origin besides `X-Forwarded-For`: nginx's
/// `X-Real-Ip` (kube-apiserver adds it to `sourceIPs`) and the standard `Forwarded`.
const ORIGIN_HEADERS: [&str; 2] = ["x-real-ip", "forwarded"];

/// Sets the headers that say where a request came from, for the upstream; every path that
/// sends a request upstream calls this, so none can pass a caller's claim on by omission.
///
/// - Not `trust_prior`: `X-Forwarded-For` is the client's address alone, and the caller's
///   `X-Real-Ip` and `Forwarded` are removed. Removing is enough: kube-apiserver appends
///   `X-Real-Ip` to `sourceIPs` only when `X-Forwarded-For` does not already hold it, so an
///   `X-Real-Ip` of the client's address would add nothing, and nothing reads `Forwarded`.
/// - `trust_prior` (the client is a proxy we trust): the client's address is appended to
///   `X-Forwarded-For` (one line, comma-joined), and `X-Real-Ip` and `Forwarded` are kept as
///   that proxy wrote them.
pub fn set_forwarding_headers(headers: &mut HeaderMap, client: IpAddr, trust_prior: bool) {
    if trust_prior {
        append_x_forwarded_for(headers, client);
        return;
    }
    for name in ORIGIN_HEADERS {
        headers.remove(name);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-for"),
        HeaderValue::from_str(&client.to_string()).expect("an IP address is a header value"),
    );
}

/// The address a request comes from: the peer's, or behind a trusted proxy (`trust_prior`) the
/// last address that proxy wrote in `X-Forwarded-For`.
pub fn caller_address(headers: &HeaderMap, peer: IpAddr, trust_prior: bool) -> IpAddr {
    if !trust_prior {
        return peer;
    }
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .next_back()
        .unwrap_or(peer)
}

/// Appends the client's address to `X-Forwarded-For` (one line, comma-joined).
fn append_x_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    let name = HeaderName::from_static("x-forwarded-for");
    let prior: Vec<String> = headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let value = if prior.is_empty() {
        client.to_string()
    } else {
        format!("{}, {client}", prior.join(", "))
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("authorization", "Bearer t".parse().unwrap());
        h.insert("impersonate-user", "u".parse().unwrap());
        remove_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["authorization", "impersonate-user"]);
    }

    #[test]
    fn forwarding_headers_are_replaced_unless_trusted() {
        let forged = || {
            let mut h = HeaderMap::new();
            h.append("x-forwarded-for", "1.2.3.4".parse().unwrap());
            h.append("x-forwarded-for", "5.6.7.8".parse().unwrap());
            h.append("x-real-ip", "1.2.3.4".parse().unwrap());
            h.append("forwarded", "for=1.2.3.4".parse().unwrap());
            h.append("x-other", "kept".parse().unwrap());
            h
        };
        let mut h = forged();
        set_forwarding_headers(&mut h, "10.0.0.1".parse().unwrap(), false);
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["10.0.0.1"]
        );
        assert!(h.get("x-real-ip").is_none());
        assert!(h.get("forwarded").is_none());
        assert_eq!(h.get("x-other").unwrap(), "kept");
        let mut h = forged();
        set_forwarding_headers(&mut h, "10.0.0.1".parse().unwrap(), true);
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.2.3.4, 5.6.7.8, 10.0.0.1"
        );
        assert_eq!(h.get("x-real-ip").unwrap(), "1.2.3.4");
        assert_eq!(h.get("forwarded").unwrap(), "for=1.2.3.4");
    }

    #[test]
    fn the_caller_is_the_peer_unless_a_trusted_proxy_says_otherwise() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "1.2.3.4, 5.6.7.8".parse().unwrap());
        assert_eq!(caller_address(&h, peer, false), peer);
        assert_eq!(
            caller_address(&h, peer, true),
            "5.6.7.8".parse::<IpAddr>().unwrap()
        );
        assert_eq!(caller_address(&HeaderMap::new(), peer, true), peer);
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        append_x_forwarded_for(&mut h, "10.0.0.1".parse().unwrap());
        append_x_forwarded_for(&mut h, "::1".parse().unwrap());
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, ::1");
    }
}
