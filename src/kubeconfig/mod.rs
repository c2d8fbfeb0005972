//! `kube-ws-proxy kubeconfig`: a kubeconfig for kubectl users of the proxy, with a cluster,
//! user and context per cluster the proxy's flags and config file configure (read by
//! [`crate::app::configured_names`], as serving reads them, without reaching any cluster), at
//! `URL/clusters/NAME` (or, with `--cluster-host-suffix`, at its own host name
//! `NAME.SUFFIX`), and one named `default` for the unnamed upstream at `URL`.
//!
//! It holds only what kubectl needs to reach and trust the proxy: never a credential of the
//! proxy's for a cluster, nor a cluster's own CA. Users are empty, for
//! `kubectl config set-credentials`.

mod document;

use std::io::Write as _;
use std::path::{Path, PathBuf};

pub use self::document::{quoted, Document, Entry, Trust};
use crate::app::StartError;
use crate::cli::{KubeconfigArgs, ServeArgs};
use crate::proxy::route::cluster::DEFAULT_CLUSTER;
use crate::request::host::HostSuffix;

/// Why no kubeconfig was written.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("--server {0:?}: {1}")]
    Server(String, &'static str),
    #[error("{0} needs an https:// --server")]
    TlsOnPlainHttp(&'static str),
    #[error("cannot read --certificate-authority {path}: {source}")]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--certificate-authority {0}: no PEM certificate in it")]
    NotPem(PathBuf),
    #[error(transparent)]
    Clusters(#[from] StartError),
    #[error(
        "--tls-server-name would replace each cluster's own host name (--cluster-host-suffix) \
             as the name kubectl asks for and the proxy routes by: leave it out"
    )]
    ServerNameWithHostRouting,
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where kubectl reaches the proxy and how it trusts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Front {
    /// The URL, without a trailing `/`.
    base: String,
    trust: Trust,
}

impl Front {
    /// The proxy at `server`, trusted as kubectl does by default.
    pub fn at(server: &str) -> Result<Front, KubeconfigError> {
        let bad = |why| KubeconfigError::Server(server.to_owned(), why);
        let url = url::Url::parse(server).map_err(|_| bad("not a URL"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("the scheme is http or https"));
        }
        if url.host().is_none() {
            return Err(bad("no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("a query or fragment would be sent on every request"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("no credentials in the URL"));
        }
        Ok(Front {
            base: url.as_str().trim_end_matches('/').to_owned(),
            trust: Trust::default(),
        })
    }

    /// The proxy as `args` say kubectl reaches and trusts it.
    pub fn from_args(args: &KubeconfigArgs) -> Result<Front, KubeconfigError> {
        let mut front = Front::at(&args.server)?;
        let https = front.base.starts_with("https:");
        let tls_flags = [
            (
                "--certificate-authority",
                args.certificate_authority.is_some(),
            ),
            ("--insecure-skip-tls-verify", args.insecure_skip_tls_verify),
            ("--tls-server-name", args.tls_server_name.is_some()),
        ];
        if let Some((flag, _)) = tls_flags.iter().find(|(_, set)| *set && !https) {
            return Err(KubeconfigError::TlsOnPlainHttp(flag));
        }
        front.trust = Trust {
            certificate_authority: args
                .certificate_authority
                .as_deref()
                .map(read_ca)
                .transpose()?,
            insecure_skip_tls_verify: args.insecure_skip_tls_verify,
            tls_server_name: args.tls_server_name.clone(),
        };
        Ok(front)
    }

    /// The server URL of a cluster: its prefix under the proxy, or the proxy itself for the
    /// unnamed upstream; with host routing, the proxy's URL with the cluster's host name
    /// (`NAME.SUFFIX`; the scheme, port and any path of `--server` kept).
    fn server(&self, name: Option<&str>, host_suffix: Option<&HostSuffix>) -> String {
        match (name, host_suffix) {
            (Some(name), Some(suffix)) => {
                let mut url = url::Url::parse(&self.base).expect("checked by Front::at");
                url.set_host(Some(&format!("{name}.{}", suffix.as_str())))
                    .expect("a DNS label under a host name is a host name");
                url.as_str().trim_end_matches('/').to_owned()
            }
            (Some(name), None) => format!("{}/clusters/{name}", self.base),
            (None, _) => self.base.clone(),
        }
    }
}

/// The PEM CA file's bytes, checked to hold a certificate.
fn read_ca(path: &Path) -> Result<Vec<u8>, KubeconfigError> {
    let pem = std::fs::read(path).map_err(|source| KubeconfigError::ReadCa {
        path: path.to_owned(),
        source,
    })?;
    let marker = b"-----BEGIN CERTIFICATE-----";
    if !pem.windows(marker.len()).any(|w| w == marker) {
        return Err(KubeconfigError::NotPem(path.to_owned()));
    }
    Ok(pem)
}

/// The kubeconfig of the clusters `serve` configures, reached through `front`: the unnamed
/// upstream first (context `default`), then the named ones in the order given.
pub fn for_clusters(front: &Front, serve: &ServeArgs) -> Result<Document, KubeconfigError> {
    let host_suffix = crate::app::cluster_host_suffix(serve)?;
    if host_suffix.is_some() && front.trust.tls_server_name.is_some() {
        return Err(KubeconfigError::ServerNameWithHostRouting);
    }
    let entries = crate::app::configured_names(serve)?
        .iter()
        .map(|name| {
            let name = name.as_ref().map(|n| n.as_str());
            Entry {
                name: name.unwrap_or(DEFAULT_CLUSTER).to_owned(),
                server: front.server(name, host_suffix.as_ref()),
            }
        })
        .collect();
    Ok(Document {
        entries,
        trust: front.trust.clone(),
        token: None,
        namespace: None,
    })
}

/// Writes `text` to `path`, readable by its owner only (as kubectl writes kubeconfigs).
pub fn write(path: &Path, text: &str) -> Result<(), KubeconfigError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let error = |source| KubeconfigError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(error)?;
    file.write_all(text.as_bytes()).map_err(error)
}

/// Runs the subcommand: the kubeconfig to `--output`, or to stdout.
pub fn run(args: &KubeconfigArgs) -> Result<(), KubeconfigError> {
    let text = for_clusters(&Front::from_args(args)?, &args.serve)?.render();
    match &args.output {
        Some(path) => write(path, &text),
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|source| KubeconfigError::Write {
                path: "stdout".into(),
                source,
            }),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn args(argv: &[&str]) -> KubeconfigArgs {
        let argv = ["kube-ws-proxy", "kubeconfig"].iter().chain(argv);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            Some(crate::cli::Command::Kubeconfig(args)) => *args,
            _ => panic!("not kubeconfig"),
        }
    }

    fn entries(argv: &[&str]) -> Result<Vec<(String, String)>, KubeconfigError> {
        let a = args(argv);
        let doc = for_clusters(&Front::from_args(&a)?, &a.serve)?;
        Ok(doc
            .entries
            .into_iter()
            .map(|e| (e.name, e.server))
            .collect())
    }

    #[test]
    fn a_context_per_cluster_the_unnamed_upstream_first() {
        let got = entries(&[
            "--server=https://gw.example.com/k8s/",
            "--cluster=old=https://10.0.0.1:6443",
            "--cluster=new=https://10.0.0.2:6443",
            "--upstream=https://10.0.0.3:6443",
        ])
        .unwrap();
        let want = [
            ("default", "https://gw.example.com/k8s"),
            ("old", "https://gw.example.com/k8s/clusters/old"),
            ("new", "https://gw.example.com/k8s/clusters/new"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()));
        assert_eq!(got, want);
        // Only --upstream: one context, at the proxy itself.
        let one = entries(&["--server=http://127.0.0.1:8080", "--upstream=http://u"]).unwrap();
        assert_eq!(one, [("default".into(), "http://127.0.0.1:8080".into())]);
    }

    #[test]
    fn with_host_routing_each_cluster_is_at_its_own_host_name() {
        let got = entries(&[
            "--server=https://gw.example.com:8443/k8s",
            "--cluster-host-suffix=Kube.Example.com.",
            "--cluster=old=https://10.0.0.1:6443",
            "--cluster=new=https://10.0.0.2:6443",
            "--upstream=https://10.0.0.3:6443",
        ])
        .unwrap();
        let want = [
            ("default", "https://gw.example.com:8443/k8s"),
            ("old", "https://old.kube.example.com:8443/k8s"),
            ("new", "https://new.kube.example.com:8443/k8s"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()));
        assert_eq!(got, want);
        // The name kubectl asks for is the cluster's own: no other may replace it.
        let a = args(&[
            "--server=https://gw.example.com",
            "--cluster-host-suffix=kube.example.com",
            "--cluster=old=https://10.0.0.1:6443",
            "--tls-server-name=gw.example.com",
        ]);
        assert!(matches!(
            for_clusters(&Front::from_args(&a).unwrap(), &a.serve),
            Err(KubeconfigError::ServerNameWithHostRouting)
        ));
        let bad = entries(&[
            "--server=https://gw.example.com",
            "--cluster-host-suffix=kube_example.com",
            "--cluster=old=https://10.0.0.1:6443",
        ]);
        assert!(matches!(bad, Err(KubeconfigError::Clusters(_))), "{bad:?}");
    }

    #[test]
    fn the_clusters_are_checked_as_at_the_start_of_the_proxy() {
        let s = "--server=https://p.example";
        for bad in [
            vec![s],
            vec![s, "--cluster=Old=http://a"],
            vec![s, "--cluster=a=http://a", "--cluster=a=http://b"],
            vec![s, "--upstream=http://u", "--cluster=default=http://a"],
            vec![s, "--cluster=a=http://a", "--upstream-token-file=/t"],
        ] {
            assert!(
                matches!(entries(&bad), Err(KubeconfigError::Clusters(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_server_and_its_trust_are_checked() {
        let c = "--cluster=a=http://a";
        for bad in [
            vec!["--server=proxy.example.com", c],
            vec!["--server=ftp://p", c],
            vec!["--server=https://p/?x=1", c],
            vec!["--server=https://u:pw@p", c],
            vec!["--server=http://p", c, "--insecure-skip-tls-verify"],
            vec!["--server=http://p", c, "--tls-server-name=p"],
            vec![
                "--server=https://p",
                c,
                "--certificate-authority=/nonexistent",
            ],
        ] {
            assert!(entries(&bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.txt");
        std::fs::write(&not_pem, "hello").unwrap();
        let ca = format!("--certificate-authority={}", not_pem.display());
        assert!(matches!(
            entries(&["--server=https://p", c, &ca]),
            Err(KubeconfigError::NotPem(_))
        ));
        let a = args(&["--server=https://p", c, "--insecure-skip-tls-verify"]);
        assert!(Front::from_args(&a).unwrap().trust.insecure_skip_tls_verify);
    }

    #[test]
    fn the_config_file_names_the_clusters_as_for_serving() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        // Secrets the proxy holds for a cluster, and settings kubectl does not need.
        std::fs::write(
            &config,
            "listen: 0.0.0.0:8443\ncluster: [old=https://10.0.0.1:6443]\nclusters:\n\
             - name: prod-eu\n  upstream: https://10.0.0.2:6443\n  \
             upstream-token-file: /secret/token\n  upstream-ca-file: /secret/ca.crt\n",
        )
        .unwrap();
        let argv = [
            "kube-ws-proxy".to_owned(),
            "kubeconfig".to_owned(),
            "--server=https://proxy.example.com".to_owned(),
            format!("--config={}", config.display()),
        ];
        let cli = crate::config_file::parse_args(argv).unwrap();
        let Some(crate::cli::Command::Kubeconfig(a)) = cli.command else {
            panic!("not kubeconfig");
        };
        let text = for_clusters(&Front::from_args(&a).unwrap(), &a.serve)
            .unwrap()
            .render();
        assert!(
            text.contains("\"https://proxy.example.com/clusters/old\""),
            "{text}"
        );
        assert!(
            text.contains("\"https://proxy.example.com/clusters/prod-eu\""),
            "{text}"
        );
        for secret in ["/secret", "10.0.0", "certificate-authority"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        // The kubeconfig's own flags are not keys of the config file.
        std::fs::write(&config, "server: https://x\ncluster: [a=http://a]\n").unwrap();
        let argv = ["kube-ws-proxy", "kubeconfig", "--server=https://p"]
            .map(String::from)
            .to_vec()
            .into_iter()
            .chain([format!("--config={}", config.display())]);
        assert!(matches!(
            crate::config_file::parse_args(argv),
            Err(crate::config_file::ConfigError::UnknownKey { .. })
        ));
    }
}
