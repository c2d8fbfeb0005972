//! The kubelet's own API behind `nodes/{node}/proxy`: which kubelet call a decoded request path
//! reaches, read as kube-apiserver builds the kubelet's URL and as the kubelet routes it.
//!
//! kube-apiserver (`pkg/registry/core/node/rest/proxy.go`, `node.ResourceLocation`):
//! - its request info splits the decoded path on `/` after trimming every leading and trailing
//!   `/` (`/api/v1/nodes/{id}/proxy/...`: empty segments in between stay);
//! - `{id}` is `[scheme:]name[:port]` (`SplitSchemeNamePort`: one to three `:`-separated
//!   parts, a non-empty name, a scheme of `http`, `https` or none); anything else is a 400.
//!   Without a port, or with the kubelet's, the request goes to the kubelet; with another port
//!   to that port on the node. The port is not known here, so every port is read as the
//!   kubelet's: a path read as a kubelet call that was not one is only audited needlessly;
//! - the remainder after `proxy` is joined with `/`, given a leading `/`, and a trailing one
//!   when the request path ended in one; the kubelet's path is that `path.Join`ed (cleaned:
//!   `.`, `..` and doubled slashes resolved), its trailing slash kept;
//! - the query goes on as it came for a plain request (`run`). An upgrade's query is dropped
//!   by today's kube-apiserver (kubernetes#77142), but not by a kubelet reached directly or an
//!   API server that keeps it: it is read as if it arrived.
//!
//! The kubelet (`pkg/kubelet/server/server.go`, go-restful, case-sensitive segments):
//! - `exec`, `attach` (GET, POST): `/{verb}/{namespace}/{pod}/{container}` or
//!   `/{verb}/{namespace}/{pod}/{uid}/{container}`; the command is every `command` value of
//!   the query; the streams are `input`, `output`, `error` and `tty`, each on when its first
//!   value is exactly `1`;
//! - `portForward` (GET, POST): `/portForward/{namespace}/{pod}[/{uid}]`; a WebSocket names its
//!   ports with `port`;
//! - `run` (POST): `/run/{namespace}/{pod}[/{uid}]/{container}`, the command the first `cmd`
//!   value split at each space.
//!
//! The kubelet reads the stream flags and `run`'s `cmd` with `FormValue`, which prefers a
//! form-encoded request body: the proxy reads such a body for `run`
//! ([`run_command`]) and refuses one on the other calls.

use super::go_url::parse_query;

/// A kubelet call reached through `nodes/{node}/proxy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletTarget {
    /// The node's name (without a scheme or port the request named).
    pub node: String,
    pub call: KubeletCall,
    pub namespace: String,
    pub pod: String,
    /// The pod uid the path names, if it names one.
    pub uid: Option<String>,
    /// The container (`exec`, `attach`, `run`).
    pub container: Option<String>,
}

/// What a kubelet call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletCall {
    Exec,
    Attach,
    PortForward,
    Run,
}

impl KubeletCall {
    /// The path segment that names it on the kubelet.
    pub fn segment(self) -> &'static str {
        match self {
            KubeletCall::Exec => "exec",
            KubeletCall::Attach => "attach",
            KubeletCall::PortForward => "portForward",
            KubeletCall::Run => "run",
        }
    }

    fn from_segment(segment: &str) -> Option<KubeletCall> {
        [
            KubeletCall::Exec,
            KubeletCall::Attach,
            KubeletCall::PortForward,
            KubeletCall::Run,
        ]
        .into_iter()
        .find(|c| c.segment() == segment)
    }

    /// Whether the kubelet routes `method` to it (others are a 405).
    pub fn accepts(self, method: &http::Method) -> bool {
        match self {
            KubeletCall::Run => method == http::Method::POST,
            _ => method == http::Method::GET || method == http::Method::POST,
        }
    }
}

const NODES: &str = "/api/v1/nodes/";

/// Where in a decoded path a node proxy request starts (the `/api/v1/nodes/` it is read
/// from). A prefix before it is allowed (an API server mounted below a path), but not one
/// that is itself an API path (`/api/v1/namespaces/x/pods/y/proxy/api/v1/nodes/...` is a pod's
/// proxy).
pub fn node_proxy_start(path: &str) -> Option<usize> {
    let start = path.find(NODES)?;
    (!path[..start].contains("/api/")).then_some(start)
}

/// The kubelet call `method` on a decoded `path` reaches, if it reaches one.
pub fn parse_kubelet_call(method: &http::Method, path: &str) -> Option<KubeletTarget> {
    let start = node_proxy_start(path)?;
    // What follows `/api/v1/`, the path's trailing slashes trimmed as the request info trims
    // them: `nodes/{id}/proxy/...`.
    let parts: Vec<&str> = path[start + "/api/v1/".len()..]
        .trim_end_matches('/')
        .split('/')
        .collect();
    let [_nodes, id, "proxy", rest @ ..] = parts.as_slice() else {
        return None;
    };
    let node = node_name(id)?;
    let kubelet_path = kubelet_path(rest, path.ends_with('/'));
    let target = route(&kubelet_path, node)?;
    target.call.accepts(method).then_some(target)
}

/// The node name of a `[scheme:]name[:port]` id, as `SplitSchemeNamePort` splits it; `None`
/// for an id the API server refuses.
fn node_name(id: &str) -> Option<String> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name) = match parts.as_slice() {
        [name] | [name, _] => ("", *name),
        [scheme, name, _] => (*scheme, *name),
        _ => return None,
    };
    let scheme_ok = matches!(scheme, "" | "http" | "https");
    (scheme_ok && !name.is_empty()).then(|| name.to_owned())
}

/// The kubelet's path for the segments after `proxy`: joined, rooted, cleaned as Go's
/// `path.Join` cleans, with a trailing slash when the request had one.
fn kubelet_path(rest: &[&str], trailing_slash: bool) -> String {
    let joined = rest.join("/");
    if joined.is_empty() {
        return String::new();
    }
    let mut cleaned = clean(&format!("/{joined}"));
    if trailing_slash && !cleaned.ends_with('/') {
        cleaned.push('/');
    }
    cleaned
}

/// Go's `path.Clean` of a rooted path: empty and `.` segments dropped, `..` removes the one
/// before it (never above the root), no trailing slash.
fn clean(rooted: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for segment in rooted.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    format!("/{}", kept.join("/"))
}

/// The kubelet route of `kubelet_path`, if it is one of its calls.
fn route(kubelet_path: &str, node: String) -> Option<KubeletTarget> {
    // go-restful matches segments after trimming the path's trailing slashes.
    let trimmed = kubelet_path.strip_prefix('/')?.trim_end_matches('/');
    let segments: Vec<&str> = trimmed.split('/').collect();
    let (call, args) = segments.split_first()?;
    let call = KubeletCall::from_segment(call)?;
    let owned = |s: &&str| s.to_string();
    let (namespace, pod, uid, container) = match (call, args) {
        (KubeletCall::PortForward, [ns, pod]) => (ns, pod, None, None),
        (KubeletCall::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid), None),
        (KubeletCall::PortForward, _) => return None,
        (_, [ns, pod, container]) => (ns, pod, None, Some(container)),
        (_, [ns, pod, uid, container]) => (ns, pod, Some(uid), Some(container)),
        _ => return None,
    };
    Some(KubeletTarget {
        node,
        call,
        namespace: owned(namespace),
        pod: owned(pod),
        uid: uid.map(owned),
        container: container.map(owned),
    })
}

/// The command `run` executes: the first `cmd` value of the form (a form-encoded `body`'s
/// pairs first, then the query's), split at each space as the kubelet splits it.
pub fn run_command(query: &[(String, String)], form_body: Option<&str>) -> Vec<String> {
    let from_body = form_body.map(parse_query).unwrap_or_default();
    let body_cmd = from_body
        .iter()
        .find(|(k, _)| k == b"cmd")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    let cmd = body_cmd
        .or_else(|| {
            query
                .iter()
                .find(|(k, _)| k == "cmd")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_default();
    cmd.split(' ').map(str::to_owned).collect()
}

/// A kubelet stream flag (`input`, `output`, `error`, `tty`): on when its first value is `1`.
pub fn kubelet_flag(query: &[(String, String)], key: &str) -> bool {
    query
        .iter()
        .find(|(k, _)| k == key)
        .is_some_and(|(_, v)| v == "1")
}

/// Whether a `Content-Type` is one whose body Go's `FormValue` reads
/// (`application/x-www-form-urlencoded`, or `multipart/form-data`, which the proxy does not
/// read), as `mime.ParseMediaType` names it: the part before any `;`, trimmed, lowercase.
pub fn form_media_type(content_type: &str) -> Option<FormBody> {
    let media = content_type.split(';').next()?.trim().to_ascii_lowercase();
    match media.as_str() {
        "application/x-www-form-urlencoded" => Some(FormBody::UrlEncoded),
        "multipart/form-data" => Some(FormBody::Multipart),
        _ => None,
    }
}

/// A request body Go's `FormValue` reads before the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormBody {
    UrlEncoded,
    Multipart,
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn call(path: &str) -> Option<KubeletTarget> {
        parse_kubelet_call(&Method::POST, path)
    }

    #[test]
    fn the_kubelet_routes() {
        let t = call("/api/v1/nodes/worker-1/proxy/exec/team/web/main").unwrap();
        assert_eq!(
            t,
            KubeletTarget {
                node: "worker-1".into(),
                call: KubeletCall::Exec,
                namespace: "team".into(),
                pod: "web".into(),
                uid: None,
                container: Some("main".into()),
            }
        );
        let t = call("/api/v1/nodes/w/proxy/attach/ns/p/0b1c/c").unwrap();
        assert_eq!(
            (t.call, t.uid.as_deref()),
            (KubeletCall::Attach, Some("0b1c"))
        );
        let t = call("/api/v1/nodes/w/proxy/portForward/ns/p").unwrap();
        assert_eq!((t.call, t.container), (KubeletCall::PortForward, None));
        let t = call("/api/v1/nodes/w/proxy/portForward/ns/p/uid").unwrap();
        assert_eq!(t.uid.as_deref(), Some("uid"));
        let t = call("/api/v1/nodes/w/proxy/run/ns/p/c").unwrap();
        assert_eq!(t.call, KubeletCall::Run);
        for not in [
            "/api/v1/nodes/w/proxy/exec/ns/p",
            "/api/v1/nodes/w/proxy/exec/ns/p/u/c/x",
            "/api/v1/nodes/w/proxy/portforward/ns/p",
            "/api/v1/nodes/w/proxy/portForward/ns/p/u/x",
            "/api/v1/nodes/w/proxy/Exec/ns/p/c",
            "/api/v1/nodes/w/proxy/metrics",
            "/api/v1/nodes/w/proxy",
            "/api/v1/nodes/w/exec/ns/p/c",
            "/api/v1/namespaces/ns/pods/p/exec",
            "/api/v1/namespaces/ns/pods/p/proxy/api/v1/nodes/w/proxy/exec/ns/p/c",
        ] {
            assert_eq!(call(not), None, "{not}");
        }
    }

    #[test]
    fn methods_as_the_kubelet_routes_them() {
        let exec = "/api/v1/nodes/w/proxy/exec/ns/p/c";
        let run = "/api/v1/nodes/w/proxy/run/ns/p/c";
        assert!(parse_kubelet_call(&Method::GET, exec).is_some());
        assert!(parse_kubelet_call(&Method::PUT, exec).is_none());
        assert!(parse_kubelet_call(&Method::GET, run).is_none());
    }

    #[test]
    fn node_ids_as_the_api_server_splits_them() {
        for (id, node) in [
            ("w", Some("w")),
            ("w:10250", Some("w")),
            ("https:w:10250", Some("w")),
            ("http:w:", Some("w")),
            ("w:", Some("w")),
            (":10250", None),
            ("ftp:w:1", None),
            ("a:b:c:d", None),
            ("", None),
        ] {
            let path = format!("/api/v1/nodes/{id}/proxy/exec/ns/p/c");
            assert_eq!(call(&path).map(|t| t.node), node.map(str::to_owned), "{id}");
        }
    }

    #[test]
    fn the_remainder_is_cleaned_as_path_join_cleans_it() {
        for (path, pod) in [
            ("/api/v1/nodes/w/proxy/x/../exec/ns/p/c", "p"),
            ("/api/v1/nodes/w/proxy/../../exec/ns/p/c", "p"),
            ("/api/v1/nodes/w/proxy//exec//ns/./p/c", "p"),
            ("/api/v1/nodes/w/proxy/exec/ns/p/c/", "p"),
            ("//api/v1/nodes/w/proxy/exec/ns/p/c//", "p"),
            ("/prefix/api/v1/nodes/w/proxy/exec/ns/q/c", "q"),
        ] {
            assert_eq!(call(path).map(|t| t.pod), Some(pod.to_owned()), "{path}");
        }
        // `..` never climbs above the kubelet's root, nor back into the API server's path.
        assert_eq!(call("/api/v1/nodes/w/proxy/exec/ns/../../../c"), None);
        assert_eq!(kubelet_path(&["a", "..", "..", "b"], false), "/b");
        assert_eq!(kubelet_path(&["exec", "x", ""], true), "/exec/x/");
        assert_eq!(kubelet_path(&[], true), "");
    }

    #[test]
    fn run_reads_a_form_body_first() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            run_command(&q(&[("cmd", "ls  -l")]), None),
            ["ls", "", "-l"]
        );
        assert_eq!(
            run_command(&q(&[("cmd", "query")]), Some("x=1&cmd=id+-u&cmd=no")),
            ["id", "-u"]
        );
        assert_eq!(run_command(&q(&[("cmd", "query")]), Some("x=1")), ["query"]);
        assert_eq!(run_command(&[], None), [""]);
        assert!(kubelet_flag(&q(&[("tty", "1"), ("tty", "0")]), "tty"));
        assert!(!kubelet_flag(&q(&[("tty", "true")]), "tty"));
        assert_eq!(
            form_media_type(" Application/X-WWW-Form-Urlencoded ; charset=utf-8"),
            Some(FormBody::UrlEncoded)
        );
        assert_eq!(
            form_media_type("multipart/form-data; boundary=x"),
            Some(FormBody::Multipart)
        );
        assert_eq!(form_media_type("application/json"), None);
    }
}
