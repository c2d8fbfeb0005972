//! A request target read once, as kube-apiserver will act on it: the decoded path, the query
//! pairs Go keeps, and the canonical form that makes the upstream read exactly that.

use super::go_url::{
    escape_path_into, escape_query_component_into, parse_query, unescape_path, BadEscape,
};

/// Why a request target cannot be read as the API server would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Go's server answers such a request itself with 400 before any Kubernetes code runs.
    #[error("the request path has an {0}")]
    BadPathEscape(BadEscape),
}

/// One request target (path and query), decoded with Go's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTarget {
    /// The decoded path (Go's `URL.Path`); bytes that are not UTF-8 read as U+FFFD.
    path: String,
    /// The query pairs Go's `url.ParseQuery` keeps, decoded, in the order sent; bytes that are
    /// not UTF-8 read as U+FFFD.
    query: Vec<(String, String)>,
    /// Whether every decoded byte of the path and the kept pairs was UTF-8.
    utf8: bool,
    /// The path and query re-encoded from the decoded bytes: Go reads it as exactly
    /// `path` and `query`.
    canonical: String,
    /// Whether the target as sent differs from `canonical` in any byte.
    rewritten: bool,
}

impl RequestTarget {
    /// Reads `path` and `query` (without the `?`) as sent.
    pub fn parse(path: &str, query: Option<&str>) -> Result<RequestTarget, TargetError> {
        let path_bytes = unescape_path(path).map_err(TargetError::BadPathEscape)?;
        let pairs = parse_query(query.unwrap_or(""));
        let mut utf8 = std::str::from_utf8(&path_bytes).is_ok();
        let mut canonical = String::with_capacity(path.len() + query.map_or(0, str::len) + 1);
        escape_path_into(&mut canonical, &path_bytes);
        if canonical.is_empty() {
            canonical.push('/');
        }
        let mut decoded = Vec::with_capacity(pairs.len());
        for (i, (key, value)) in pairs.iter().enumerate() {
            canonical.push(if i == 0 { '?' } else { '&' });
            escape_query_component_into(&mut canonical, key);
            canonical.push('=');
            escape_query_component_into(&mut canonical, value);
            utf8 &= std::str::from_utf8(key).is_ok() && std::str::from_utf8(value).is_ok();
            decoded.push((lossy(key), lossy(value)));
        }
        let rewritten = match query {
            None => canonical != path,
            Some(q) => {
                canonical
                    .strip_prefix(path)
                    .and_then(|r| r.strip_prefix('?'))
                    != Some(q)
            }
        };
        Ok(RequestTarget {
            path: lossy(&path_bytes),
            query: decoded,
            utf8,
            canonical,
            rewritten,
        })
    }

    /// Reads a path and query as one string (`/path?query`).
    pub fn parse_path_and_query(path_and_query: &str) -> Result<RequestTarget, TargetError> {
        match path_and_query.split_once('?') {
            Some((path, query)) => RequestTarget::parse(path, Some(query)),
            None => RequestTarget::parse(path_and_query, None),
        }
    }

    /// The decoded path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Every kept pair, decoded, in order.
    pub fn query(&self) -> &[(String, String)] {
        &self.query
    }

    /// The first value of `key`: what a single-valued API option reads (apimachinery's
    /// `Convert_Slice_string_To_*` take `[0]`).
    pub fn first(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order (list options such as `command`).
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.query
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the decoded path and query are UTF-8 throughout.
    pub fn is_utf8(&self) -> bool {
        self.utf8
    }

    /// The path and query to send upstream so that it reads exactly this target.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// Whether the target as sent differs from [`canonical`](Self::canonical).
    pub fn is_rewritten(&self) -> bool {
        self.rewritten
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pq: &str) -> RequestTarget {
        RequestTarget::parse_path_and_query(pq).unwrap()
    }

    #[test]
    fn what_kubectl_sends_is_already_canonical() {
        for pq in [
            "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo+hi&container=main&stdin=true&stdout=true&tty=true",
            "/api/v1/namespaces/default/pods/web/portforward",
            "/api/v1/namespaces/default/pods/web/log?follow=true",
            "/",
        ] {
            let t = read(pq);
            assert_eq!(t.canonical(), pq);
            assert!(!t.is_rewritten(), "{pq}");
        }
    }

    #[test]
    fn encoded_targets_are_decoded_and_rewritten() {
        let t = read("/api/v1/namespaces/de%66ault/pods/web/%65xec?%63ommand=id&container=a&container=b&x=%zz&y=1;2");
        assert_eq!(t.path(), "/api/v1/namespaces/default/pods/web/exec");
        assert_eq!(t.first("command"), Some("id"));
        assert_eq!(t.first("container"), Some("a"));
        assert_eq!(t.all("container").collect::<Vec<_>>(), ["a", "b"]);
        assert!(t.is_rewritten());
        assert_eq!(
            t.canonical(),
            "/api/v1/namespaces/default/pods/web/exec?command=id&container=a&container=b"
        );
        // An encoded slash is a slash to Go.
        assert_eq!(
            read("/api/v1/namespaces/ns/pods/web%2Fexec").path(),
            "/api/v1/namespaces/ns/pods/web/exec"
        );
        // A trailing `?` is no query.
        assert!(read("/api?").is_rewritten());
    }

    #[test]
    fn bad_path_escapes_are_refused_and_other_bytes_kept() {
        assert!(matches!(
            RequestTarget::parse("/api/%zz", None),
            Err(TargetError::BadPathEscape(_))
        ));
        let t = read("/api/%ff?a=%fe");
        assert!(!t.is_utf8());
        assert_eq!(t.canonical(), "/api/%FF?a=%FE");
    }
}
