//! Exec/attach options from the client's query (PROTOCOL.md §1.1) and the SPDY streams they
//! call for (§3.5).

use super::channel::Channel;
use super::protocol::UpstreamVersion;

/// The `streamtype` of an SPDY stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
    /// Port-forward data.
    Data,
}

impl StreamKind {
    /// The header value on the wire.
    pub fn wire_name(self) -> &'static str {
        match self {
            StreamKind::Error => "error",
            StreamKind::Stdin => "stdin",
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
            StreamKind::Resize => "resize",
            StreamKind::Data => "data",
        }
    }

    /// The kind for a header value.
    pub fn from_wire(name: &str) -> Option<StreamKind> {
        [
            StreamKind::Error,
            StreamKind::Stdin,
            StreamKind::Stdout,
            StreamKind::Stderr,
            StreamKind::Resize,
            StreamKind::Data,
        ]
        .into_iter()
        .find(|k| k.wire_name() == name)
    }
}

/// What an exec or attach asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    pub container: Option<String>,
    pub command: Vec<String>,
}

/// Go's query-boolean rule: absent, `0` or `false` (any case) is false; anything else true.
fn query_bool(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

impl ExecOptions {
    /// Parses the query string (without `?`).
    pub fn from_query(query: &str) -> ExecOptions {
        let mut o = ExecOptions::default();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "stdin" => o.stdin = query_bool(&value),
                "stdout" => o.stdout = query_bool(&value),
                "stderr" => o.stderr = query_bool(&value),
                "tty" => o.tty = query_bool(&value),
                "container" => o.container = Some(value.into_owned()),
                "command" => o.command.push(value.into_owned()),
                _ => {}
            }
        }
        o
    }

    /// The streams to open upstream, in the order kubelets expect: error; stdin; stdout;
    /// stderr unless tty; resize if tty and the version has one.
    pub fn upstream_streams(&self, version: UpstreamVersion) -> Vec<StreamKind> {
        let mut kinds = vec![StreamKind::Error];
        if self.stdin {
            kinds.push(StreamKind::Stdin);
        }
        if self.stdout {
            kinds.push(StreamKind::Stdout);
        }
        if self.stderr && !self.tty {
            kinds.push(StreamKind::Stderr);
        }
        if self.tty && version.has_resize_stream() {
            kinds.push(StreamKind::Resize);
        }
        kinds
    }

    /// The channel of the empty "ready" message: the lowest writable one.
    pub fn ready_channel(&self) -> Channel {
        if self.stdout {
            Channel::Stdout
        } else if self.stderr {
            Channel::Stderr
        } else {
            Channel::Error
        }
    }
}

/// The streaming subresources of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Exec,
    Attach,
    PortForward,
    Log,
}

/// A pod subresource addressed by an API path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTarget {
    pub namespace: String,
    pub pod: String,
    pub subresource: Subresource,
}

/// Parses `/api/v1/namespaces/{ns}/pods/{pod}/{exec|attach|portforward|log}`. A prefix before
/// `/api/` is allowed, for API servers mounted below a path.
pub fn parse_pod_subresource(path: &str) -> Option<PodTarget> {
    let start = path.find("/api/v1/namespaces/")?;
    let rest = &path[start + "/api/v1/namespaces/".len()..];
    let mut parts = rest.split('/');
    let namespace = parts.next().filter(|s| !s.is_empty())?;
    if parts.next()? != "pods" {
        return None;
    }
    let pod = parts.next().filter(|s| !s.is_empty())?;
    let subresource = match parts.next()? {
        "exec" => Subresource::Exec,
        "attach" => Subresource::Attach,
        "portforward" => Subresource::PortForward,
        "log" => Subresource::Log,
        _ => return None,
    };
    if parts.next().is_some_and(|s| !s.is_empty()) {
        return None;
    }
    Some(PodTarget {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        subresource,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_booleans_follow_go() {
        let o = ExecOptions::from_query(
            "command=sh&command=-c&command=echo%20hi&stdin=1&stdout=true&stderr=FALSE&tty=&container=main",
        );
        assert!(o.stdin && o.stdout && !o.stderr && o.tty);
        assert_eq!(o.command, ["sh", "-c", "echo hi"]);
        assert_eq!(o.container.as_deref(), Some("main"));
        let o = ExecOptions::from_query("stdout=0");
        assert!(!o.stdout);
    }

    #[test]
    fn stream_order() {
        let o = ExecOptions::from_query("stdin=true&stdout=true&stderr=true");
        assert_eq!(
            o.upstream_streams(UpstreamVersion::V4),
            [
                StreamKind::Error,
                StreamKind::Stdin,
                StreamKind::Stdout,
                StreamKind::Stderr
            ]
        );
        let tty = ExecOptions::from_query("stdin=true&stdout=true&stderr=true&tty=true");
        assert_eq!(
            tty.upstream_streams(UpstreamVersion::V4),
            [
                StreamKind::Error,
                StreamKind::Stdin,
                StreamKind::Stdout,
                StreamKind::Resize
            ]
        );
        assert_eq!(
            tty.upstream_streams(UpstreamVersion::V2),
            [StreamKind::Error, StreamKind::Stdin, StreamKind::Stdout]
        );
    }

    #[test]
    fn ready_channel() {
        assert_eq!(
            ExecOptions::from_query("stdout=1").ready_channel(),
            Channel::Stdout
        );
        assert_eq!(
            ExecOptions::from_query("stderr=1").ready_channel(),
            Channel::Stderr
        );
        assert_eq!(
            ExecOptions::from_query("stdin=1").ready_channel(),
            Channel::Error
        );
    }

    #[test]
    fn paths() {
        let t = parse_pod_subresource("/api/v1/namespaces/ns/pods/web/exec").unwrap();
        assert_eq!(
            (t.namespace.as_str(), t.pod.as_str(), t.subresource),
            ("ns", "web", Subresource::Exec)
        );
        assert_eq!(
            parse_pod_subresource("/k8s/api/v1/namespaces/a/pods/b/portforward")
                .unwrap()
                .subresource,
            Subresource::PortForward
        );
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/pods/web").is_none());
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/services/web/exec").is_none());
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/pods/web/exec/extra").is_none());
    }
}
