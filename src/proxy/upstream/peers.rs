//! The other replicas of this proxy (`--peers`): where an operator's "every replica" call is
//! passed on. Each peer URL names a host that may stand for many replicas (a headless
//! Service's name resolves to every ready pod), so it is resolved again at each call: replicas
//! come and go without a restart. The answers come from the replicas themselves, each
//! authenticating and authorizing the caller again.

use std::net::SocketAddr;
use std::time::Duration;

use super::endpoint::{Upstream, UpstreamTls};
use super::error::UpstreamError;
use super::pem::Pem;

/// At most this many replicas are asked, all peer URLs together: the bound on what one call
/// can make the proxy dial.
pub const MAX_PEER_ADDRESSES: usize = 64;

/// How long dialling one replica may take.
pub const PEER_DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// One `--peers` URL.
#[derive(Debug, Clone)]
struct PeerUrl {
    https: bool,
    host: String,
    port: u16,
}

/// The configured peers, and how to reach them.
#[derive(Debug, Clone)]
pub struct Peers {
    urls: Vec<PeerUrl>,
    /// The CA that signed the replicas' serving certificates (`--peer-ca-file`; the web PKI
    /// roots without it). The certificate is checked for the URL's host name, whichever of
    /// its addresses is dialled.
    ca: Option<Pem>,
}

/// One replica, as resolved now.
#[derive(Debug)]
pub struct Peer {
    /// Its address, for messages.
    pub addr: SocketAddr,
    /// How to reach it.
    pub upstream: Upstream,
}

impl Peers {
    /// The peers at `urls` (`https://NAME:PORT` or `http://…`; a path is not allowed), their
    /// certificates checked against `ca`.
    pub fn new(urls: &[String], ca: Option<Pem>) -> Result<Peers, UpstreamError> {
        let urls = urls
            .iter()
            .map(|u| parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Peers { urls, ca })
    }

    /// Whether any peer is configured.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// Every replica the peer URLs stand for now (at most [`MAX_PEER_ADDRESSES`]), and the
    /// URLs that could not be resolved, with why.
    pub async fn resolve(&self) -> (Vec<Peer>, Vec<String>) {
        let mut peers: Vec<Peer> = Vec::new();
        let mut failed = Vec::new();
        for url in &self.urls {
            let host = url.host.trim_start_matches('[').trim_end_matches(']');
            let addrs = match tokio::net::lookup_host((host, url.port)).await {
                Ok(addrs) => addrs,
                Err(e) => {
                    failed.push(format!("{}:{}: {e}", url.host, url.port));
                    continue;
                }
            };
            for addr in addrs {
                if peers.len() >= MAX_PEER_ADDRESSES {
                    break;
                }
                if peers.iter().any(|p| p.addr == addr) {
                    continue;
                }
                match self.upstream(url, addr) {
                    Ok(upstream) => peers.push(Peer { addr, upstream }),
                    Err(e) => failed.push(format!("{addr}: {e}")),
                }
            }
        }
        (peers, failed)
    }

    /// How to reach the replica at `addr`, which `url` resolved to.
    fn upstream(&self, url: &PeerUrl, addr: SocketAddr) -> Result<Upstream, UpstreamError> {
        let scheme = if url.https { "https" } else { "http" };
        let tls = UpstreamTls {
            ca: self.ca.clone(),
            server_name: Some(
                url.host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
            ),
            ..UpstreamTls::default()
        };
        Ok(Upstream::from_url(&format!("{scheme}://{addr}"), tls)?
            .with_dial_timeout(PEER_DIAL_TIMEOUT))
    }
}

/// Reads one `--peers` URL.
fn parse(text: &str) -> Result<PeerUrl, UpstreamError> {
    let bad = |why: &str| UpstreamError::InvalidUrl(text.to_owned(), why.to_owned());
    let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
    let https = match url.scheme() {
        "https" => true,
        "http" => false,
        _ => return Err(bad("scheme must be https or http")),
    };
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(bad(
            "a peer is a replica's listener: scheme, host and port only",
        ));
    }
    let host = url.host_str().ok_or_else(|| bad("no host"))?.to_owned();
    let port = url.port_or_known_default().ok_or_else(|| bad("no port"))?;
    Ok(PeerUrl { https, host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_are_listeners() {
        let p = parse("https://kube-ws-proxy-peers.ops.svc:8443").unwrap();
        assert!(p.https);
        assert_eq!(p.host, "kube-ws-proxy-peers.ops.svc");
        assert_eq!(p.port, 8443);
        assert_eq!(parse("http://127.0.0.1").unwrap().port, 80);
        for bad in ["ftp://x", "https://x/base", "https://x:1/?q=1", "x:1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_name_resolves_to_each_of_its_addresses_once() {
        let peers = Peers::new(
            &[
                "http://localhost:7001".into(),
                "http://127.0.0.1:7001".into(),
            ],
            None,
        )
        .unwrap();
        let (found, failed) = peers.resolve().await;
        assert!(failed.is_empty(), "{failed:?}");
        let mut addrs: Vec<_> = found.iter().map(|p| p.addr).collect();
        addrs.dedup();
        assert_eq!(addrs.len(), found.len());
        assert!(addrs.contains(&"127.0.0.1:7001".parse().unwrap()));
    }

    #[tokio::test]
    async fn an_unknown_name_is_reported_not_fatal() {
        let peers = Peers::new(&["http://no-such-replica.invalid:1".into()], None).unwrap();
        let (found, failed) = peers.resolve().await;
        assert!(found.is_empty());
        assert_eq!(failed.len(), 1);
    }
}
