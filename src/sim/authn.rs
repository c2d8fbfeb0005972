//! Authentication, in kube-apiserver's order: request-header (front proxy), x509 client
//! certificate, bearer token. The first authenticator that accepts the request decides; one
//! that does not apply (or rejects) hands over to the next.

use std::collections::BTreeMap;

use base64::Engine;
use http::HeaderMap;

use super::identity::{AuthenticatedBy, SimIdentity, REQUIRED_TOKEN_USER};
use super::peer_cert::PeerCert;
use super::subprotocols::{offered_subprotocols, BEARER_PROTOCOL_PREFIX};
use super::SimConfig;

/// Request-header authentication: a front proxy (presenting a certificate of its own CA)
/// asserts the user in headers, like kube-apiserver's `--requestheader-*` flags.
#[derive(Debug, Clone)]
pub struct SimFrontProxy {
    /// PEM CA bundle that signs the front proxy's client certificate. Should differ from the
    /// client CA: any certificate it signs may assert any user.
    pub requestheader_client_ca_pem: String,
    /// Common names a front-proxy certificate may have; empty: any.
    pub allowed_names: Vec<String>,
    /// Headers naming the user; the first non-empty one counts.
    pub username_headers: Vec<String>,
    /// Headers carrying groups; every value of each counts.
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes; the key is the rest of the header name,
    /// lowercased and percent-decoded.
    pub extra_header_prefixes: Vec<String>,
}

impl SimFrontProxy {
    /// Trusts `ca_pem`, any common name, and kube-apiserver's customary header names
    /// (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-`).
    pub fn new(ca_pem: impl Into<String>) -> SimFrontProxy {
        SimFrontProxy {
            requestheader_client_ca_pem: ca_pem.into(),
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".to_owned()],
            group_headers: vec!["X-Remote-Group".to_owned()],
            extra_header_prefixes: vec!["X-Remote-Extra-".to_owned()],
        }
    }
}

/// Who the caller proved to be, before impersonation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authenticated {
    pub identity: SimIdentity,
    pub by: AuthenticatedBy,
}

/// Whether any authenticator is configured; without one every caller is anonymous.
pub(crate) fn configured(config: &SimConfig) -> bool {
    config.require_bearer_token.is_some()
        || !config.users.is_empty()
        || config.front_proxy.is_some()
        || config
            .tls
            .as_ref()
            .is_some_and(|t| t.client_ca_pem.is_some())
}

/// Runs the authenticator chain; `None`: 401.
pub(crate) fn authenticate(
    config: &SimConfig,
    peer: Option<&PeerCert>,
    headers: &HeaderMap,
) -> Option<Authenticated> {
    if !configured(config) {
        return Some(Authenticated {
            identity: SimIdentity::anonymous(),
            by: AuthenticatedBy::Anonymous,
        });
    }
    if let (Some(fp), Some(peer)) = (&config.front_proxy, peer) {
        if let Some(identity) = front_proxy(fp, peer, headers) {
            return Some(Authenticated {
                identity,
                by: AuthenticatedBy::FrontProxy,
            });
        }
    }
    if let Some(identity) = peer.and_then(client_cert) {
        return Some(Authenticated {
            identity,
            by: AuthenticatedBy::ClientCert,
        });
    }
    bearer_tokens(headers)
        .iter()
        .find_map(|t| token_user(config, t))
        .map(|identity| Authenticated {
            identity,
            by: AuthenticatedBy::Token,
        })
}

/// The user a bearer token stands for (also what a TokenReview answers).
pub(crate) fn token_user(config: &SimConfig, token: &str) -> Option<SimIdentity> {
    if token.is_empty() {
        return None;
    }
    if let Some(u) = config.users.iter().find(|u| u.token == token) {
        return Some(SimIdentity::authenticated(
            &u.name,
            u.groups.iter().cloned(),
            BTreeMap::new(),
        ));
    }
    (config.require_bearer_token.as_deref() == Some(token))
        .then(|| SimIdentity::authenticated(REQUIRED_TOKEN_USER, Vec::new(), BTreeMap::new()))
}

/// Candidate tokens: every `Authorization: Bearer` value, then the WebSocket subprotocol
/// entry if exactly one was offered.
fn bearer_tokens(headers: &HeaderMap) -> Vec<String> {
    let mut tokens: Vec<String> = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .collect();
    let mut offered = offered_subprotocols(headers)
        .into_iter()
        .filter_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX).map(str::to_owned));
    if let (Some(encoded), None) = (offered.next(), offered.next()) {
        if let Some(token) = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
        {
            tokens.push(token);
        }
    }
    tokens
}

/// x509: a certificate of the client CA with a CN.
fn client_cert(peer: &PeerCert) -> Option<SimIdentity> {
    if !peer.by_client_ca {
        return None;
    }
    let name = peer
        .subject
        .common_name
        .as_deref()
        .filter(|n| !n.is_empty())?;
    Some(SimIdentity::authenticated(
        name,
        peer.subject.organizations.iter().cloned(),
        BTreeMap::new(),
    ))
}

/// Request-header: a front-proxy certificate with an allowed CN, and a user header.
fn front_proxy(fp: &SimFrontProxy, peer: &PeerCert, headers: &HeaderMap) -> Option<SimIdentity> {
    if !peer.by_front_proxy_ca {
        return None;
    }
    if !fp.allowed_names.is_empty() {
        let cn = peer.subject.common_name.as_deref()?;
        if !fp.allowed_names.iter().any(|n| n == cn) {
            return None;
        }
    }
    let name = fp.username_headers.iter().find_map(|h| {
        headers
            .get(h.as_str())
            .map(header_text)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    })?;
    let groups = fp
        .group_headers
        .iter()
        .flat_map(|h| headers.get_all(h.as_str()).iter())
        .map(header_text)
        .collect::<Vec<_>>();
    let extra = prefixed_values(headers, &fp.extra_header_prefixes);
    Some(SimIdentity::authenticated(name, groups, extra))
}

/// Values of headers named `<prefix><key>`, by key (lowercased, percent-decoded). Each header
/// line is one value, as Go's `http.Header` keeps them.
pub(crate) fn prefixed_values(
    headers: &HeaderMap,
    prefixes: &[String],
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        let Some(key) = prefixes.iter().find_map(|p| {
            (name.len() > p.len() && name[..p.len()].eq_ignore_ascii_case(p))
                .then(|| &name[p.len()..])
        }) else {
            continue;
        };
        out.entry(unescape_key(key))
            .or_default()
            .push(header_text(value));
    }
    out
}

/// A header value as Go's net/http gives it to kube-apiserver: bytes above 0x7f are kept in
/// the string as they came (`Header.Get` returns them), not dropped as `to_str` would. Those
/// that are not UTF-8 become U+FFFD, which is how the API server's JSON (user info, audit)
/// shows them.
pub(crate) fn header_text(value: &http::HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// Lowercase, then percent-decode (a malformed escape keeps its raw text).
fn unescape_key(key: &str) -> String {
    let lower = key.to_ascii_lowercase();
    percent_encoding::percent_decode_str(&lower)
        .decode_utf8()
        .map(|k| k.into_owned())
        .unwrap_or(lower)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::identity::test_support::headers;
    use crate::sim::identity::{SimUser, AUTHENTICATED_GROUP};
    use crate::sim::peer_cert::CertSubject;
    use crate::sim::SimTls;

    fn config() -> SimConfig {
        SimConfig {
            tls: Some(SimTls {
                cert_chain_pem: String::new(),
                private_key_pem: String::new(),
                client_ca_pem: Some(String::new()),
            }),
            front_proxy: Some(SimFrontProxy::new("")),
            users: vec![SimUser {
                token: "tok".into(),
                name: "tina".into(),
                groups: vec!["dev".into()],
            }],
            ..SimConfig::default()
        }
    }

    fn peer(cn: &str, client: bool, front: bool) -> PeerCert {
        PeerCert {
            subject: CertSubject {
                common_name: Some(cn.into()),
                organizations: vec!["o1".into(), "o2".into()],
            },
            by_client_ca: client,
            by_front_proxy_ca: front,
        }
    }

    #[test]
    fn open_cluster_is_anonymous() {
        let a = authenticate(&SimConfig::default(), None, &HeaderMap::new()).unwrap();
        assert_eq!(a.by, AuthenticatedBy::Anonymous);
        assert_eq!(a.identity, SimIdentity::anonymous());
    }

    #[test]
    fn order_front_proxy_then_cert_then_token() {
        let c = config();
        let h = headers(&[
            ("authorization", "Bearer tok"),
            ("x-remote-user", "fp-user"),
            ("x-remote-group", "g1"),
            ("x-remote-group", "g2"),
            ("x-remote-extra-Scopes%2Fx", "a"),
            ("x-remote-extra-scopes%2fx", "b"),
        ]);
        let a = authenticate(&c, Some(&peer("front", false, true)), &h).unwrap();
        assert_eq!(a.by, AuthenticatedBy::FrontProxy);
        assert_eq!(a.identity.name, "fp-user");
        assert_eq!(a.identity.groups, ["g1", "g2", AUTHENTICATED_GROUP]);
        assert_eq!(a.identity.extra["scopes/x"], ["a", "b"]);

        // A client-CA certificate: its headers are ignored, the cert decides.
        let a = authenticate(&c, Some(&peer("carol", true, false)), &h).unwrap();
        assert_eq!(a.by, AuthenticatedBy::ClientCert);
        assert_eq!(a.identity.name, "carol");
        assert_eq!(a.identity.groups, ["o1", "o2", AUTHENTICATED_GROUP]);

        // No certificate: the token.
        let a = authenticate(&c, None, &h).unwrap();
        assert_eq!(a.by, AuthenticatedBy::Token);
        assert_eq!(a.identity.name, "tina");
        assert_eq!(a.identity.groups, ["dev", AUTHENTICATED_GROUP]);
    }

    #[test]
    fn front_proxy_without_user_header_or_with_foreign_cn_falls_through() {
        let mut c = config();
        let h = headers(&[("x-remote-group", "g1")]);
        assert!(authenticate(&c, Some(&peer("front", false, true)), &h).is_none());
        c.front_proxy.as_mut().unwrap().allowed_names = vec!["front".into()];
        let h = headers(&[("x-remote-user", "u")]);
        assert!(authenticate(&c, Some(&peer("front", false, true)), &h).is_some());
        assert!(authenticate(&c, Some(&peer("other", false, true)), &h).is_none());
    }

    #[test]
    fn tokens_from_websocket_subprotocol_and_required_token() {
        let mut c = config();
        c.require_bearer_token = Some("req".into());
        let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("tok");
        let h = headers(&[(
            "sec-websocket-protocol",
            &format!("v4.channel.k8s.io, {BEARER_PROTOCOL_PREFIX}{enc}"),
        )]);
        assert_eq!(authenticate(&c, None, &h).unwrap().identity.name, "tina");
        let h = headers(&[("authorization", "bearer req")]);
        assert_eq!(
            authenticate(&c, None, &h).unwrap().identity.name,
            REQUIRED_TOKEN_USER
        );
        let h = headers(&[("authorization", "Bearer nope")]);
        assert!(authenticate(&c, None, &h).is_none());
    }
}
