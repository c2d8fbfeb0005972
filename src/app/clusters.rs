//! The clusters behind the proxy, from the flags and the config file: the unnamed upstream of
//! `--upstream`/`--kubeconfig`/`--in-cluster`, each `--cluster NAME=URL` and each entry of
//! `clusters:`, each with its own upstream, credentials, auth mode and streaming mode.
//!
//! Credentials never cross from one cluster to another: the `--upstream-token-file` and
//! `--upstream-client-*` flags (and `--front-proxy-client-*`) belong to the unnamed upstream
//! only, a `--cluster` has none, and an entry of `clusters:` has exactly those it names.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::StartError;
use crate::cli::{nonzero, ClusterEntry, ClusterFlag, ServeArgs};
use crate::config_file::digest;
use crate::proxy::auth::{
    AccessReviews, AuthMode, Authenticator, FrontProxyHeaders, ReviewLimits, TokenReviewer,
};
use crate::proxy::route::cluster::{Cluster, ClusterName, DEFAULT_CLUSTER};
use crate::proxy::route::fleet::Fleet;
use crate::proxy::sessions::registry::Sessions;
use crate::proxy::upstream::endpoint::{Pem, Upstream, UpstreamTls};
use crate::proxy::upstream::source::{self, UpstreamFlags, UpstreamSource};
use crate::proxy::upstream::streaming::UpstreamStreaming;

/// What one cluster is made from: its settings with the proxy's defaults filled in, and what
/// the files read once when it is built held. Two equal specs make the same cluster: a reload
/// keeps a cluster whose spec it finds unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClusterSpec {
    name: Option<ClusterName>,
    flags: UpstreamFlags,
    mode: AuthMode,
    /// The front-proxy client certificate and key, for `front-proxy` mode.
    front_proxy: (Option<PathBuf>, Option<PathBuf>),
    streaming: UpstreamStreaming,
    /// Its own bound on running sessions (`max-sessions` of its entry).
    max_sessions: Option<usize>,
    /// Digests of its kubeconfig and CA file as they were read (`None`: not there). Tokens
    /// and client certificates are re-read when they rotate, so they are not among them.
    files: Vec<Option<u64>>,
}

impl ClusterSpec {
    fn new(
        name: Option<ClusterName>,
        flags: UpstreamFlags,
        mode: AuthMode,
        front_proxy: (Option<PathBuf>, Option<PathBuf>),
        streaming: UpstreamStreaming,
    ) -> ClusterSpec {
        let files = files_read_at_build(&flags);
        ClusterSpec {
            name,
            flags,
            mode,
            front_proxy,
            streaming,
            max_sessions: None,
            files,
        }
    }
}

/// Digests of the files a cluster reads once, when it is built: its kubeconfig and its CA.
fn files_read_at_build(flags: &UpstreamFlags) -> Vec<Option<u64>> {
    let in_cluster_ca = flags
        .in_cluster
        .then(|| flags.service_account_dir.join("ca.crt"));
    [
        flags.kubeconfig.as_ref(),
        flags.upstream_ca_file.as_ref(),
        in_cluster_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|file| std::fs::read(file).ok().map(|bytes| digest(&bytes)))
    .collect()
}

/// What one cluster is built with: its spec, and the proxy's settings for everything else
/// (timeouts, review limits, header names).
struct ClusterSetup<'a> {
    spec: &'a ClusterSpec,
    args: &'a ServeArgs,
}

/// Every configured cluster, their sessions stopped by `sessions`' stop signal; and the specs
/// of the named ones, which a reload compares with the file's.
pub(super) fn fleet_from_args(
    args: &ServeArgs,
    sessions: &Sessions,
) -> Result<(Fleet, BTreeMap<ClusterName, ClusterSpec>), StartError> {
    let flags = args.upstream_flags();
    let default = if !has_unnamed_upstream(args)? {
        None
    } else {
        let spec = ClusterSpec::new(
            None,
            flags,
            args.auth.auth_mode,
            (
                args.auth.front_proxy_client_cert_file.clone(),
                args.auth.front_proxy_client_key_file.clone(),
            ),
            args.streaming.upstream_streaming,
        );
        Some(build(&spec, args, sessions.cluster_stop())?)
    };
    let specs = named_specs(args, &args.upstream.clusters, &args.upstream.file_clusters)?;
    let mut named = Vec::new();
    for spec in specs.values() {
        named.push(build(spec, args, sessions.cluster_stop())?);
    }
    if default.is_none() && named.is_empty() {
        return Err(StartError::NoUpstream);
    }
    let fleet = Fleet::new(default, named).map_err(|e| StartError::Upstream(e.to_string()))?;
    Ok((fleet, specs))
}

/// Whether `args` configure the unnamed upstream (`--upstream`, `--kubeconfig`,
/// `--in-cluster`); without one, the flags that would give it credentials are refused.
fn has_unnamed_upstream(args: &ServeArgs) -> Result<bool, StartError> {
    let u = &args.upstream;
    let named_only = u.upstream.is_none() && u.kubeconfig.is_none() && !u.in_cluster;
    if named_only {
        refuse_stray_credentials(args)?;
    }
    Ok(!named_only)
}

/// The clusters `args` configure, as kubectl reaches them through the proxy: `None` for the
/// unnamed upstream (first, if there is one), then each named cluster in the order given
/// (`--cluster`, then `clusters:`). Checked as at the start of the proxy (names, duplicates,
/// one upstream per entry, credentials without an upstream), but nothing is built: no cluster
/// is reached, and its credential, CA and kubeconfig files need not be there.
pub fn configured_names(args: &ServeArgs) -> Result<Vec<Option<ClusterName>>, StartError> {
    let unnamed = has_unnamed_upstream(args)?;
    let (flags, entries) = (&args.upstream.clusters, &args.upstream.file_clusters);
    // Checks every name, and refuses one given twice.
    let specs = named_specs(args, flags, entries)?;
    if unnamed && specs.keys().any(|n| n.as_str() == DEFAULT_CLUSTER) {
        let e = crate::proxy::route::fleet::FleetError::DefaultTaken(DEFAULT_CLUSTER);
        return Err(StartError::Upstream(e.to_string()));
    }
    if !unnamed && specs.is_empty() {
        return Err(StartError::NoUpstream);
    }
    let given = flags
        .iter()
        .map(|f| f.name.as_str())
        .chain(entries.iter().map(|e| e.name.as_str()));
    let mut names = vec![None; usize::from(unnamed)];
    for name in given {
        names.push(Some(cluster_name(name)?));
    }
    Ok(names)
}

/// The named clusters of `flags` (`--cluster`) and `entries` (`clusters:`), by name, with the
/// proxy's defaults of `args`; a name given twice is an error.
pub(super) fn named_specs(
    args: &ServeArgs,
    flags: &[ClusterFlag],
    entries: &[ClusterEntry],
) -> Result<BTreeMap<ClusterName, ClusterSpec>, StartError> {
    let specs = flags
        .iter()
        .map(|flag| from_flag(flag, args))
        .chain(entries.iter().map(|entry| from_entry(entry, args)));
    let mut named = BTreeMap::new();
    for spec in specs {
        let spec = spec?;
        let name = spec
            .name
            .clone()
            .expect("a named cluster's spec has its name");
        if named.insert(name.clone(), spec).is_some() {
            return Err(StartError::Upstream(format!(
                "cluster {name:?} is configured twice"
            )));
        }
    }
    Ok(named)
}

/// Without an unnamed upstream, the flags that give it credentials have nothing to apply to;
/// sending them to every named cluster would hand one cluster's secret to all.
fn refuse_stray_credentials(args: &ServeArgs) -> Result<(), StartError> {
    let u = &args.upstream;
    let stray = [
        ("--upstream-token-file", u.upstream_token_file.is_some()),
        (
            "--upstream-client-cert-file",
            u.upstream_client_cert_file.is_some(),
        ),
        (
            "--front-proxy-client-cert-file",
            args.auth.front_proxy_client_cert_file.is_some(),
        ),
        ("--context", u.context.is_some()),
    ];
    match stray.iter().find(|(_, set)| *set) {
        Some((flag, _)) => Err(StartError::Upstream(format!(
            "{flag} applies to the upstream of --upstream, --kubeconfig or --in-cluster, and \
             there is none: give a named cluster's credentials in its entry of `clusters:` in \
             the --config file"
        ))),
        None => Ok(()),
    }
}

fn cluster_name(name: &str) -> Result<ClusterName, StartError> {
    ClusterName::parse(name).map_err(|e| StartError::Upstream(e.to_string()))
}

/// A `--cluster NAME=URL`: verified as the flags say, no credentials of the proxy's.
fn from_flag(flag: &ClusterFlag, args: &ServeArgs) -> Result<ClusterSpec, StartError> {
    let flags = UpstreamFlags {
        upstream: Some(flag.url.clone()),
        upstream_ca_file: args.upstream.upstream_ca_file.clone(),
        upstream_insecure_skip_tls_verify: args.upstream.upstream_insecure_skip_tls_verify,
        service_account_dir: args.upstream.service_account_dir.clone(),
        ..UpstreamFlags::default()
    };
    Ok(ClusterSpec::new(
        Some(cluster_name(&flag.name)?),
        flags,
        args.auth.auth_mode,
        (None, None),
        args.streaming.upstream_streaming,
    ))
}

/// An entry of `clusters:`: exactly what it says, the auth and streaming modes defaulting to
/// the proxy's.
fn from_entry(entry: &ClusterEntry, args: &ServeArgs) -> Result<ClusterSpec, StartError> {
    let name = cluster_name(&entry.name)?;
    let sources = [
        entry.upstream.is_some(),
        entry.kubeconfig.is_some(),
        entry.in_cluster,
    ];
    if sources.iter().filter(|s| **s).count() != 1 {
        return Err(StartError::Upstream(format!(
            "cluster {name}: give exactly one of upstream, kubeconfig and in-cluster"
        )));
    }
    let flags = UpstreamFlags {
        upstream: entry.upstream.clone(),
        kubeconfig: entry.kubeconfig.clone(),
        context: entry.context.clone(),
        in_cluster: entry.in_cluster,
        service_account_dir: entry
            .service_account_dir
            .clone()
            .unwrap_or_else(|| args.upstream.service_account_dir.clone()),
        upstream_ca_file: entry.upstream_ca_file.clone(),
        upstream_insecure_skip_tls_verify: entry.upstream_insecure_skip_tls_verify,
        upstream_token_file: entry.upstream_token_file.clone(),
        upstream_client_cert_file: entry.upstream_client_cert_file.clone(),
        upstream_client_key_file: entry.upstream_client_key_file.clone(),
    };
    if entry.max_sessions == Some(0) {
        return Err(StartError::Upstream(format!(
            "cluster {name}: max-sessions must be at least 1 (leave it out for no limit of its \
             own)"
        )));
    }
    let mut spec = ClusterSpec::new(
        Some(name),
        flags,
        entry.auth_mode.unwrap_or(args.auth.auth_mode),
        (
            entry.front_proxy_client_cert_file.clone(),
            entry.front_proxy_client_key_file.clone(),
        ),
        entry
            .upstream_streaming
            .unwrap_or(args.streaming.upstream_streaming),
    );
    spec.max_sessions = entry.max_sessions;
    Ok(spec)
}

/// One cluster: its upstream for proxied traffic and its caller authentication.
///
/// Proxied requests carry the proxy's own client certificate only in impersonate mode, and the
/// front-proxy certificate in front-proxy mode; in passthrough mode the proxy adds nothing.
/// TokenReviews always use the proxy's own credentials. Its sessions are stopped by `stop`.
pub(super) fn build(
    spec: &ClusterSpec,
    args: &ServeArgs,
    stop: CancellationToken,
) -> Result<Cluster, StartError> {
    let setup = ClusterSetup { spec, args };
    let named = |e: StartError| match &spec.name {
        None => e,
        Some(name) => match e {
            StartError::Auth(why) => StartError::Auth(format!("cluster {name}: {why}")),
            StartError::Upstream(why) => StartError::Upstream(format!("cluster {name}: {why}")),
            other => other,
        },
    };
    let source = source::resolve(&spec.flags).map_err(|e| match e {
        source::SourceError::Missing => StartError::NoUpstream,
        other => StartError::Upstream(other.to_string()),
    });
    let source = source.map_err(named)?;
    in_cluster_credentials(&setup, &source).map_err(named)?;
    let upstream = endpoint(
        &setup,
        &source,
        proxied_cert(&setup, &source).map_err(named)?,
    )
    .map_err(named)?;
    warn_plain_http(&setup, &upstream);
    let auth = authenticator(&setup, &source).map_err(named)?;
    let access_reviews = access_reviews(&setup, &source, &upstream).map_err(named)?;
    Ok(
        Cluster::new(spec.name.clone(), upstream, auth, spec.streaming)
            .with_access_reviews(access_reviews)
            .with_max_sessions(spec.max_sessions)
            .stopped_by(stop),
    )
}

/// The upstream reached with `client_cert` (if any) presented.
fn endpoint(
    setup: &ClusterSetup<'_>,
    source: &UpstreamSource,
    client_cert: Option<(Pem, Pem)>,
) -> Result<Upstream, StartError> {
    let tls = UpstreamTls {
        client_cert,
        ..source.tls.clone()
    };
    Upstream::from_url(&source.url, tls)
        .map(|u| {
            u.with_dial_timeout(setup.args.limits.upstream_dial_timeout)
                .with_tcp_keepalive(nonzero(setup.args.keepalive.tcp_keepalive))
        })
        .map_err(|e| StartError::Upstream(e.to_string()))
}

/// The client certificate proxied requests present: the proxy's own in impersonate mode, the
/// front-proxy one in front-proxy mode, none in passthrough.
fn proxied_cert(
    setup: &ClusterSetup<'_>,
    source: &UpstreamSource,
) -> Result<Option<(Pem, Pem)>, StartError> {
    match setup.spec.mode {
        AuthMode::Passthrough => {
            if source.has_credentials() {
                info!(cluster = label(setup), "auth mode passthrough: the proxy's own credentials are not sent with callers' requests");
            }
            Ok(None)
        }
        AuthMode::Impersonate => {
            if !source.has_credentials() {
                return Err(StartError::Auth(
                    "impersonate mode needs the proxy's own credentials: a token or client certificate \
                     from --kubeconfig, --in-cluster, --upstream-token-file or --upstream-client-cert-file"
                        .into(),
                ));
            }
            Ok(source.client_cert.clone())
        }
        AuthMode::FrontProxy => {
            let (Some(cert), Some(key)) = &setup.spec.front_proxy else {
                return Err(StartError::Auth(
                    "front-proxy mode needs --front-proxy-client-cert-file and --front-proxy-client-key-file".into(),
                ));
            };
            Ok(Some((Pem::File(cert.clone()), Pem::File(key.clone()))))
        }
    }
}

fn warn_plain_http(setup: &ClusterSetup<'_>, upstream: &Upstream) {
    if upstream.is_tls() {
        return;
    }
    if setup.spec.mode == AuthMode::Passthrough {
        warn!(
            cluster = label(setup),
            "the upstream is plain HTTP: callers' bearer tokens travel to it in the clear"
        );
    } else {
        warn!(
            cluster = label(setup),
            "the upstream is plain HTTP: identities asserted by kube-ws-proxy travel unprotected"
        );
    }
}

/// Who the cluster's callers are: none checked in passthrough; reviewed at this cluster with
/// the proxy's own credentials for it otherwise.
fn authenticator(
    setup: &ClusterSetup<'_>,
    source: &UpstreamSource,
) -> Result<Authenticator, StartError> {
    let args = setup.args;
    if setup.spec.mode == AuthMode::Passthrough {
        return Ok(Authenticator::passthrough());
    }
    let reviewer = if source.has_credentials() {
        Some(TokenReviewer::new(
            endpoint(setup, source, source.client_cert.clone())?,
            source.token.clone(),
            args.auth.authentication_cache_ttl,
            args.limits.handshake_timeout,
            ReviewLimits {
                per_second: args.auth.token_review_rate,
                burst: args.auth.token_review_burst,
                in_flight: args.auth.token_review_max_in_flight,
            },
        ))
    } else {
        warn!(cluster = label(setup), "no credentials of the proxy's own: bearer tokens cannot be reviewed, only client certificates authenticate callers");
        None
    };
    let front_proxy = FrontProxyHeaders {
        user: args.auth.front_proxy_username_header.clone(),
        group: args.auth.front_proxy_group_header.clone(),
        extra_prefix: args
            .auth
            .front_proxy_extra_header_prefix
            .as_str()
            .to_owned(),
    };
    Ok(Authenticator::new(
        setup.spec.mode,
        reviewer,
        source.token.clone(),
        front_proxy,
    ))
}

/// Who authorizes the cluster's sessions API calls: each caller itself in passthrough
/// (SelfSubjectAccessReviews with its credentials, on the upstream that carries none of the
/// proxy's); the proxy with its own credentials otherwise (SubjectAccessReviews on the
/// upstream as the TokenReviewer reaches it). Bounded per caller as TokenReviews are.
fn access_reviews(
    setup: &ClusterSetup<'_>,
    source: &UpstreamSource,
    upstream: &Upstream,
) -> Result<AccessReviews, StartError> {
    let args = setup.args;
    let timeout = args.limits.handshake_timeout;
    let limits = ReviewLimits {
        per_second: args.auth.token_review_rate,
        burst: args.auth.token_review_burst,
        in_flight: args.auth.token_review_max_in_flight,
    };
    if setup.spec.mode == AuthMode::Passthrough {
        return Ok(AccessReviews::self_subject(
            upstream.clone(),
            timeout,
            limits,
        ));
    }
    let own = endpoint(setup, source, source.client_cert.clone())?;
    Ok(AccessReviews::subject(
        own,
        source.token.clone(),
        timeout,
        limits,
    ))
}

fn label<'a>(setup: &'a ClusterSetup<'_>) -> &'a str {
    setup.spec.name.as_ref().map_or(
        crate::proxy::route::cluster::DEFAULT_CLUSTER,
        ClusterName::as_str,
    )
}

/// `--in-cluster` without a mounted service-account token leaves the proxy no credentials of
/// its own: enough for passthrough, which sends none (the manifests mount the token only where
/// a mode needs it). A pod of an identity mode without it lost its mount: it does not start.
fn in_cluster_credentials(
    setup: &ClusterSetup<'_>,
    source: &UpstreamSource,
) -> Result<(), StartError> {
    if setup.spec.mode == AuthMode::Passthrough
        || !setup.spec.flags.in_cluster
        || source.has_credentials()
    {
        return Ok(());
    }
    Err(StartError::Auth(format!(
        "impersonate and front-proxy modes with --in-cluster need the service-account token \
         (or --upstream-token-file, --upstream-client-cert-file): {} is not there",
        setup.spec.flags.service_account_dir.join("token").display()
    )))
}
