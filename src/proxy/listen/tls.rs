//! TLS on the main listener (rustls, ring provider chosen explicitly). The certificate is
//! chosen by the server name the client asks for (SNI): a cluster's own certificate
//! (`--tls-sni-cert NAME=CERT,KEY`) for `NAME.SUFFIX`, the serving certificate for every other
//! name and for none (a wildcard `*.SUFFIX` certificate there covers every cluster). Each is
//! re-read when its files change, so a rotated certificate is used without a restart, but
//! only once the key belongs to the certificate: a certificate copied in before its key (or
//! without it) leaves the previous pair served, logged and counted, rather than a pair every
//! handshake would fail with. ALPN offers `h2` and `http/1.1` (plain API calls may use HTTP/2;
//! upgrades are HTTP/1.1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::proxy::observability::metrics::Metrics;
use crate::proxy::upstream::endpoint::{Pem, UpstreamError};
use crate::proxy::upstream::pem::key_pair;
use crate::request::host::HostName;

/// How often the certificate files are checked for changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// Why the listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenerTlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no certificate in {0}")]
    NoCertificate(PathBuf),
    #[error("invalid PEM in {path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA file: {0}")]
    ClientCa(String),
    /// The certificate and key cannot be read, or do not belong together.
    #[error("serving certificate: {0}")]
    Pair(#[from] UpstreamError),
}

/// Where the listener's certificates, keys and (optional) client CA come from.
#[derive(Debug, Clone)]
pub struct ListenerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates signed by these CAs are accepted (and verified); without a client
    /// certificate a connection is still accepted (the upstream decides who it is).
    pub client_ca: Option<PathBuf>,
    /// Certificates served instead of the serving one to clients asking for their host name.
    pub by_name: Vec<NamedCertFiles>,
}

/// A certificate served to clients whose TLS server name (SNI) is `host`.
#[derive(Debug, Clone)]
pub struct NamedCertFiles {
    pub host: HostName,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One certificate and key, and the pair served now; swapped in place when the files change.
#[derive(Debug)]
struct ReloadingPair {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingPair {
    fn load(cert: &Path, key: &Path) -> Result<ReloadingPair, ListenerTlsError> {
        Ok(ReloadingPair {
            current: RwLock::new(load_key_pair(cert, key)?),
            cert: cert.to_owned(),
            key: key.to_owned(),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        // A short read lock, never held across an await.
        self.current.read().expect("certificate lock").clone()
    }
}

/// Serves the certificate of the name the client asks for, else the serving certificate.
#[derive(Debug)]
struct CertsByName {
    serving: ReloadingPair,
    /// Fixed at start (the configured names only): a client's name is looked up, never kept.
    by_name: BTreeMap<HostName, ReloadingPair>,
}

impl CertsByName {
    fn pairs(&self) -> impl Iterator<Item = &ReloadingPair> {
        std::iter::once(&self.serving).chain(self.by_name.values())
    }
}

impl ResolvesServerCert for CertsByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let named = hello
            .server_name()
            .filter(|_| !self.by_name.is_empty())
            .and_then(|name| HostName::parse(name.as_bytes()).ok())
            .and_then(|name| self.by_name.get(&name));
        Some(named.unwrap_or(&self.serving).current())
    }
}

/// A certificate and its key, checked to belong together (as the proxy's own client
/// certificates are).
fn load_key_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, ListenerTlsError> {
    Ok(key_pair(
        &Pem::File(cert.to_owned()),
        &Pem::File(key.to_owned()),
    )?)
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ListenerTlsError> {
    let pem = std::fs::read(path).map_err(|source| ListenerTlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ListenerTlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ListenerTlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

fn modified(pair: &ReloadingPair) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&pair.cert)?, m(&pair.key)?))
}

/// Builds the acceptor and starts watching the certificate files (reloads are counted in
/// `metrics`).
pub fn acceptor(
    files: ListenerTlsFiles,
    metrics: Metrics,
) -> Result<TlsAcceptor, ListenerTlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut by_name = BTreeMap::new();
    for named in &files.by_name {
        by_name.insert(
            named.host.clone(),
            ReloadingPair::load(&named.cert, &named.key)?,
        );
    }
    let resolver = Arc::new(CertsByName {
        serving: ReloadingPair::load(&files.cert, &files.key)?,
        by_name,
    });
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)?;
    let builder = match &files.client_ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(path)? {
                roots
                    .add(cert)
                    .map_err(|e| ListenerTlsError::ClientCa(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| ListenerTlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio::spawn(watch(resolver, metrics));
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Re-reads each certificate and key whenever either file changes. A pair that cannot be used
/// (unreadable, half written, or a key that is not the certificate's: a certificate copied in
/// before its key, or without it) keeps the previous pair served, said once per change of the
/// files in a warning and a metric, and is tried again when the files change next.
async fn watch(resolver: Arc<CertsByName>, metrics: Metrics) {
    // The files as last looked at, whether they were taken or not.
    let mut seen: Vec<_> = resolver.pairs().map(modified).collect();
    loop {
        tokio::time::sleep(RELOAD_CHECK).await;
        for (pair, seen) in resolver.pairs().zip(seen.iter_mut()) {
            let now = modified(pair);
            if now != *seen {
                *seen = now;
                reload(pair, &metrics);
            }
        }
    }
}

/// Reads `pair`'s files again, serving them if they can be used.
fn reload(pair: &ReloadingPair, metrics: &Metrics) {
    match load_key_pair(&pair.cert, &pair.key) {
        Ok(loaded) => {
            *pair.current.write().expect("certificate lock") = loaded;
            metrics.serving_certificate_reload(true);
            info!(cert = %pair.cert.display(), "serving certificate reloaded");
        }
        Err(e) => {
            metrics.serving_certificate_reload(false);
            warn!(
                error = %e,
                cert = %pair.cert.display(),
                key = %pair.key.display(),
                "serving certificate not reloaded: the previous certificate is still served"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (first_cert, first_key) = pair(dir.path(), "first");
        let (second_cert, _) = pair(dir.path(), "second");
        assert!(load_key_pair(&first_cert, &first_key).is_ok());
        let e = load_key_pair(&second_cert, &first_key).unwrap_err();
        assert!(matches!(e, ListenerTlsError::Pair(_)), "{e}");
        assert!(e.to_string().contains("second.crt"), "{e}");
    }
}
