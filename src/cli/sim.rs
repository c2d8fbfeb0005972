//! Flags of the `demo` and `sim-cluster` subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::parse_duration;
use crate::sim::{SimStreaming, SimUser};

/// Flags of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address of the proxy in the demo; loopback unless `--allow-remote-demo`.
    ///
    /// The demo's pod runs commands on this host, as this user, for anyone who reaches the
    /// proxy, with no credentials.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Let `--listen` be beyond loopback (anyone who reaches it runs commands here).
    ///
    /// Without it, `demo` refuses such an address; with it, it warns.
    #[arg(long)]
    pub allow_remote_demo: bool,
    /// Where to write the demo kubeconfig.
    #[arg(
        long,
        default_value = "kube-ws-proxy-demo.kubeconfig",
        value_name = "FILE"
    )]
    pub kubeconfig: PathBuf,
    /// One simulated cluster of this kind instead of three (see `sim-cluster --streaming`).
    ///
    /// Without it, three: `old` (spdy-only), `new` and `ws-only` (websocket-only), each under
    /// `/clusters/NAME/`. With it, one, served without a prefix as before.
    #[arg(long, value_name = "KIND")]
    pub sim_streaming: Option<SimStreaming>,
}

// Authentication flags are named like kube-apiserver's.
const SERVING: &str = "Serving";
const AUTHENTICATION: &str = "Authentication";
const FRONT_PROXY: &str = "Front-proxy (request-header) authentication";

/// Flags of `sim-cluster`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Loopback address of the simulated cluster.
    #[arg(long, default_value = "127.0.0.1:6443", value_name = "ADDR", help_heading = SERVING)]
    pub listen: SocketAddr,
    /// Streaming protocols the cluster speaks: `spdy-only`, `new` or `websocket-only`.
    ///
    /// `spdy-only`: an old cluster. `new`: a 1.31+ API server that also serves v5 exec/attach
    /// and the port-forward tunnel itself. `websocket-only`: `new` behind a path that answers
    /// SPDY upgrades with 400.
    #[arg(long, default_value = "spdy-only", value_name = "KIND", help_heading = SERVING)]
    pub streaming: SimStreaming,
    /// How long an exec's command waits to start (a runtime takes 10–20 ms); 0: at once.
    ///
    /// A random time between half of this and this, so that a client racing its own set-up
    /// against the first output meets the race as against a real cluster. Benchmarks use 0.
    #[arg(
        long,
        default_value = "20ms",
        value_parser = parse_duration,
        value_name = "DURATION",
        help_heading = SERVING
    )]
    pub exec_start_delay: Duration,
    /// PEM serving certificate chain: serve HTTPS.
    #[arg(
        long,
        requires = "tls_private_key_file",
        value_name = "FILE",
        help_heading = SERVING
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--tls-cert-file`.
    #[arg(long, requires = "tls_cert_file", value_name = "FILE", help_heading = SERVING)]
    pub tls_private_key_file: Option<PathBuf>,

    /// Require a bearer token on every request; this one authenticates as user `sim-user`.
    #[arg(long, value_name = "TOKEN", help_heading = AUTHENTICATION)]
    pub require_token: Option<String>,
    /// A bearer token and its user: `TOKEN=NAME[:GROUP,GROUP...]`. Repeatable.
    #[arg(
        long = "token-user",
        value_name = "TOKEN=NAME[:GROUPS]",
        help_heading = AUTHENTICATION
    )]
    pub token_users: Vec<SimUser>,
    /// A user allowed to impersonate anyone (Impersonate-* headers). Repeatable.
    #[arg(long = "impersonator", value_name = "NAME", help_heading = AUTHENTICATION)]
    pub impersonators: Vec<String>,
    /// PEM CA bundle: client certificates it signs authenticate (user = CN, groups = O).
    #[arg(
        long,
        requires = "tls_cert_file",
        value_name = "FILE",
        help_heading = AUTHENTICATION
    )]
    pub client_ca_file: Option<PathBuf>,

    /// PEM CA bundle of front proxies: a client certificate it signs makes the user headers
    /// count.
    #[arg(
        long,
        requires = "tls_cert_file",
        value_name = "FILE",
        help_heading = FRONT_PROXY
    )]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names a front-proxy certificate may have (comma list); empty: any.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "requestheader_client_ca_file",
        value_name = "NAMES",
        help_heading = FRONT_PROXY
    )]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers naming the user behind a front proxy (comma list); the first non-empty counts.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-User",
        value_name = "HEADERS",
        help_heading = FRONT_PROXY
    )]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying the groups behind a front proxy (comma list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-Group",
        value_name = "HEADERS",
        help_heading = FRONT_PROXY
    )]
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes behind a front proxy (comma list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-Extra-",
        value_name = "PREFIXES",
        help_heading = FRONT_PROXY
    )]
    pub requestheader_extra_headers_prefix: Vec<String>,
}
