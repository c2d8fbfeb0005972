//! The client certificate of one TLS connection: its subject, and which of the cluster's two
//! CAs (client CA, front-proxy CA) vouches for it.
//!
//! One listener accepts certificates of either CA (the handshake verifier trusts both), so
//! after the handshake the chain is verified again against each CA on its own: only a
//! front-proxy CA signature may make `X-Remote-*` headers count.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Subject fields kube-apiserver's authenticators read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CertSubject {
    /// The CN as Go's `pkix.Name` reads it: the last one when a subject has several (x509 user
    /// name, front-proxy allowed-name check).
    pub common_name: Option<String>,
    /// Every O, in order (x509 groups).
    pub organizations: Vec<String>,
}

impl CertSubject {
    /// Parses the subject of a DER certificate; `None` if it is not a certificate.
    pub(crate) fn parse(der: &[u8]) -> Option<CertSubject> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let subject = cert.subject();
        let common_name = subject
            .iter_common_name()
            .last()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let organizations = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_owned)
            .collect();
        Some(CertSubject {
            common_name,
            organizations,
        })
    }
}

/// A verified client certificate, classified by CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PeerCert {
    pub subject: CertSubject,
    /// The chain verifies against the client CA (x509 authentication).
    pub by_client_ca: bool,
    /// The chain verifies against the front-proxy (request-header) CA.
    pub by_front_proxy_ca: bool,
}

/// One verifier per CA, for classifying chains after the handshake.
#[derive(Clone, Default)]
pub(crate) struct CaVerifiers {
    pub client: Option<Arc<dyn ClientCertVerifier>>,
    pub front_proxy: Option<Arc<dyn ClientCertVerifier>>,
}

impl std::fmt::Debug for CaVerifiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaVerifiers")
            .field("client", &self.client.is_some())
            .field("front_proxy", &self.front_proxy.is_some())
            .finish()
    }
}

impl CaVerifiers {
    /// Classifies the chain a client presented (leaf first); `None` without a certificate.
    pub(crate) fn classify(&self, chain: &[CertificateDer<'_>]) -> Option<PeerCert> {
        let (leaf, intermediates) = chain.split_first()?;
        let now = UnixTime::now();
        let verifies = |v: &Option<Arc<dyn ClientCertVerifier>>| {
            v.as_ref()
                .is_some_and(|v| v.verify_client_cert(leaf, intermediates, now).is_ok())
        };
        Some(PeerCert {
            subject: CertSubject::parse(leaf.as_ref()).unwrap_or_default(),
            by_client_ca: verifies(&self.client),
            by_front_proxy_ca: verifies(&self.front_proxy),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair};

    #[test]
    fn the_last_common_name_counts_as_in_go() {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "admin");
        // rcgen keeps one attribute per type: the second CN goes in under its raw OID.
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 3]), "jdoe");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "dev");
        let der = params
            .self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .to_vec();
        let subject = CertSubject::parse(&der).unwrap();
        assert_eq!(subject.common_name.as_deref(), Some("jdoe"));
        assert_eq!(subject.organizations, ["dev"]);
    }
}
