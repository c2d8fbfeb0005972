//! Where the proxy listens and how clients reach it: addresses, TLS, HTTP/2 WebSockets, and
//! what it believes of the network in front of it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

/// One `--tls-sni-cert NAME=CERT,KEY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniCertFlag {
    /// The cluster's name, as given (checked when the proxy starts).
    pub name: String,
    /// Its certificate chain and private key (PEM).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Parses `NAME=CERT,KEY`.
pub fn parse_sni_cert(value: &str) -> Result<SniCertFlag, String> {
    let (name, files) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?}: expected NAME=CERT,KEY"))?;
    match files.split_once(',') {
        Some((cert, key)) if !name.is_empty() && !cert.is_empty() && !key.is_empty() => {
            Ok(SniCertFlag {
                name: name.to_owned(),
                cert: cert.into(),
                key: key.into(),
            })
        }
        _ => Err(format!("{value:?}: expected NAME=CERT,KEY")),
    }
}

/// Listeners and TLS.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct ListenerArgs {
    /// Address of the main listener: the Kubernetes API as clients see it.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,

    /// Address of the admin listener: /healthz, /readyz and /metrics.
    ///
    /// Separate from the main listener because /healthz there belongs to the upstream API
    /// server.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_ADMIN_LISTEN",
        default_value = "127.0.0.1:8081",
        value_name = "ADDR"
    )]
    pub admin_listen: SocketAddr,

    /// PEM certificate chain: serve TLS on the main listener.
    ///
    /// Re-read when the file changes (rotation without restart). Without it the main listener
    /// speaks plain HTTP.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TLS_CERT_FILE",
        requires = "tls_private_key_file",
        value_name = "FILE"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of `--tls-cert-file`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file",
        value_name = "FILE"
    )]
    pub tls_private_key_file: Option<PathBuf>,

    /// A cluster's own serving certificate, for its host name (repeatable): `NAME=CERT,KEY`.
    ///
    /// Served to clients asking (SNI) for `NAME.SUFFIX` of `--cluster-host-suffix`, instead of
    /// `--tls-cert-file` (which serves every other name: a wildcard `*.SUFFIX` certificate
    /// there covers every cluster). Re-read when its files change.
    #[arg(
        long = "tls-sni-cert",
        env = "KUBE_WS_PROXY_TLS_SNI_CERTS",
        value_delimiter = ';',
        value_parser = parse_sni_cert,
        requires_all = ["tls_cert_file", "cluster_host_suffix"],
        value_name = "NAME=CERT,KEY"
    )]
    pub tls_sni_certs: Vec<SniCertFlag>,

    /// PEM CA bundle: accept client certificates it signs on the TLS listener.
    ///
    /// A client certificate identifies the caller in impersonate and front-proxy modes (CN is
    /// the user, O the groups). Connections without a client certificate are still accepted;
    /// ones with an untrusted certificate are not.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_CLIENT_CA_FILE",
        requires = "tls_cert_file",
        value_name = "FILE"
    )]
    pub client_ca_file: Option<PathBuf>,

    /// Let HTTP/2 clients open WebSockets as streams of one TLS connection (RFC 8441).
    ///
    /// Extended CONNECT, advertised in the HTTP/2 SETTINGS, on the same paths, subprotocols,
    /// authentication and limits as HTTP/1.1 upgrades; each session counts against
    /// `--max-sessions`. `false`: HTTP/2 clients open their WebSockets over HTTP/1.1
    /// connections.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_HTTP2_WEBSOCKETS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub http2_websockets: bool,

    /// Trust the `X-Forwarded-For` set by a proxy or load balancer in front of this one.
    ///
    /// Keeps the client's `X-Forwarded-For` and appends the peer's address to it, keeps its
    /// `X-Real-Ip` and `Forwarded`, and charges TokenReviews to the last address in
    /// `X-Forwarded-For`. Without it (the default), a caller's own `X-Forwarded-For` is
    /// replaced by its address and its `X-Real-Ip` and `Forwarded` are removed, so it cannot
    /// choose what the API server records as the request's source.
    #[arg(long, env = "KUBE_WS_PROXY_TRUST_X_FORWARDED_FOR")]
    pub trust_x_forwarded_for: bool,

    /// The other replicas' main listeners, asked by `?allReplicas=true` (sessions API).
    ///
    /// Repeatable or comma-separated. Each URL's host is resolved at every such call, so a headless Service's name
    /// (`https://kube-ws-proxy-peers.NS.svc:8443`) stands for every ready replica. A call is
    /// passed on with the caller's own bearer token; each replica authorizes it again.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_PEERS",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub peers: Vec<String>,

    /// PEM CA bundle that signed the other replicas' serving certificates (`--peers`).
    ///
    /// Checked for the peer URL's host name; the web PKI roots without it.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_PEER_CA_FILE",
        requires = "peers",
        value_name = "FILE"
    )]
    pub peer_ca_file: Option<PathBuf>,

    /// List the sessions API's group in the cluster's discovery (`GET /apis`).
    ///
    /// The upstream's group list (v1, or the aggregated v2/v2beta1 kubectl 1.26+ asks for)
    /// gets `kube-ws-proxy.io` appended when it is JSON of at most 8 MiB, so that
    /// `kubectl get sessions.kube-ws-proxy.io` works through the proxy. `false`: `/apis` is
    /// the upstream's alone, and the API is reached with `kubectl get --raw`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_SESSIONS_DISCOVERY",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub sessions_discovery: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_certs_are_name_equals_cert_comma_key() {
        assert_eq!(
            parse_sni_cert("prod-eu=/tls/eu.crt,/tls/eu.key").unwrap(),
            SniCertFlag {
                name: "prod-eu".into(),
                cert: "/tls/eu.crt".into(),
                key: "/tls/eu.key".into(),
            }
        );
        for bad in [
            "prod-eu",
            "prod-eu=/a.crt",
            "=/a.crt,/a.key",
            "a=,/a.key",
            "a=/a.crt,",
        ] {
            assert!(parse_sni_cert(bad).is_err(), "{bad}");
        }
    }
}
