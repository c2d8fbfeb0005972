//! HTTPS for the simulated cluster (rustls, ring provider chosen explicitly): the serving
//! certificate, optional client certificates of the client CA and of the front-proxy CA
//! (verified when presented, never required), ALPN `h2` and `http/1.1`.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio_rustls::TlsAcceptor;

use super::peer_cert::CaVerifiers;

/// TLS material of the simulated cluster, as PEM text.
#[derive(Debug, Clone)]
pub struct SimTls {
    /// Serving certificate chain, leaf first.
    pub cert_chain_pem: String,
    /// Private key of the serving certificate (PKCS#8, PKCS#1 or SEC1).
    pub private_key_pem: String,
    /// CA bundle for x509 client authentication (user = CN, groups = O). Client certificates
    /// are optional, but one the handshake cannot verify fails it.
    pub client_ca_pem: Option<String>,
}

/// Why the TLS configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum SimTlsError {
    #[error("invalid PEM in the {what}: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("no certificate in the {0}")]
    NoCertificate(&'static str),
    #[error("the {what} is not a usable CA: {reason}")]
    Ca { what: &'static str, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The acceptor and, for telling the CAs apart afterwards, one verifier per CA.
#[derive(Clone)]
pub(crate) struct TlsServing {
    pub acceptor: TlsAcceptor,
    pub verifiers: CaVerifiers,
}

fn certs(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, SimTlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SimTlsError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(SimTlsError::NoCertificate(what));
    }
    Ok(certs)
}

fn roots(pems: &[(&str, &'static str)]) -> Result<RootCertStore, SimTlsError> {
    let mut roots = RootCertStore::empty();
    for (pem, what) in pems {
        for cert in certs(pem, what)? {
            roots.add(cert).map_err(|e| SimTlsError::Ca {
                what,
                reason: e.to_string(),
            })?;
        }
    }
    Ok(roots)
}

fn verifier(
    roots: RootCertStore,
    what: &'static str,
) -> Result<Arc<dyn ClientCertVerifier>, SimTlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| SimTlsError::Ca {
            what,
            reason: e.to_string(),
        })
}

/// Builds the server configuration. `front_proxy_ca_pem`: the request-header CA, trusted for
/// the handshake alongside the client CA.
pub(crate) fn serving(
    tls: &SimTls,
    front_proxy_ca_pem: Option<&str>,
) -> Result<TlsServing, SimTlsError> {
    const CLIENT_CA: &str = "client CA bundle";
    const FRONT_PROXY_CA: &str = "front-proxy (request-header) CA bundle";
    let chain = certs(&tls.cert_chain_pem, "serving certificate chain")?;
    let key = PrivateKeyDer::from_pem_slice(tls.private_key_pem.as_bytes()).map_err(|e| {
        SimTlsError::Pem {
            what: "serving private key",
            reason: e.to_string(),
        }
    })?;
    let mut trusted = Vec::new();
    let mut verifiers = CaVerifiers::default();
    if let Some(pem) = &tls.client_ca_pem {
        verifiers.client = Some(verifier(roots(&[(pem, CLIENT_CA)])?, CLIENT_CA)?);
        trusted.push((pem.as_str(), CLIENT_CA));
    }
    if let Some(pem) = front_proxy_ca_pem {
        verifiers.front_proxy = Some(verifier(roots(&[(pem, FRONT_PROXY_CA)])?, FRONT_PROXY_CA)?);
        trusted.push((pem, FRONT_PROXY_CA));
    }

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)?;
    let builder = if trusted.is_empty() {
        builder.with_no_client_auth()
    } else {
        builder.with_client_cert_verifier(verifier(roots(&trusted)?, "client CA bundles")?)
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsServing {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        verifiers,
    })
}
