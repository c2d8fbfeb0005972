//! Which pod and streaming subresource a decoded request path addresses.

/// The streaming subresources of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Exec,
    Attach,
    PortForward,
    Log,
}

impl Subresource {
    /// The path segment that names it.
    pub fn segment(self) -> &'static str {
        match self {
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
            Subresource::Log => "log",
        }
    }

    fn from_segment(segment: &str) -> Option<Subresource> {
        [
            Subresource::Exec,
            Subresource::Attach,
            Subresource::PortForward,
            Subresource::Log,
        ]
        .into_iter()
        .find(|s| s.segment() == segment)
    }
}

/// A pod subresource addressed by an API path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTarget {
    pub namespace: String,
    pub pod: String,
    pub subresource: Subresource,
}

/// Reads `/api/v1/namespaces/{ns}/pods/{pod}/{exec|attach|portforward|log}` from a *decoded*
/// path ([`RequestTarget::path`](super::target::RequestTarget::path)). A prefix before `/api/`
/// is allowed (API servers mounted below a path), and so are trailing slashes: the API server's
/// request info trims them, and reading too many paths as streaming ones only audits more.
pub fn parse_pod_subresource(path: &str) -> Option<PodTarget> {
    let (namespace, pod, subresource) = pod_subresource_parts(path)?;
    Some(PodTarget {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        subresource,
    })
}

/// Which streaming subresource a decoded path addresses, read as [`parse_pod_subresource`]
/// reads it, without copying the names (the classifier asks this of every upgrade).
pub fn pod_subresource(path: &str) -> Option<Subresource> {
    pod_subresource_parts(path).map(|(_, _, subresource)| subresource)
}

/// The namespace, pod and subresource of a decoded path, borrowed from it.
fn pod_subresource_parts(path: &str) -> Option<(&str, &str, Subresource)> {
    let start = path.find("/api/v1/namespaces/")?;
    let rest = path[start + "/api/v1/namespaces/".len()..].trim_end_matches('/');
    let mut parts = rest.split('/');
    let namespace = parts.next().filter(|s| !s.is_empty())?;
    if parts.next()? != "pods" {
        return None;
    }
    let pod = parts.next().filter(|s| !s.is_empty())?;
    let subresource = Subresource::from_segment(parts.next()?)?;
    if parts.next().is_some() {
        return None;
    }
    Some((namespace, pod, subresource))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            parse_pod_subresource("//api/v1/namespaces/a/pods/b/attach//")
                .unwrap()
                .subresource,
            Subresource::Attach
        );
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/pods/web").is_none());
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/services/web/exec").is_none());
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/pods/web/exec/extra").is_none());
        assert!(parse_pod_subresource("/api/v1/namespaces/ns/pods/exec").is_none());
    }
}
