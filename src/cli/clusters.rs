//! The clusters behind one proxy as the user gives them: `--cluster NAME=URL` for the simple
//! case, and `clusters:` in the `--config` file for the full one (each entry takes the
//! upstream and auth flags' names as keys, for that cluster alone).

use std::path::PathBuf;

use serde::Deserialize;

use crate::proxy::auth::AuthMode;
use crate::proxy::upstream::streaming::UpstreamStreaming;

/// One `--cluster NAME=URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFlag {
    /// The name, as given (checked when the proxy starts).
    pub name: String,
    /// Its API server.
    pub url: String,
}

/// Parses `NAME=URL`.
pub fn parse_cluster_flag(value: &str) -> Result<ClusterFlag, String> {
    let (name, url) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?}: expected NAME=URL"))?;
    if url.is_empty() {
        return Err(format!("{value:?}: the URL is empty"));
    }
    Ok(ClusterFlag {
        name: name.to_owned(),
        url: url.to_owned(),
    })
}

/// One entry of `clusters:` in the config file. Keys are the proxy's flag names; what an entry
/// does not say comes from the proxy's own flags only for settings that carry no credentials
/// (`auth-mode`, `upstream-streaming`): a token, certificate or CA is only ever the one given
/// for that cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClusterEntry {
    /// Its name: a DNS label.
    pub name: String,
    /// Its API server's URL (or `kubeconfig`, or `in-cluster`).
    pub upstream: Option<String>,
    /// A kubeconfig with its server and the proxy's credentials for it.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use instead of its current one.
    pub context: Option<String>,
    /// The cluster the proxy's pod runs in.
    #[serde(default)]
    pub in_cluster: bool,
    /// Where `in-cluster` finds `token` and `ca.crt`.
    pub service_account_dir: Option<PathBuf>,
    /// PEM CA certificates of its serving certificate.
    pub upstream_ca_file: Option<PathBuf>,
    /// Do not verify its certificate (insecure).
    #[serde(default)]
    pub upstream_insecure_skip_tls_verify: bool,
    /// The proxy's own bearer token for it.
    pub upstream_token_file: Option<PathBuf>,
    /// The proxy's own client certificate for it, and its key.
    pub upstream_client_cert_file: Option<PathBuf>,
    pub upstream_client_key_file: Option<PathBuf>,
    /// How its callers are authenticated (default: the proxy's `--auth-mode`).
    pub auth_mode: Option<AuthMode>,
    /// The front-proxy client certificate and key for it (`auth-mode: front-proxy`).
    pub front_proxy_client_cert_file: Option<PathBuf>,
    pub front_proxy_client_key_file: Option<PathBuf>,
    /// How its streaming sessions go upstream (default: the proxy's `--upstream-streaming`).
    pub upstream_streaming: Option<UpstreamStreaming>,
    /// At most this many of its sessions at once (beyond: 429), within the proxy's
    /// `--max-sessions`; so that one slow or hung cluster cannot hold every slot.
    pub max_sessions: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_flags_are_name_equals_url() {
        assert_eq!(
            parse_cluster_flag("prod-eu=https://10.0.0.1:6443/base?x=1").unwrap(),
            ClusterFlag {
                name: "prod-eu".into(),
                url: "https://10.0.0.1:6443/base?x=1".into()
            }
        );
        assert!(parse_cluster_flag("prod-eu").is_err());
        assert!(parse_cluster_flag("prod-eu=").is_err());
    }
}
