//! Certificates generated in the test (rcgen): CAs, serving certificates for 127.0.0.1, client
//! certificates whose subject is a Kubernetes identity (CN = user, O = group), expired ones.

use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    /// The CA certificate, PEM.
    pub pem: String,
}

/// A certificate and its private key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Leaf {
    /// Writes `<name>.crt` and `<name>.key` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

impl Ca {
    /// A fresh self-signed CA.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        Ca { cert, key, pem }
    }

    /// Writes the CA certificate to `dir/<name>.crt`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.crt"));
        std::fs::write(&path, &self.pem).unwrap();
        path
    }

    /// A serving certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A serving certificate for `names` (host names, wildcards such as `*.kube.example.com`).
    pub fn server_for(&self, names: &[&str]) -> Leaf {
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate for user `cn` in group `org`.
    pub fn client(&self, cn: &str, org: Option<&str>) -> Leaf {
        self.client_in_groups(cn, org.as_slice())
    }

    /// A client certificate for user `cn` in these groups (one O each).
    pub fn client_in_groups(&self, cn: &str, groups: &[&str]) -> Leaf {
        self.sign(client_params(cn, groups))
    }

    /// A client certificate whose subject carries every one of `names` as a CN, in order (Go
    /// reads such a subject as the last one).
    pub fn client_with_common_names(&self, names: &[&str]) -> Leaf {
        let mut params = client_params(names[0], &[]);
        for name in &names[1..] {
            params
                .distinguished_name
                .push(DnType::CustomDnType(CN_OID.to_vec()), *name);
        }
        self.sign(params)
    }

    /// A client certificate for `cn` that expired in 2020.
    pub fn expired_client(&self, cn: &str) -> Leaf {
        let mut params = client_params(cn, &[]);
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// The OID of `organizationName`: rcgen keeps one attribute per type, so every O after the first
/// is added under its raw OID.
const O_OID: [u64; 4] = [2, 5, 4, 10];
/// The OID of `commonName`, for a second CN (same reason).
const CN_OID: [u64; 4] = [2, 5, 4, 3];

fn client_params(cn: &str, groups: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    for (i, group) in groups.iter().enumerate() {
        let ty = if i == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(O_OID.to_vec())
        };
        params.distinguished_name.push(ty, *group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// Standard base64 of PEM text, for kubeconfig `*-data` fields.
pub fn b64(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// A kubeconfig for `server` trusting `ca_pem`, authenticating with a token and/or a client
/// certificate.
pub fn kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    token: Option<&str>,
    client: Option<&Leaf>,
) -> PathBuf {
    let mut user = String::new();
    if let Some(t) = token {
        user.push_str(&format!("    token: {t}\n"));
    }
    if let Some(c) = client {
        user.push_str(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&c.cert_pem),
            b64(&c.key_pem)
        ));
    }
    if user.is_empty() {
        user.push_str("    {}\n");
    }
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
             certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    \
             user: u\n    namespace: default\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user}",
            ca = b64(ca_pem)
        ),
    )
    .unwrap();
    path.to_owned()
}
