//! The cluster prefix of a request target (`/clusters/NAME/...`) when one proxy fronts many
//! clusters: which cluster the target names, and the rest that goes to that cluster.
//!
//! The name is taken from the decoded reading (what the upstream acts on), and must be there
//! literally in the target as sent: a prefix that is there only once decoded (`/%63lusters/a/`,
//! `/clusters/a%2Fb/`) or only in the raw form is refused, as is any dot segment (`.` or `..`,
//! also with `;parameters`, which some fronts drop, or between `\\`, which some take for `/`)
//! anywhere in the decoded path, an empty first segment (`//clusters/...`), and a first segment
//! that a front dropping `;parameters`, taking `\\` for `/`, decoding twice or ignoring case
//! would read as `clusters` (`/clusters;x/b/`, `/%2563lusters/b/`, `/Clusters/b/`). Such a target
//! could name one cluster to the proxy and another to a gateway or an upstream that normalizes
//! paths (an upstream URL with a base path such as `https://gw/k8s/clusters/a` turns
//! `/clusters/a/../b/api` into `/k8s/clusters/b/api`), so it is never routed at all.

use super::go_url::unescape_path;
use super::target::RequestTarget;

/// The first segment that names a cluster.
pub const PREFIX: &str = "/clusters";

/// What a target's prefix says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterPrefix<'a> {
    /// The target names no cluster (no `/clusters/` prefix).
    Unprefixed,
    /// `/clusters/NAME[/rest]`: the name as sent, and the rest of the raw path (empty, or
    /// starting with `/`), which is what goes to that cluster.
    Named { name: &'a str, rest: &'a str },
    /// A target that cannot be routed safely; why.
    Refused(PrefixRefusal),
}

/// Why a target's cluster prefix is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrefixRefusal {
    /// The decoded path has a `.` or `..` segment (also with `;parameters`).
    #[error("the request path has a '.' or '..' segment")]
    DotSegment,
    /// The decoded path starts with an empty segment (`//`).
    #[error("the request path starts with an empty segment")]
    EmptySegment,
    /// The decoded path's cluster prefix is not in the path as sent, character for character.
    #[error("the cluster prefix of the request path is encoded")]
    EncodedPrefix,
}

/// Reads the cluster prefix of `raw_path` (the path as sent), whose decoded reading is
/// `target`.
pub fn read<'a>(raw_path: &'a str, target: &RequestTarget) -> ClusterPrefix<'a> {
    let decoded = target.path();
    if decoded.starts_with("//") {
        return ClusterPrefix::Refused(PrefixRefusal::EmptySegment);
    }
    // A front that drops `;parameters` from segments (as Tomcat does) reads `..;x` as `..`,
    // one that takes `\` for `/` reads `a\..` as two segments, one that decodes twice reads
    // `%2E%2E` as `..`.
    let dot = |s: &str| {
        let base = s.split(';').next().unwrap_or("");
        matches!(base, "." | "..")
            || unescape_path(base).is_ok_and(|b| matches!(b.as_slice(), b"." | b".."))
    };
    if decoded.split(['/', '\\']).any(dot) {
        return ClusterPrefix::Refused(PrefixRefusal::DotSegment);
    }
    let first = decoded
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    if first != "clusters" && disguised_prefix(first) {
        return ClusterPrefix::Refused(PrefixRefusal::EncodedPrefix);
    }
    let Some(after) = strip_segment(decoded, PREFIX) else {
        return ClusterPrefix::Unprefixed;
    };
    // The name as decoded: the segment after the prefix (empty when there is none).
    let name_len = after
        .strip_prefix('/')
        .map_or(0, |s| s.split('/').next().unwrap_or("").len());
    let name = &after[after.len().min(1)..after.len().min(1) + name_len];
    // The same prefix and name, character for character, in the target as sent.
    let literal = match strip_segment(raw_path, PREFIX) {
        Some("") if name.is_empty() => Some(("", "")),
        Some(raw_after) => raw_after.strip_prefix('/').and_then(|r| {
            let rest = strip_segment(r, name)?;
            Some((&r[..name.len()], rest))
        }),
        None => None,
    };
    match literal {
        Some((name, rest)) => ClusterPrefix::Named { name, rest },
        None => ClusterPrefix::Refused(PrefixRefusal::EncodedPrefix),
    }
}

/// Whether a first segment that is not `clusters` reads as `clusters` to a front that drops
/// `;parameters`, takes `\\` for `/`, decodes once more or ignores case (`clusters;x`,
/// `clusters\\b`, `%63lusters` after one decoding, `Clusters`).
fn disguised_prefix(first: &str) -> bool {
    let base = first.split([';', '\\']).next().unwrap_or("");
    let again = unescape_path(base).map(|b| String::from_utf8_lossy(&b).into_owned());
    base.eq_ignore_ascii_case("clusters") || again.is_ok_and(|a| a.eq_ignore_ascii_case("clusters"))
}

/// `path` without its start `segment` (`/clusters`, or a name), when the path ends there or
/// goes on with `/`.
fn strip_segment<'a>(path: &'a str, segment: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(segment)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(raw: &str) -> ClusterPrefix<'_> {
        let target = RequestTarget::parse(raw, None).unwrap();
        read(raw, &target)
    }

    #[test]
    fn a_literal_prefix_names_its_cluster_and_leaves_the_rest() {
        assert_eq!(
            prefix("/clusters/prod-eu/api/v1/namespaces/default/pods/web/exec"),
            ClusterPrefix::Named {
                name: "prod-eu",
                rest: "/api/v1/namespaces/default/pods/web/exec"
            }
        );
        assert_eq!(
            prefix("/clusters/a"),
            ClusterPrefix::Named {
                name: "a",
                rest: ""
            }
        );
        assert_eq!(
            prefix("/clusters/a/"),
            ClusterPrefix::Named {
                name: "a",
                rest: "/"
            }
        );
        // Encoded bytes after the prefix are the cluster's business.
        assert_eq!(
            prefix("/clusters/a/api/v1/namespaces/de%66ault/pods"),
            ClusterPrefix::Named {
                name: "a",
                rest: "/api/v1/namespaces/de%66ault/pods"
            }
        );
    }

    #[test]
    fn no_prefix_and_look_alikes_name_no_cluster() {
        for raw in ["/", "/api/v1/pods", "/clustersx/a/api", "/api/clusters/a"] {
            assert_eq!(prefix(raw), ClusterPrefix::Unprefixed, "{raw}");
        }
    }

    #[test]
    fn no_name_is_an_empty_name() {
        for raw in ["/clusters", "/clusters/", "/clusters//api"] {
            assert!(
                matches!(prefix(raw), ClusterPrefix::Named { name: "", .. }),
                "{raw}: {:?}",
                prefix(raw)
            );
        }
    }

    #[test]
    fn tricks_are_refused() {
        use PrefixRefusal::*;
        for (raw, why) in [
            ("/clusters/a/../b/api", DotSegment),
            ("/clusters/a%2F..%2Fb/api", DotSegment),
            ("/clusters/a/%2E%2E/b/api", DotSegment),
            ("/clusters/./a/api", DotSegment),
            ("/clusters/a/api/./v1", DotSegment),
            ("/clusters/a/..;/b/api", DotSegment),
            ("/clusters/a/..;x=1/b/api", DotSegment),
            ("/clusters/a/.;/api", DotSegment),
            ("/%63lusters/a/api", EncodedPrefix),
            ("/clusters/%61/api", EncodedPrefix),
            ("/clusters/a%2Fb/api", EncodedPrefix),
            ("/clusters%2Fa/api", EncodedPrefix),
            ("//clusters/a/api", EmptySegment),
            ("/clusters;x/b/api", EncodedPrefix),
            ("/clusters%5Cb/api", EncodedPrefix),
            ("/%2563lusters/b/api", EncodedPrefix),
            ("/Clusters/b/api", EncodedPrefix),
            ("/CLUSTERS/b/api", EncodedPrefix),
            ("/clusters/a%5C..%5Cb/api", DotSegment),
            ("/clusters/a/%252E%252E/b/api", DotSegment),
        ] {
            assert_eq!(prefix(raw), ClusterPrefix::Refused(why), "{raw}");
        }
    }
}
