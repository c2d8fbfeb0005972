//! PEM material for the upstream's TLS (CA bundles, client certificates and keys): a file or
//! inline bytes, read when needed.

use std::path::PathBuf;

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::error::UpstreamError;

/// PEM material: a file, or inline bytes (a kubeconfig's `*-data` fields).
#[derive(Clone, PartialEq, Eq)]
pub enum Pem {
    /// Read from this file when the connector is built (a client certificate and key also
    /// whenever they change).
    File(PathBuf),
    /// Given inline.
    Data(Vec<u8>),
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Inline data may be a private key: never printed.
        match self {
            Pem::File(p) => write!(f, "Pem::File({})", p.display()),
            Pem::Data(d) => write!(f, "Pem::Data({} bytes)", d.len()),
        }
    }
}

impl Pem {
    pub(crate) fn describe(&self) -> String {
        match self {
            Pem::File(p) => p.display().to_string(),
            Pem::Data(_) => "inline PEM data".to_owned(),
        }
    }

    pub(crate) fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>, UpstreamError> {
        match self {
            Pem::File(path) => std::fs::read(path)
                .map(std::borrow::Cow::Owned)
                .map_err(|source| UpstreamError::File {
                    path: path.clone(),
                    source,
                }),
            Pem::Data(d) => Ok(std::borrow::Cow::Borrowed(d)),
        }
    }
}

/// The certificates in `pem`; none at all is an error.
pub(crate) fn read_certs(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, UpstreamError> {
    let bytes = pem.bytes()?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
    let certs = certs.map_err(|e| UpstreamError::TlsConfig(format!("{}: {e}", pem.describe())))?;
    if certs.is_empty() {
        return Err(UpstreamError::TlsConfig(format!(
            "{}: no certificates found",
            pem.describe()
        )));
    }
    Ok(certs)
}

/// A certificate chain and its private key, checked to belong together (the key's public key is
/// the leaf certificate's): a key that does not is an error here, not a bad signature in every
/// handshake later. The proxy's client certificates and the listener's serving certificate are
/// read with it.
pub fn key_pair(cert: &Pem, key: &Pem) -> Result<Arc<CertifiedKey>, UpstreamError> {
    let chain = read_certs(cert)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key.bytes()?)
        .map_err(|e| UpstreamError::TlsConfig(format!("{}: {e}", key.describe())))?;
    let provider = rustls::crypto::ring::default_provider();
    // Also checks that the key belongs to the certificate.
    let pair = CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| {
        UpstreamError::TlsConfig(format!("{} and {}: {e}", cert.describe(), key.describe()))
    })?;
    Ok(Arc::new(pair))
}
