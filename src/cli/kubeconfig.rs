//! Flags of the `kubeconfig` subcommand: where kubectl reaches the proxy and how it trusts it;
//! the clusters are the proxy's own flags and `--config` file, read as `serve` reads them.

use std::path::PathBuf;

use clap::Args;

use super::ServeArgs;

const KUBECONFIG: &str = "Kubeconfig";

/// Flags of `kubeconfig`.
#[derive(Debug, Clone, Args)]
pub struct KubeconfigArgs {
    /// The proxy's URL as kubectl reaches it (the gateway in front, if any).
    ///
    /// E.g. https://proxy.example.com; a path is kept (https://gw.example.com/k8s).
    #[arg(long, value_name = "URL", help_heading = KUBECONFIG)]
    pub server: String,
    /// Write the kubeconfig to this file (mode 0600) instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE", help_heading = KUBECONFIG)]
    pub output: Option<PathBuf>,
    /// PEM CA certificates kubectl verifies the proxy (or gateway) with.
    ///
    /// Embedded as `certificate-authority-data`. Without it, kubectl uses the system's roots.
    #[arg(
        long,
        conflicts_with = "insecure_skip_tls_verify",
        value_name = "FILE",
        help_heading = KUBECONFIG
    )]
    pub certificate_authority: Option<PathBuf>,
    /// kubectl does not verify the proxy's certificate (insecure).
    #[arg(long, help_heading = KUBECONFIG)]
    pub insecure_skip_tls_verify: bool,
    /// The name kubectl expects in the proxy's certificate, if not the `--server` host.
    #[arg(long, value_name = "NAME", help_heading = KUBECONFIG)]
    pub tls_server_name: Option<String>,
    /// The proxy's flags, as it is started with: they name the clusters (none is reached).
    #[command(flatten)]
    pub serve: ServeArgs,
}
