//! Whom a caller asks to act as with its own `Impersonate-*` headers (`kubectl --as`,
//! `--as-group`, `--as-uid`). In passthrough and front-proxy modes those headers go upstream
//! as the caller sent them and the API server authorizes them, so the proxy's audit event can
//! name both the caller and the identity it acted as. (Impersonate mode refuses them.)

use http::header::{self, HeaderMap, HeaderValue};

use crate::audit::ImpersonatedUser;

const USER: &str = "impersonate-user";
const UID: &str = "impersonate-uid";
const GROUP: &str = "impersonate-group";
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The impersonation `headers` ask for, as they will reach the upstream; `None` without any
/// `Impersonate-*` header. Headers named in `Connection` are left out: they are hop-by-hop
/// and removed before the request goes upstream.
///
/// Values are read as kube-apiserver reads them: every `Impersonate-Group` line is one group,
/// an empty `Impersonate-User` is no user, an extra's key is the rest of the header name,
/// lowercased and percent-decoded. Bytes that are not UTF-8 become U+FFFD, as they do in the
/// API server's own JSON audit events.
pub fn requested_impersonation(headers: &HeaderMap) -> Option<ImpersonatedUser> {
    let hop_by_hop = named_in_connection(headers);
    let mut asked = ImpersonatedUser::default();
    let mut any = false;
    for (name, value) in headers {
        let name = name.as_str();
        if !name.starts_with("impersonate-") || hop_by_hop.iter().any(|h| h == name) {
            continue;
        }
        any = true;
        let text = text(value);
        match name {
            USER if asked.user.is_none() && !text.is_empty() => asked.user = Some(text),
            UID if asked.uid.is_none() && !text.is_empty() => asked.uid = Some(text),
            GROUP => asked.groups.push(text),
            _ => {
                if let Some(key) = name.strip_prefix(EXTRA_PREFIX) {
                    asked.extra.entry(extra_key(key)).or_default().push(text);
                }
            }
        }
    }
    any.then_some(asked)
}

/// Header names listed in `Connection`, lowercased.
fn named_in_connection(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect()
}

/// A header value as text: Go keeps bytes above 0x7f in its strings, and JSON shows those that
/// are not UTF-8 as U+FFFD.
fn text(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// An extra's key from the header name's suffix: percent-decoded (kube-apiserver unescapes
/// it), the suffix as is when it does not decode.
fn extra_key(suffix: &str) -> String {
    percent_encoding::percent_decode_str(suffix)
        .decode_utf8()
        .map(|k| k.into_owned())
        .unwrap_or_else(|_| suffix.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn none_without_impersonation_headers() {
        assert_eq!(
            requested_impersonation(&headers(&[("authorization", b"Bearer t")])),
            None
        );
    }

    #[test]
    fn user_uid_groups_and_extras_as_the_api_server_reads_them() {
        let asked = requested_impersonation(&headers(&[
            ("impersonate-user", b"jane"),
            ("impersonate-uid", b"1234"),
            ("impersonate-group", b"dev"),
            ("impersonate-group", b"ops"),
            ("impersonate-extra-scopes", b"view"),
            ("impersonate-extra-example.com%2fteam", b"a"),
            ("impersonate-extra-example.com%2fteam", b"caf\xc3\xa9"),
        ]))
        .unwrap();
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("scopes".into(), vec!["view".into()]);
        extra.insert("example.com/team".into(), vec!["a".into(), "café".into()]);
        assert_eq!(
            asked,
            ImpersonatedUser {
                user: Some("jane".into()),
                uid: Some("1234".into()),
                groups: vec!["dev".into(), "ops".into()],
                extra,
            }
        );
    }

    #[test]
    fn groups_without_a_user_are_reported_as_asked() {
        // The API server refuses this (400); the event still says what was asked.
        let asked = requested_impersonation(&headers(&[
            ("impersonate-user", b""),
            ("impersonate-group", b"\xe9quipe"),
        ]))
        .unwrap();
        assert_eq!(asked.user, None);
        assert_eq!(asked.groups, ["\u{fffd}quipe"]);
    }

    #[test]
    fn headers_named_in_connection_never_go_upstream_so_do_not_count() {
        let h = headers(&[
            ("connection", b"Impersonate-User"),
            ("impersonate-user", b"root"),
        ]);
        assert_eq!(requested_impersonation(&h), None);
    }
}
