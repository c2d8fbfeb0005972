//! PEM material for the upstream's TLS (CA bundles, client certificates and keys): a file or
//! inline bytes, read when needed.

use std::path::PathBuf;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

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
