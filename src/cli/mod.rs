//! Command-line interface, one file per group of flags as `--help` shows them.
//!
//! Every flag of the proxy can also be set in the environment (`KUBE_WS_PROXY_<FLAG>`) or in
//! the `--config` file ([`crate::config_file`]); the command line wins over the environment,
//! the environment over the file. The groups only shape `--help` and the code that reads them
//! (`args.limits.max_sessions`): flag names, environment variables and config-file keys are
//! flat, and `surface.txt` pins them.
//!
//! The groups live here rather than beside the modules that use them so the proxy takes
//! plain typed settings and never depends on clap, and the whole user-visible surface can be
//! reviewed in one place.

mod audit;
mod auth;
mod clusters;
mod keepalive;
mod kubeconfig;
mod limits;
mod listeners;
mod process;
mod sim;
mod streaming;
#[cfg(test)]
pub(crate) mod surface;
mod upstream;
mod values;

use clap::{Args, Parser, Subcommand};

pub use self::audit::AuditArgs;
pub use self::auth::AuthArgs;
pub use self::clusters::{ClusterEntry, ClusterFlag};
pub use self::keepalive::KeepaliveArgs;
pub use self::kubeconfig::KubeconfigArgs;
pub use self::limits::LimitArgs;
pub use self::listeners::{ListenerArgs, SniCertFlag};
pub use self::process::{ConfigOrigin, FileSettings, LogFormat, ProcessArgs};
pub use self::sim::{DemoArgs, SimArgs};
pub use self::streaming::StreamingArgs;
pub use self::upstream::UpstreamArgs;
pub use self::values::{
    nonzero, parse_bytes, parse_bytes_or_zero, parse_duration, parse_header_name,
};
pub use crate::audit::recording::RecordPolicy;
pub use crate::proxy::auth::AuthMode;
use crate::proxy::upstream::source::UpstreamFlags;
pub use crate::proxy::upstream::streaming::UpstreamStreaming;

/// A Kubernetes API proxy that gives every cluster WebSocket streaming.
///
/// kube-ws-proxy terminates kubectl's WebSocket exec/attach (v5.channel.k8s.io) and
/// port-forward (SPDY/3.1+portforward.k8s.io) connections and re-originates them as SPDY/3.1
/// towards API servers that only speak SPDY. Everything else is reverse-proxied unchanged.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ws-proxy",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "Every flag can also be set in the environment ([env: ...]) or in the --config \
                  file. The command line wins over the environment, the environment over the \
                  file. Durations take ms, s, m or h; sizes Ki, Mi or Gi."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands besides the default (serving).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start three simulated clusters (old SPDY-only, new, WebSocket-only) behind the proxy,
    /// write a kubeconfig with a context for each and print kubectl commands to try.
    ///
    /// With `--sim-streaming KIND`, one simulated cluster of that kind, as the unnamed upstream.
    Demo(DemoArgs),
    /// Print a kubeconfig for kubectl users of the proxy: a cluster, user and context per
    /// configured cluster (`server: URL/clusters/NAME`), and one for the unnamed upstream.
    ///
    /// Give it `--server` and the flags (or `--config` file) the proxy runs with; no cluster
    /// is reached and no credential of the proxy's is read or printed. Users are left empty:
    /// set credentials with `kubectl config set-credentials NAME ...`.
    // Boxed: it holds all of the proxy's flags.
    Kubeconfig(Box<KubeconfigArgs>),
    /// Run only a simulated cluster (an API server and kubelet on loopback).
    ///
    /// SPDY-only unless `--streaming` says otherwise. With any of `--require-token`,
    /// `--token-user`, `--client-ca-file` or `--requestheader-client-ca-file`, every request
    /// must authenticate (else 401).
    // Boxed: its many flags would make every `Command` large.
    SimCluster(Box<SimArgs>),
}

/// The flags of the proxy itself, by concern.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub listeners: ListenerArgs,
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub streaming: StreamingArgs,
    #[command(flatten)]
    pub keepalive: KeepaliveArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub process: ProcessArgs,
}

impl ServeArgs {
    /// The flags that locate the upstream, for [`resolve`](crate::proxy::upstream::source::resolve).
    pub fn upstream_flags(&self) -> UpstreamFlags {
        self.upstream.flags()
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn sim_cluster_flags() {
        let cli = Cli::try_parse_from([
            "kube-ws-proxy",
            "sim-cluster",
            "--tls-cert-file",
            "c.pem",
            "--tls-private-key-file",
            "k.pem",
            "--requestheader-client-ca-file",
            "fp.pem",
            "--requestheader-allowed-names",
            "front-proxy,aggregator",
            "--token-user",
            "t1=alice:dev,ops",
            "--token-user",
            "t2=bob",
            "--impersonator",
            "alice",
        ])
        .unwrap();
        let Some(Command::SimCluster(a)) = cli.command else {
            panic!("not sim-cluster");
        };
        assert_eq!(a.requestheader_allowed_names, ["front-proxy", "aggregator"]);
        assert_eq!(a.requestheader_username_headers, ["X-Remote-User"]);
        assert_eq!(a.requestheader_extra_headers_prefix, ["X-Remote-Extra-"]);
        assert_eq!(a.token_users.len(), 2);
        assert_eq!(a.token_users[0].groups, ["dev", "ops"]);
        assert_eq!(a.impersonators, ["alice"]);
        assert!(
            Cli::try_parse_from(["kube-ws-proxy", "sim-cluster", "--client-ca-file", "x"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["kube-ws-proxy", "sim-cluster", "--token-user", "x"]).is_err()
        );
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The `--help` headings, in the order they are shown.
    const HEADINGS: [&str; 8] = [
        "Listeners and TLS",
        "Upstream",
        "Authentication",
        "Streaming",
        "Keepalive",
        "Limits and timeouts",
        "Audit and recording",
        "Process and logging",
    ];

    #[test]
    fn every_flag_is_in_a_group() {
        let mut cmd = Cli::command();
        cmd.build();
        let mut seen = Vec::new();
        for arg in cmd.get_arguments() {
            let long = arg.get_long().unwrap_or_default();
            if matches!(long, "help" | "version") {
                assert_eq!(arg.get_help_heading(), None, "--{long}");
                continue;
            }
            let heading = arg.get_help_heading();
            assert!(
                heading.is_some_and(|h| HEADINGS.contains(&h)),
                "--{long} is under {heading:?}, not one of the groups"
            );
            if !seen.contains(&heading.unwrap()) {
                seen.push(heading.unwrap());
            }
        }
        assert_eq!(seen, HEADINGS, "every group, in this order");
    }

    #[test]
    fn help_shows_the_groups_and_no_implementation_remarks() {
        let help = Cli::command().render_long_help().to_string();
        let mut at = 0;
        for heading in HEADINGS {
            let found = help[at..].find(&format!("\n{heading}:\n"));
            at += found.unwrap_or_else(|| panic!("no heading {heading:?} in order:\n{help}"));
        }
        let sim = Cli::command()
            .find_subcommand_mut("sim-cluster")
            .unwrap()
            .render_long_help()
            .to_string();
        for text in [&help, &sim] {
            for remark in ["Boxed", "`Command`", "reference server", "the model"] {
                assert!(!text.contains(remark), "{remark:?} in --help:\n{text}");
            }
        }
    }

    #[test]
    fn every_flag_has_a_short_first_line() {
        let mut cmd = Cli::command();
        cmd.build();
        let commands = std::iter::once(&cmd).chain(cmd.get_subcommands());
        for arg in commands.flat_map(|c| c.get_arguments()) {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let long = arg.get_id();
            assert!(!help.is_empty(), "--{long} has no help");
            assert!(help.chars().count() <= 100, "--{long}: {help}");
        }
    }
}
