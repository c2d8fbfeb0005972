//! Routing by host name (`--cluster-host-suffix`): the cluster a request's host names,
//! `NAME.SUFFIX`, read once from its target's authority (absolute form, HTTP/2 and RFC 8441
//! `:authority`) and its `Host` header ([`request_host`]), and checked against the name the
//! connection's TLS handshake asked for (SNI): a request for another cluster than the one the
//! connection was made for is misdirected (421), which also keeps HTTP/2 connection
//! coalescing from carrying cluster b's requests over a connection made for cluster a.
//!
//! A host that is not `NAME.SUFFIX` (the proxy's own name, an address, none at all) names no
//! cluster: the path decides then, as without a suffix.

use crate::request::host::{request_host, HostName, HostRefusal, HostSuffix};

/// Why a request's host routes it nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostUnrouted {
    /// The host cannot be read safely (400).
    #[error("{0}: the request is not routed to any cluster")]
    Refused(#[from] HostRefusal),
    /// The connection's TLS server name named another cluster than the request's host (421).
    #[error(
        "the request's host names another cluster than the TLS server name of its connection: \
         open a connection for that host"
    )]
    Misdirected,
}

/// The `Host` headers and target authority of a request, and whether it is HTTP/1.1 (which
/// must have a `Host` header).
pub struct HostFields<'h, I: Iterator<Item = &'h [u8]>> {
    pub authority: Option<&'h [u8]>,
    pub host_headers: I,
    pub http11: bool,
}

/// The cluster name a request's host gives under `suffix`, if it gives one, from its
/// `fields`; refused when the host cannot be read, or when `sni` (the connection's TLS server
/// name) names a cluster and the request's host does not name the same one.
pub fn cluster_by_host<'h, I: Iterator<Item = &'h [u8]>>(
    suffix: &HostSuffix,
    fields: HostFields<'h, I>,
    sni: Option<&HostName>,
) -> Result<Option<String>, HostUnrouted> {
    let host = request_host(fields.authority, fields.host_headers, fields.http11)?;
    let named = host
        .as_ref()
        .and_then(|h| h.name())
        .and_then(|name| suffix.label_of(name));
    let connection_for = sni.and_then(|sni| suffix.label_of(sni));
    match connection_for {
        Some(sni_cluster) if named != Some(sni_cluster) => Err(HostUnrouted::Misdirected),
        _ => Ok(named.map(str::to_owned)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_host(host: &str, sni: Option<&str>) -> Result<Option<String>, HostUnrouted> {
        let suffix = HostSuffix::parse("kube.example.com").unwrap();
        let sni = sni.map(|s| HostName::parse(s.as_bytes()).unwrap());
        let fields = HostFields {
            authority: None,
            host_headers: std::iter::once(host.as_bytes()),
            http11: true,
        };
        cluster_by_host(&suffix, fields, sni.as_ref())
    }

    #[test]
    fn a_host_under_the_suffix_names_its_cluster() {
        assert_eq!(by_host("a.kube.example.com", None), Ok(Some("a".into())));
        assert_eq!(
            by_host("A.Kube.Example.Com.:8443", None),
            Ok(Some("a".into()))
        );
        for other in [
            "kube.example.com",
            "proxy.example.com",
            "127.0.0.1:1",
            "[::1]",
            "",
        ] {
            assert_eq!(by_host(other, None), Ok(None), "{other}");
        }
        assert!(matches!(
            by_host("a%2ekube.example.com", None),
            Err(HostUnrouted::Refused(HostRefusal::BadByte))
        ));
    }

    #[test]
    fn a_connection_made_for_one_cluster_serves_only_that_one() {
        let sni = Some("a.kube.example.com");
        assert_eq!(by_host("a.kube.example.com:443", sni), Ok(Some("a".into())));
        assert_eq!(by_host("A.KUBE.example.com.", sni), Ok(Some("a".into())));
        for other in ["b.kube.example.com", "proxy.example.com", "127.0.0.1", ""] {
            assert_eq!(
                by_host(other, sni),
                Err(HostUnrouted::Misdirected),
                "{other}"
            );
        }
        // A connection made for a name that is not a cluster's may carry any request (a
        // certificate covering both is what let the client reuse it).
        for sni in [Some("proxy.example.com"), Some("kube.example.com"), None] {
            assert_eq!(by_host("b.kube.example.com", sni), Ok(Some("b".into())));
        }
    }
}
