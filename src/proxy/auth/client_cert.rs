//! The caller's identity from a verified client certificate, as Kubernetes' x509 authenticator
//! reads it: the subject's Common Name is the user, each Organization is a group.
//!
//! A subject may carry several CNs. Go's parser (which kube-apiserver and CSR approvers use)
//! keeps the *last* one; other readers keep the first. Rather than pick a side, a certificate
//! with more than one CN is refused: whoever issued it meant two different people.

use std::collections::BTreeMap;
use std::sync::Arc;

use x509_parser::prelude::{FromDer, X509Certificate};

use super::identity::{Identity, IdentityError};

/// Why a certificate carries no usable identity.
#[derive(Debug, thiserror::Error)]
pub enum ClientCertError {
    #[error("the client certificate cannot be parsed")]
    Unparsable,
    #[error("the client certificate has no subject common name")]
    NoCommonName,
    #[error(
        "the client certificate's subject has {0} common names; the user it names is ambiguous"
    )]
    MultipleCommonNames(usize),
    #[error("the client certificate's subject is not usable: {0}")]
    Identity(#[from] IdentityError),
}

/// What a connection's verified client certificate says about its caller.
#[derive(Debug, Default)]
pub enum PeerCertificate {
    /// No certificate, or one that identifies nobody (no CN): other credentials may still
    /// authenticate the caller, as with kube-apiserver.
    #[default]
    None,
    /// The certificate names this caller.
    Identified(Arc<Identity>),
    /// The certificate is refused outright: every request on the connection gets 401.
    Refused(ClientCertError),
}

impl PeerCertificate {
    /// Reads the leaf certificate (DER) of a connection.
    pub fn from_leaf(der: &[u8]) -> PeerCertificate {
        match identity_from_certificate(der) {
            Ok(id) => PeerCertificate::Identified(Arc::new(id)),
            Err(e @ ClientCertError::MultipleCommonNames(_)) => PeerCertificate::Refused(e),
            Err(e) => {
                tracing::debug!(error = %e, "client certificate identifies nobody");
                PeerCertificate::None
            }
        }
    }
}

/// Reads the identity from the leaf certificate (DER). The TLS layer has already verified it
/// against `--client-ca-file`; this only reads the subject.
pub fn identity_from_certificate(der: &[u8]) -> Result<Identity, ClientCertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| ClientCertError::Unparsable)?;
    let subject = cert.subject();
    let names = subject.iter_common_name().count();
    if names > 1 {
        return Err(ClientCertError::MultipleCommonNames(names));
    }
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(ClientCertError::NoCommonName)?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    Ok(Identity::new(user, groups, BTreeMap::new())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    /// The OID of `commonName`: rcgen keeps one attribute per type, so a second CN goes in
    /// under its raw OID.
    const CN_OID: [u64; 4] = [2, 5, 4, 3];

    fn cert(cn: Option<&str>, orgs: &[&str]) -> Vec<u8> {
        cert_with_names(cn.as_slice(), orgs)
    }

    fn cert_with_names(cns: &[&str], orgs: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::new(vec![]).unwrap();
        let mut dn = DistinguishedName::new();
        for (i, cn) in cns.iter().enumerate() {
            let ty = if i == 0 {
                DnType::CommonName
            } else {
                DnType::CustomDnType(CN_OID.to_vec())
            };
            dn.push(ty, *cn);
        }
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        params.distinguished_name = dn;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn common_name_is_user_and_organizations_are_groups() {
        // rcgen keeps one value per attribute type, so one organization here.
        let id = identity_from_certificate(&cert(Some("alice"), &["dev"])).unwrap();
        assert_eq!(id.user(), "alice");
        assert_eq!(id.groups(), ["dev"]);
    }

    #[test]
    fn several_common_names_are_refused() {
        // Go reads this subject as "jdoe" (the last CN); a first-CN reader as "admin".
        let der = cert_with_names(&["admin", "jdoe"], &[]);
        let (_, parsed) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(parsed.subject().iter_common_name().count(), 2);
        assert!(matches!(
            identity_from_certificate(&der),
            Err(ClientCertError::MultipleCommonNames(2))
        ));
    }

    #[test]
    fn no_common_name_is_refused() {
        assert!(matches!(
            identity_from_certificate(&cert(None, &["dev"])),
            Err(ClientCertError::NoCommonName)
        ));
        assert!(matches!(
            identity_from_certificate(b"not a certificate"),
            Err(ClientCertError::Unparsable)
        ));
    }
}
