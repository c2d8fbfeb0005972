//! The caller's identity from a verified client certificate, as Kubernetes' x509 authenticator
//! reads it: the subject's Common Name is the user, each Organization is a group.

use std::collections::BTreeMap;

use x509_parser::prelude::{FromDer, X509Certificate};

use super::identity::{Identity, IdentityError};

/// Why a certificate carries no usable identity.
#[derive(Debug, thiserror::Error)]
pub enum ClientCertError {
    #[error("the client certificate cannot be parsed")]
    Unparsable,
    #[error("the client certificate has no subject common name")]
    NoCommonName,
    #[error("the client certificate's subject is not usable: {0}")]
    Identity(#[from] IdentityError),
}

/// Reads the identity from the leaf certificate (DER). The TLS layer has already verified it
/// against `--client-ca-file`; this only reads the subject.
pub fn identity_from_certificate(der: &[u8]) -> Result<Identity, ClientCertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| ClientCertError::Unparsable)?;
    let subject = cert.subject();
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

    fn cert(cn: Option<&str>, orgs: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::new(vec![]).unwrap();
        let mut dn = DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(DnType::CommonName, cn);
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
