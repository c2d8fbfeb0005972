//! TLS on the main listener (rustls, ring provider chosen explicitly). The serving certificate
//! is re-read when its files change, so a rotated certificate is used without a restart; ALPN
//! offers `h2` and `http/1.1` (plain API calls may use HTTP/2; upgrades are HTTP/1.1).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

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
}

/// Where the listener's certificate, key and (optional) client CA come from.
#[derive(Debug, Clone)]
pub struct ListenerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates signed by these CAs are accepted (and verified); without a client
    /// certificate a connection is still accepted (the upstream decides who it is).
    pub client_ca: Option<PathBuf>,
}

/// Serves the current certificate; swapped in place when the files change.
#[derive(Debug)]
struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A short read lock, never held across an await.
        Some(self.current.read().expect("certificate lock").clone())
    }
}

fn load_key_pair(files: &ListenerTlsFiles) -> Result<Arc<CertifiedKey>, ListenerTlsError> {
    let certs = read_certs(&files.cert)?;
    let key_pem = std::fs::read(&files.key).map_err(|source| ListenerTlsError::Read {
        path: files.key.clone(),
        source,
    })?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| ListenerTlsError::Pem {
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider.key_provider.load_private_key(key)?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
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

fn modified(files: &ListenerTlsFiles) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&files.cert)?, m(&files.key)?))
}

/// Builds the acceptor and starts watching the certificate files.
pub fn acceptor(files: ListenerTlsFiles) -> Result<TlsAcceptor, ListenerTlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Arc::new(ReloadingCert {
        current: RwLock::new(load_key_pair(&files)?),
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
    tokio::spawn(watch(files, resolver));
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Re-reads the certificate and key whenever either file changes; a broken pair (e.g. the
/// certificate written before its key) keeps the old one until the next change.
async fn watch(files: ListenerTlsFiles, resolver: Arc<ReloadingCert>) {
    let mut seen = modified(&files);
    loop {
        tokio::time::sleep(RELOAD_CHECK).await;
        let now = modified(&files);
        if now == seen {
            continue;
        }
        match load_key_pair(&files) {
            Ok(pair) => {
                *resolver.current.write().expect("certificate lock") = pair;
                seen = now;
                info!(cert = %files.cert.display(), "serving certificate reloaded");
            }
            Err(e) => warn!(error = %e, "serving certificate not reloaded"),
        }
    }
}
