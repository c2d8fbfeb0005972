//! The upstream from a kubeconfig (`--kubeconfig PATH [--context NAME]`): server, CA, TLS
//! server name, and the user's client certificate, key and token. Relative file paths are
//! relative to the kubeconfig, as in kubectl. Credential plugins (`exec`, `auth-provider`) and
//! basic auth are not supported: they are refused with a clear error rather than ignored.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use super::endpoint::Pem;

/// Why a kubeconfig cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kubeconfig {path} is not valid YAML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("kubeconfig has no current-context and no --context was given")]
    NoContext,
    #[error("kubeconfig has no context named {0:?}")]
    UnknownContext(String),
    #[error("kubeconfig has no cluster named {0:?}")]
    UnknownCluster(String),
    #[error("kubeconfig has no user named {0:?}")]
    UnknownUser(String),
    #[error("kubeconfig cluster {0:?} has no server")]
    NoServer(String),
    #[error("kubeconfig field {field} is not valid base64")]
    Base64 { field: &'static str },
    #[error("kubeconfig user {user:?} uses {what}, which kube-ws-proxy does not support; use a token, a token file or a client certificate")]
    Unsupported { user: String, what: &'static str },
    #[error("kubeconfig user {0:?} has a client certificate without a key (or a key without a certificate)")]
    IncompleteClientCert(String),
}

/// What the proxy takes from a kubeconfig context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeconfigUpstream {
    /// The API server URL.
    pub server: String,
    /// The CA bundle that signs the server certificate.
    pub ca: Option<Pem>,
    /// Skip server certificate verification (the kubeconfig asks for it).
    pub insecure_skip_tls_verify: bool,
    /// Name to verify instead of the server's host.
    pub tls_server_name: Option<String>,
    /// Client certificate chain and key.
    pub client_cert: Option<(Pem, Pem)>,
    /// Bearer token given inline.
    pub token: Option<String>,
    /// Bearer token file (re-read when it changes).
    pub token_file: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Kubeconfig {
    #[serde(rename = "current-context")]
    current_context: Option<String>,
    contexts: Vec<Named<Context>>,
    clusters: Vec<Named<Cluster>>,
    users: Vec<Named<User>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: Option<T>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Context {
    cluster: String,
    user: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: Option<String>,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: bool,
    tls_server_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<serde::de::IgnoredAny>,
    auth_provider: Option<serde::de::IgnoredAny>,
}

/// Reads `path` and resolves `context` (or the current context).
pub fn load(path: &Path, context: Option<&str>) -> Result<KubeconfigUpstream, KubeconfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| KubeconfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    parse(&text, base, context).map_err(|e| match e {
        KubeconfigError::Parse { message, .. } => KubeconfigError::Parse {
            path: path.to_owned(),
            message,
        },
        other => other,
    })
}

/// Resolves `context` in kubeconfig text; relative paths are taken from `base`.
pub fn parse(
    text: &str,
    base: &Path,
    context: Option<&str>,
) -> Result<KubeconfigUpstream, KubeconfigError> {
    let config: Kubeconfig = if text.trim().is_empty() {
        Kubeconfig::default()
    } else {
        serde_saphyr::from_str(text).map_err(|e| KubeconfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?
    };
    let name = context
        .map(str::to_owned)
        .or(config.current_context.clone().filter(|c| !c.is_empty()))
        .ok_or(KubeconfigError::NoContext)?;
    let ctx = find(&config.contexts, &name).ok_or(KubeconfigError::UnknownContext(name))?;
    let cluster = find(&config.clusters, &ctx.cluster)
        .ok_or_else(|| KubeconfigError::UnknownCluster(ctx.cluster.clone()))?;
    let server = cluster
        .server
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| KubeconfigError::NoServer(ctx.cluster.clone()))?;
    let resolve = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            base.join(p)
        }
    };
    let ca = pem(
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
        "certificate-authority-data",
        resolve,
    )?;
    let mut out = KubeconfigUpstream {
        server,
        ca,
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
        tls_server_name: cluster.tls_server_name.clone(),
        client_cert: None,
        token: None,
        token_file: None,
    };
    let Some(user_name) = ctx.user.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(out);
    };
    let user = find(&config.users, user_name)
        .ok_or_else(|| KubeconfigError::UnknownUser(user_name.to_owned()))?;
    let unsupported = |what| KubeconfigError::Unsupported {
        user: user_name.to_owned(),
        what,
    };
    if user.exec.is_some() {
        return Err(unsupported("an exec credential plugin"));
    }
    if user.auth_provider.is_some() {
        return Err(unsupported("an auth-provider"));
    }
    if user.username.is_some() || user.password.is_some() {
        return Err(unsupported("basic authentication"));
    }
    let cert = pem(
        &user.client_certificate_data,
        &user.client_certificate,
        "client-certificate-data",
        resolve,
    )?;
    let key = pem(
        &user.client_key_data,
        &user.client_key,
        "client-key-data",
        resolve,
    )?;
    out.client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(KubeconfigError::IncompleteClientCert(user_name.to_owned())),
    };
    out.token = user.token.clone().filter(|t| !t.is_empty());
    out.token_file = user.token_file.as_ref().map(resolve);
    Ok(out)
}

fn find<'a, T>(list: &'a [Named<T>], name: &str) -> Option<&'a T> {
    list.iter()
        .find(|n| n.name == name)
        .and_then(|n| n.value.as_ref())
}

/// Inline data wins over a file, as in client-go.
fn pem(
    data: &Option<String>,
    file: &Option<PathBuf>,
    field: &'static str,
    resolve: impl Fn(&PathBuf) -> PathBuf,
) -> Result<Option<Pem>, KubeconfigError> {
    if let Some(data) = data.as_deref().filter(|d| !d.is_empty()) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| KubeconfigError::Base64 { field })?;
        return Ok(Some(Pem::Data(bytes)));
    }
    Ok(file.as_ref().map(|f| Pem::File(resolve(f))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: ca.crt
    tls-server-name: kubernetes.default
- name: old
  cluster:
    server: https://old.example:443
    certificate-authority-data: LS0tLS1CRUdJTg==
    insecure-skip-tls-verify: false
contexts:
- name: prod
  context:
    cluster: prod-cluster
    user: proxy
    namespace: default
- name: legacy
  context:
    cluster: old
    user: cert-user
users:
- name: proxy
  user:
    tokenFile: /var/run/token
- name: cert-user
  user:
    client-certificate: /etc/pki/c.crt
    client-key-data: a2V5
    token: abc
- name: plugin
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
"#;

    #[test]
    fn current_context_with_relative_ca_and_token_file() {
        let u = parse(CONFIG, Path::new("/home/me/.kube"), None).unwrap();
        assert_eq!(u.server, "https://10.0.0.1:6443");
        assert_eq!(u.ca, Some(Pem::File("/home/me/.kube/ca.crt".into())));
        assert_eq!(u.tls_server_name.as_deref(), Some("kubernetes.default"));
        assert_eq!(u.token_file, Some(PathBuf::from("/var/run/token")));
        assert_eq!(u.token, None);
        assert_eq!(u.client_cert, None);
    }

    #[test]
    fn named_context_with_inline_data() {
        let u = parse(CONFIG, Path::new("/x"), Some("legacy")).unwrap();
        assert_eq!(u.server, "https://old.example:443");
        assert_eq!(u.ca, Some(Pem::Data(b"-----BEGIN".to_vec())));
        assert_eq!(
            u.client_cert,
            Some((
                Pem::File("/etc/pki/c.crt".into()),
                Pem::Data(b"key".to_vec())
            ))
        );
        assert_eq!(u.token.as_deref(), Some("abc"));
    }

    #[test]
    fn errors_are_specific() {
        let base = Path::new("/");
        assert!(matches!(
            parse(CONFIG, base, Some("nope")),
            Err(KubeconfigError::UnknownContext(_))
        ));
        let plugin = CONFIG.replace("user: cert-user", "user: plugin");
        assert!(matches!(
            parse(&plugin, base, Some("legacy")),
            Err(KubeconfigError::Unsupported { .. })
        ));
        assert!(matches!(
            parse("clusters: []", base, None),
            Err(KubeconfigError::NoContext)
        ));
        assert!(matches!(
            parse("clusters: [", base, None),
            Err(KubeconfigError::Parse { .. })
        ));
        let bad = CONFIG.replace("LS0tLS1CRUdJTg==", "not*base64");
        assert!(matches!(
            parse(&bad, base, Some("legacy")),
            Err(KubeconfigError::Base64 { .. })
        ));
    }
}
