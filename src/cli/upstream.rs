//! Where the upstream API server is and the credentials the proxy holds for it.

use std::path::PathBuf;

use clap::Args;

use super::clusters::{parse_cluster_flag, ClusterEntry, ClusterFlag};
use crate::proxy::upstream::source::UpstreamFlags;

/// Upstream.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Upstream")]
pub struct UpstreamArgs {
    /// URL of the upstream API server (or kubelet), e.g. https://10.0.0.1:6443.
    ///
    /// One of `--upstream`, `--kubeconfig`, `--in-cluster` and `--cluster` is required.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM",
        conflicts_with_all = ["kubeconfig", "in_cluster"],
        value_name = "URL"
    )]
    pub upstream: Option<String>,

    /// Take the upstream and the proxy's own credentials from this kubeconfig.
    ///
    /// The server, its CA and TLS server name; a client certificate, token or token file.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_KUBECONFIG",
        conflicts_with = "in_cluster",
        value_name = "FILE"
    )]
    pub kubeconfig: Option<PathBuf>,

    /// Context of `--kubeconfig` to use instead of its current context.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_CONTEXT",
        requires = "kubeconfig",
        value_name = "NAME"
    )]
    pub context: Option<String>,

    /// Run against the cluster the proxy's pod is in.
    ///
    /// Uses KUBERNETES_SERVICE_HOST/PORT, the service-account CA, and its token (re-read when
    /// the kubelet rotates it).
    #[arg(long, env = "KUBE_WS_PROXY_IN_CLUSTER")]
    pub in_cluster: bool,

    /// Where `--in-cluster` finds `token` and `ca.crt`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_SERVICE_ACCOUNT_DIR",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount",
        value_name = "DIR"
    )]
    pub service_account_dir: PathBuf,

    /// PEM CA certificates that sign the upstream's serving certificate.
    ///
    /// Overrides the CA of `--kubeconfig` or `--in-cluster`; without any, the system's web PKI
    /// roots are used.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_CA_FILE", value_name = "FILE")]
    pub upstream_ca_file: Option<PathBuf>,

    /// Do not verify the upstream's TLS certificate (insecure: for experiments only).
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_INSECURE_SKIP_TLS_VERIFY")]
    pub upstream_insecure_skip_tls_verify: bool,

    /// File with the proxy's own bearer token for the upstream.
    ///
    /// Re-read when it changes. Used in impersonate mode and for TokenReviews; never in
    /// passthrough mode.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_TOKEN_FILE", value_name = "FILE")]
    pub upstream_token_file: Option<PathBuf>,

    /// The proxy's own client certificate for the upstream (PEM).
    ///
    /// Used in impersonate mode and for TokenReviews; never in passthrough mode.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_CLIENT_CERT_FILE",
        requires = "upstream_client_key_file",
        value_name = "FILE"
    )]
    pub upstream_client_cert_file: Option<PathBuf>,

    /// Private key of `--upstream-client-cert-file` (PEM).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_CLIENT_KEY_FILE",
        requires = "upstream_client_cert_file",
        value_name = "FILE"
    )]
    pub upstream_client_key_file: Option<PathBuf>,

    /// A cluster served under `/clusters/NAME/` (repeatable): `NAME=URL`.
    ///
    /// NAME is a DNS label. Such a cluster is verified with `--upstream-ca-file` (or
    /// `--upstream-insecure-skip-tls-verify`) and takes `--auth-mode` and
    /// `--upstream-streaming`, but no credentials of the proxy's: give those per cluster in
    /// `clusters:` of the `--config` file. With `--upstream` (or `--kubeconfig`,
    /// `--in-cluster`) too, that upstream serves the requests without a prefix.
    #[arg(
        long = "cluster",
        env = "KUBE_WS_PROXY_CLUSTERS",
        value_delimiter = ',',
        value_parser = parse_cluster_flag,
        value_name = "NAME=URL"
    )]
    pub clusters: Vec<ClusterFlag>,

    /// Route requests for host `NAME.DOMAIN` to cluster NAME, e.g. `kube.example.com`.
    ///
    /// On such a host the path is the cluster's own (no `/clusters/` prefix is read); a name
    /// under the domain that is no cluster's gets a 404. Other hosts are routed by path. Over
    /// TLS, a request whose host names another cluster than the connection's server name
    /// (SNI) is refused with 421.
    #[arg(long, env = "KUBE_WS_PROXY_CLUSTER_HOST_SUFFIX", value_name = "DOMAIN")]
    pub cluster_host_suffix: Option<String>,

    /// The `clusters:` of the `--config` file.
    #[arg(skip)]
    pub file_clusters: Vec<ClusterEntry>,
}

impl UpstreamArgs {
    /// The flags as [`resolve`](crate::proxy::upstream::source::resolve) takes them.
    pub fn flags(&self) -> UpstreamFlags {
        UpstreamFlags {
            upstream: self.upstream.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            in_cluster: self.in_cluster,
            service_account_dir: self.service_account_dir.clone(),
            upstream_ca_file: self.upstream_ca_file.clone(),
            upstream_insecure_skip_tls_verify: self.upstream_insecure_skip_tls_verify,
            upstream_token_file: self.upstream_token_file.clone(),
            upstream_client_cert_file: self.upstream_client_cert_file.clone(),
            upstream_client_key_file: self.upstream_client_key_file.clone(),
        }
    }
}
