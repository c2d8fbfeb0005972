//! What the upstream is told about the caller: the request headers written for each auth mode,
//! on every path (plain, relays, translation, tunnel).

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue, SEC_WEBSOCKET_PROTOCOL};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::identity::Identity;
use super::{AuthMode, Caller};
use crate::proxy::upstream::token_source::TokenSource;
use crate::translate::subprotocol::BEARER_PREFIX;

/// Header names of request-header ("front-proxy") authentication, as configured on the API
/// server (`--requestheader-username-headers` …).
#[derive(Debug, Clone)]
pub struct FrontProxyHeaders {
    /// The user name header (`X-Remote-User`).
    pub user: HeaderName,
    /// The group header, one line per group (`X-Remote-Group`).
    pub group: HeaderName,
    /// Prefix of extra-attribute headers (`X-Remote-Extra-`), lowercase.
    pub extra_prefix: String,
}

impl Default for FrontProxyHeaders {
    fn default() -> Self {
        FrontProxyHeaders {
            user: HeaderName::from_static("x-remote-user"),
            group: HeaderName::from_static("x-remote-group"),
            extra_prefix: "x-remote-extra-".to_owned(),
        }
    }
}

/// Writes the caller's credentials or identity into upstream request headers.
#[derive(Debug)]
pub struct Outbound {
    pub(super) mode: AuthMode,
    /// The proxy's own token (impersonate mode).
    pub(super) token: Option<Arc<TokenSource>>,
    pub(super) front_proxy: FrontProxyHeaders,
}

const IMPERSONATE_PREFIX: &str = "impersonate-";

/// Whether `name` is an `Impersonate-*` header.
pub fn is_impersonation_header(name: &HeaderName) -> bool {
    name.as_str().starts_with(IMPERSONATE_PREFIX)
}

impl Outbound {
    /// Rewrites `headers` (already free of hop-by-hop headers) for the upstream.
    pub fn apply(&self, caller: &Caller, headers: &mut HeaderMap) {
        // A bearer entry in the subprotocol list never travels upstream: in passthrough it
        // becomes `Authorization`, in the other modes the proxy's own credentials replace it.
        remove_bearer_subprotocol(headers);
        match caller {
            Caller::Passthrough { bearer, .. } => {
                if let Some(token) = bearer {
                    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", token.expose())) {
                        headers.insert(header::AUTHORIZATION, v);
                    }
                }
            }
            Caller::Identified { identity, .. } => {
                headers.remove(header::AUTHORIZATION);
                self.remove_front_proxy_headers(headers);
                match self.mode {
                    AuthMode::Impersonate => {
                        remove_prefixed(headers, IMPERSONATE_PREFIX);
                        if let Some(token) = self.token.as_ref().and_then(|t| t.current()) {
                            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {token}")) {
                                headers.insert(header::AUTHORIZATION, v);
                            }
                        }
                        write_identity(
                            headers,
                            identity,
                            &HeaderName::from_static("impersonate-user"),
                            &HeaderName::from_static("impersonate-group"),
                            "impersonate-extra-",
                        );
                    }
                    AuthMode::FrontProxy => {
                        // The caller's own Impersonate-* headers stay: the API server authorizes
                        // them against the identity below (`kubectl --as` keeps working).
                        let names = &self.front_proxy;
                        write_identity(
                            headers,
                            identity,
                            &names.user,
                            &names.group,
                            &names.extra_prefix,
                        );
                    }
                    AuthMode::Passthrough => {}
                }
            }
        }
    }

    fn remove_front_proxy_headers(&self, headers: &mut HeaderMap) {
        headers.remove(&self.front_proxy.user);
        headers.remove(&self.front_proxy.group);
        remove_prefixed(headers, &self.front_proxy.extra_prefix);
        // The usual names too, whatever is configured: a caller must never smuggle them.
        remove_prefixed(headers, "x-remote-");
    }
}

fn write_identity(
    headers: &mut HeaderMap,
    identity: &Identity,
    user: &HeaderName,
    group: &HeaderName,
    extra_prefix: &str,
) {
    // `Identity::new` checked every value is header-safe.
    if let Ok(v) = HeaderValue::from_str(identity.user()) {
        headers.insert(user.clone(), v);
    }
    for g in identity.forwarded_groups() {
        if let Ok(v) = HeaderValue::from_str(g) {
            headers.append(group.clone(), v);
        }
    }
    for (key, values) in identity.extra() {
        let Ok(name) =
            HeaderName::from_bytes(format!("{extra_prefix}{}", escape_key(key)).as_bytes())
        else {
            continue;
        };
        for value in values {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Removes every header whose (lowercase) name starts with `prefix`.
fn remove_prefixed(headers: &mut HeaderMap, prefix: &str) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with(prefix))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Bytes of an extra key sent as they are; everything else is percent-encoded, as the API
/// server expects (it decodes the rest of the header name after the prefix).
const KEY_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn escape_key(key: &str) -> String {
    utf8_percent_encode(key, KEY_UNRESERVED).to_string()
}

/// Drops bearer-token entries from `Sec-WebSocket-Protocol`, keeping the rest in order.
/// Classification refuses lines that are not visible ASCII; should one get here anyway, it is
/// dropped whole rather than passed on with whatever it carries.
fn remove_bearer_subprotocol(headers: &mut HeaderMap) {
    let prefix = BEARER_PREFIX.as_bytes();
    let carries_token = headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .any(|v| v.as_bytes().windows(prefix.len()).any(|w| w == prefix));
    if !carries_token {
        return;
    }
    let kept: Vec<String> = headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty() && !e.starts_with(BEARER_PREFIX))
        .map(str::to_owned)
        .collect();
    headers.remove(SEC_WEBSOCKET_PROTOCOL);
    if kept.is_empty() {
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&kept.join(", ")) {
        headers.insert(SEC_WEBSOCKET_PROTOCOL, v);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::translate::subprotocol::{bearer_entry, OfferedProtocols};

    fn outbound(mode: AuthMode, token: Option<&str>) -> Outbound {
        Outbound {
            mode,
            token: token.map(|t| Arc::new(TokenSource::Fixed(t.to_owned()))),
            front_proxy: FrontProxyHeaders::default(),
        }
    }

    fn alice() -> Caller {
        let mut extra = BTreeMap::new();
        extra.insert(
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec!["web-1".to_owned()],
        );
        Caller::Identified {
            identity: Arc::new(
                Identity::new(
                    "alice",
                    vec!["dev".into(), "system:authenticated".into()],
                    extra,
                )
                .unwrap(),
            ),
            impersonating: None,
            address: LOCAL,
        }
    }

    const LOCAL: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn caller_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer caller-token".parse().unwrap());
        h.insert("x-remote-user", "mallory".parse().unwrap());
        h.insert("x-remote-extra-foo", "bar".parse().unwrap());
        h.insert(
            SEC_WEBSOCKET_PROTOCOL,
            format!("{}, v5.channel.k8s.io", bearer_entry("caller-token"))
                .parse()
                .unwrap(),
        );
        h.insert("user-agent", "kubectl".parse().unwrap());
        h
    }

    fn values<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn a_token_on_a_line_that_is_not_ascii_never_travels() {
        let mut h = HeaderMap::new();
        h.append(SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io".parse().unwrap());
        let line = format!("{}, v4.channel.k8s.io\u{e9}", bearer_entry("secret"));
        h.append(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_bytes(line.as_bytes()).unwrap(),
        );
        outbound(AuthMode::Passthrough, None).apply(
            &Caller::Passthrough {
                bearer: None,
                impersonating: None,
                address: LOCAL,
            },
            &mut h,
        );
        assert_eq!(values(&h, "sec-websocket-protocol"), ["v5.channel.k8s.io"]);
    }

    #[test]
    fn passthrough_moves_the_subprotocol_token_to_authorization() {
        let mut h = HeaderMap::new();
        h.insert(
            SEC_WEBSOCKET_PROTOCOL,
            format!("{}, base64.binary.k8s.io", bearer_entry("t0k"))
                .parse()
                .unwrap(),
        );
        let mut offered = OfferedProtocols::from_headers(&h).unwrap();
        let caller = Caller::Passthrough {
            bearer: offered.take_bearer(),
            impersonating: None,
            address: LOCAL,
        };
        outbound(AuthMode::Passthrough, None).apply(&caller, &mut h);
        assert_eq!(values(&h, "authorization"), ["Bearer t0k"]);
        assert_eq!(
            values(&h, "sec-websocket-protocol"),
            ["base64.binary.k8s.io"]
        );
    }

    #[test]
    fn passthrough_leaves_everything_else_alone() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer mine".parse().unwrap());
        h.insert("impersonate-user", "bob".parse().unwrap());
        h.insert("x-remote-user", "carol".parse().unwrap());
        let before = h.clone();
        outbound(AuthMode::Passthrough, Some("proxy")).apply(
            &Caller::Passthrough {
                bearer: None,
                impersonating: None,
                address: LOCAL,
            },
            &mut h,
        );
        assert_eq!(h, before);
    }

    #[test]
    fn impersonate_replaces_credentials_with_the_proxys_and_impersonates() {
        let mut h = caller_headers();
        h.insert("impersonate-user", "root".parse().unwrap());
        outbound(AuthMode::Impersonate, Some("proxy-token")).apply(&alice(), &mut h);
        assert_eq!(values(&h, "authorization"), ["Bearer proxy-token"]);
        assert_eq!(values(&h, "impersonate-user"), ["alice"]);
        assert_eq!(values(&h, "impersonate-group"), ["dev"]);
        assert_eq!(
            values(
                &h,
                "impersonate-extra-authentication.kubernetes.io%2Fpod-name"
            ),
            ["web-1"]
        );
        assert!(h.get("x-remote-user").is_none());
        assert!(h.get("x-remote-extra-foo").is_none());
        assert_eq!(values(&h, "sec-websocket-protocol"), ["v5.channel.k8s.io"]);
        assert_eq!(values(&h, "user-agent"), ["kubectl"]);
    }

    #[test]
    fn impersonate_without_a_token_relies_on_the_client_certificate() {
        let mut h = caller_headers();
        outbound(AuthMode::Impersonate, None).apply(&alice(), &mut h);
        assert!(h.get("authorization").is_none());
        assert_eq!(values(&h, "impersonate-user"), ["alice"]);
    }

    #[test]
    fn front_proxy_writes_request_headers_and_strips_caller_copies() {
        let mut h = caller_headers();
        h.insert("impersonate-user", "bob".parse().unwrap());
        let mut out = outbound(AuthMode::FrontProxy, Some("unused"));
        out.front_proxy = FrontProxyHeaders {
            user: HeaderName::from_static("x-user"),
            group: HeaderName::from_static("x-group"),
            extra_prefix: "x-extra-".to_owned(),
        };
        let mut caller_copy = h.clone();
        caller_copy.insert("x-user", "mallory".parse().unwrap());
        caller_copy.insert("x-extra-evil", "1".parse().unwrap());
        out.apply(&alice(), &mut caller_copy);
        let h = caller_copy;
        assert!(h.get("authorization").is_none());
        assert_eq!(values(&h, "x-user"), ["alice"]);
        assert_eq!(values(&h, "x-group"), ["dev"]);
        assert!(h.get("x-extra-evil").is_none());
        assert_eq!(
            values(&h, "x-extra-authentication.kubernetes.io%2Fpod-name"),
            ["web-1"]
        );
        assert!(h.get("x-remote-user").is_none());
        // The API server authorizes the caller's own impersonation against alice.
        assert_eq!(values(&h, "impersonate-user"), ["bob"]);
    }

    #[test]
    fn extra_keys_are_percent_encoded() {
        assert_eq!(escape_key("a/b c%"), "a%2Fb%20c%25");
        assert_eq!(escape_key("scopes"), "scopes");
    }
}
