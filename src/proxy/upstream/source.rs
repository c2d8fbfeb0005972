//! Where the upstream is and what credentials the proxy itself holds for it, from exactly one of
//! `--upstream`, `--kubeconfig` or `--in-cluster`, with explicit `--upstream-*` flags winning
//! over what a kubeconfig or the pod environment says.

use std::io::ErrorKind::NotFound;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::info;

use super::endpoint::{Pem, UpstreamTls};
use super::kubeconfig::{self, KubeconfigError};
use super::token_source::TokenSource;

/// Why the upstream cannot be determined.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("one of --upstream, --kubeconfig or --in-cluster is required")]
    Missing,
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    #[error("--in-cluster: {0} is not set (is the proxy running in a pod?)")]
    NoServiceEnv(&'static str),
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The upstream and the proxy's own credentials.
#[derive(Debug)]
pub struct UpstreamSource {
    /// The API server URL.
    pub url: String,
    /// How to verify the server (CA, server name, or not at all); no client certificate.
    pub tls: UpstreamTls,
    /// The proxy's own bearer token.
    pub token: Option<Arc<TokenSource>>,
    /// The proxy's own client certificate and key.
    pub client_cert: Option<(Pem, Pem)>,
}

impl UpstreamSource {
    /// Whether the proxy holds credentials of its own.
    pub fn has_credentials(&self) -> bool {
        self.token.is_some() || self.client_cert.is_some()
    }
}

/// Environment variables the kubelet sets in every pod for the API server service.
const SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";
const SERVICE_PORT: &str = "KUBERNETES_SERVICE_PORT";

/// The flags that say where the upstream is and how to reach it (filled from the command
/// line by the binary; the proxy does not read its command line itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamFlags {
    /// `--upstream`.
    pub upstream: Option<String>,
    /// `--kubeconfig` and `--context`.
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// `--in-cluster` and `--service-account-dir`.
    pub in_cluster: bool,
    pub service_account_dir: PathBuf,
    /// Overrides: `--upstream-ca-file`, `--upstream-insecure-skip-tls-verify`,
    /// `--upstream-token-file`, `--upstream-client-cert-file`/`-key-file`.
    pub upstream_ca_file: Option<PathBuf>,
    pub upstream_insecure_skip_tls_verify: bool,
    pub upstream_token_file: Option<PathBuf>,
    pub upstream_client_cert_file: Option<PathBuf>,
    pub upstream_client_key_file: Option<PathBuf>,
}

/// Resolves the upstream from the flags.
pub fn resolve(args: &UpstreamFlags) -> Result<UpstreamSource, SourceError> {
    let mut source = if let Some(url) = &args.upstream {
        UpstreamSource {
            url: url.clone(),
            tls: UpstreamTls::default(),
            token: None,
            client_cert: None,
        }
    } else if let Some(path) = &args.kubeconfig {
        let k = kubeconfig::load(path, args.context.as_deref())?;
        let token = match (&k.token_file, k.token) {
            (Some(file), _) => Some(token_file(file.clone())?),
            (None, Some(t)) => Some(Arc::new(TokenSource::Fixed(t))),
            (None, None) => None,
        };
        UpstreamSource {
            url: k.server,
            tls: UpstreamTls {
                ca: k.ca,
                insecure_skip_verify: k.insecure_skip_tls_verify,
                client_cert: None,
                server_name: k.tls_server_name,
            },
            token,
            client_cert: k.client_cert,
        }
    } else if args.in_cluster {
        in_cluster(args, |name| std::env::var(name).ok())?
    } else {
        return Err(SourceError::Missing);
    };
    if let Some(ca) = &args.upstream_ca_file {
        source.tls.ca = Some(Pem::File(ca.clone()));
    }
    source.tls.insecure_skip_verify |= args.upstream_insecure_skip_tls_verify;
    if let Some(file) = &args.upstream_token_file {
        source.token = Some(token_file(file.clone())?);
    }
    if let (Some(cert), Some(key)) = (
        &args.upstream_client_cert_file,
        &args.upstream_client_key_file,
    ) {
        source.client_cert = Some((Pem::File(cert.clone()), Pem::File(key.clone())));
    }
    Ok(source)
}

fn token_file(path: PathBuf) -> Result<Arc<TokenSource>, SourceError> {
    TokenSource::file(path.clone())
        .map(Arc::new)
        .map_err(|source| SourceError::TokenFile { path, source })
}

/// The pod's view of its cluster: the service address from the environment, the CA and the
/// (rotating) token from the service-account directory. Without a token file there (a pod that
/// mounts only the cluster's CA, as passthrough needs no credentials of the proxy's own) the
/// proxy has none; the identity modes then refuse to start for want of them.
fn in_cluster(
    args: &UpstreamFlags,
    env: impl Fn(&str) -> Option<String>,
) -> Result<UpstreamSource, SourceError> {
    let host = env(SERVICE_HOST)
        .filter(|h| !h.is_empty())
        .ok_or(SourceError::NoServiceEnv(SERVICE_HOST))?;
    let port = env(SERVICE_PORT)
        .filter(|p| !p.is_empty())
        .ok_or(SourceError::NoServiceEnv(SERVICE_PORT))?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let dir = &args.service_account_dir;
    Ok(UpstreamSource {
        url: format!("https://{host}:{port}"),
        tls: UpstreamTls {
            ca: Some(Pem::File(dir.join("ca.crt"))),
            ..UpstreamTls::default()
        },
        token: service_account_token(dir.join("token"))?,
        client_cert: None,
    })
}

/// The service-account token file, or `None` where there is none (not mounted).
fn service_account_token(path: PathBuf) -> Result<Option<Arc<TokenSource>>, SourceError> {
    match token_file(path) {
        Ok(token) => Ok(Some(token)),
        Err(SourceError::TokenFile { path, source }) if source.kind() == NotFound => {
            info!(path = %path.display(), "--in-cluster: no service-account token mounted: the proxy has no credentials of its own");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    /// The upstream flags as the binary fills them from `flags`.
    fn args(flags: &[&str]) -> UpstreamFlags {
        let mut argv = vec!["kube-ws-proxy"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().serve.upstream_flags()
    }

    #[test]
    fn in_cluster_reads_the_environment_and_service_account() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "sa-token\n").unwrap();
        let a = args(&[
            "--in-cluster",
            "--service-account-dir",
            dir.path().to_str().unwrap(),
        ]);
        let env = |name: &str| match name {
            SERVICE_HOST => Some("fd00::1".to_owned()),
            SERVICE_PORT => Some("443".to_owned()),
            _ => None,
        };
        let s = in_cluster(&a, env).unwrap();
        assert_eq!(s.url, "https://[fd00::1]:443");
        assert_eq!(s.tls.ca, Some(Pem::File(dir.path().join("ca.crt"))));
        assert_eq!(s.token.unwrap().current().as_deref(), Some("sa-token"));
        assert!(matches!(
            in_cluster(&a, |_| None),
            Err(SourceError::NoServiceEnv(SERVICE_HOST))
        ));
        // Only the CA mounted (passthrough): no credentials of the proxy's own.
        std::fs::remove_file(dir.path().join("token")).unwrap();
        let s = in_cluster(&a, env).unwrap();
        assert!(s.token.is_none() && s.client_cert.is_none());
        assert_eq!(s.tls.ca, Some(Pem::File(dir.path().join("ca.crt"))));
    }

    #[test]
    fn flags_override_the_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("config");
        std::fs::write(
            &kc,
            "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n\
             clusters: [{name: k, cluster: {server: 'https://10.1.1.1:6443', certificate-authority: ca.pem}}]\n\
             users: [{name: u, user: {token: from-kubeconfig}}]\n",
        )
        .unwrap();
        let s = resolve(&args(&["--kubeconfig", kc.to_str().unwrap()])).unwrap();
        assert_eq!(s.url, "https://10.1.1.1:6443");
        assert_eq!(s.tls.ca, Some(Pem::File(dir.path().join("ca.pem"))));
        assert_eq!(
            s.token.unwrap().current().as_deref(),
            Some("from-kubeconfig")
        );
        let tf = dir.path().join("t");
        std::fs::write(&tf, "from-flag").unwrap();
        let s = resolve(&args(&[
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--upstream-ca-file",
            "/etc/other.pem",
            "--upstream-token-file",
            tf.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(s.tls.ca, Some(Pem::File("/etc/other.pem".into())));
        assert_eq!(s.token.unwrap().current().as_deref(), Some("from-flag"));
    }

    #[test]
    fn exactly_one_source() {
        assert!(matches!(resolve(&args(&[])), Err(SourceError::Missing)));
        let argv = ["kube-ws-proxy", "--upstream", "http://a", "--in-cluster"];
        assert!(Cli::try_parse_from(argv).is_err());
        let argv = ["kube-ws-proxy", "--context", "x"];
        assert!(Cli::try_parse_from(argv).is_err());
    }
}
