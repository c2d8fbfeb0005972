//! Kubelet calls through `nodes/{node}/proxy` (the kubelet's own API: exec, attach,
//! portForward, run): which request is one, and what the proxy does with them
//! (`--node-proxy-sessions`). Exec, attach and portForward are relayed streaming sessions
//! ([`StreamTarget`] names their node); `run` is a plain POST that runs a command to its end
//! ([`KubeletRun`]).

use super::stream_request::StreamTarget;
use crate::request::node::{parse_kubelet_call, run_command, KubeletCall, KubeletTarget};
use crate::request::pod::{pod_subresource, PodTarget, Subresource};
use crate::request::target::RequestTarget;
use crate::translate::exec_options::ExecOptions;

/// What the proxy does with a kubelet session through `nodes/{node}/proxy`
/// (`--node-proxy-sessions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeProxySessions {
    /// Refuse them (403) before anything goes upstream.
    #[default]
    Refuse,
    /// Serve them as the sessions they are: audited with the node named, recorded.
    Audit,
}

/// The kubelet call `method` on `target` reaches through `nodes/{node}/proxy`, unless the path
/// reads as a pod's subresource first (the reading whose `/api/v1/...` starts first wins).
pub fn kubelet_call(method: &http::Method, target: &RequestTarget) -> Option<KubeletTarget> {
    let path = target.path();
    let node_at = crate::request::node::node_proxy_start(path)?;
    let pod_at = path.find("/api/v1/namespaces/");
    if pod_at.is_some_and(|p| p < node_at) && pod_subresource(path).is_some() {
        return None;
    }
    parse_kubelet_call(method, path)
}

/// A kubelet `run` through `nodes/{node}/proxy`: a plain POST that runs a command to its end,
/// its output the response's body; audited as a session (`verb: run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletRun {
    pub call: KubeletTarget,
    /// The command, as the kubelet splits its `cmd`.
    pub command: Vec<String>,
}

impl KubeletRun {
    /// What its audit events and recording name: the pod, the container, the command and the
    /// node.
    pub fn target(&self) -> StreamTarget {
        StreamTarget {
            pod: Some(PodTarget {
                namespace: self.call.namespace.clone(),
                pod: self.call.pod.clone(),
                // Read as an exec (a command in a container) wherever a subresource matters.
                subresource: Subresource::Exec,
            }),
            node: Some(self.call.node.clone()),
            options: ExecOptions {
                container: self.call.container.clone(),
                command: self.command.clone(),
                stdout: true,
                ..ExecOptions::default()
            },
            ports: Vec::new(),
        }
    }

    /// The `run` a request is, if it is one: its command read as the kubelet reads `cmd` (a
    /// form-encoded `form_body` first).
    pub fn read(
        method: &http::Method,
        target: &RequestTarget,
        form_body: Option<&str>,
    ) -> Option<KubeletRun> {
        let call = kubelet_call(method, target).filter(|c| c.call == KubeletCall::Run)?;
        Some(KubeletRun {
            command: run_command(target.query(), form_body),
            call,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(pq: &str) -> RequestTarget {
        RequestTarget::parse_path_and_query(pq).unwrap()
    }

    #[test]
    fn a_pods_own_path_is_read_before_a_kubelet_path_inside_it() {
        let get = http::Method::GET;
        assert!(kubelet_call(&get, &target("/api/v1/nodes/w/proxy/exec/ns/p/c")).is_some());
        // A pod subresource whose name happens to hold the node path is that pod's.
        let inner = "/api/v1/namespaces/ns/pods/p/exec/api/v1/nodes/w/proxy/exec/ns/p/c";
        assert!(kubelet_call(&get, &target(inner)).is_none());
    }

    #[test]
    fn a_run_reads_its_command_as_the_kubelet_does() {
        let post = http::Method::POST;
        let t = target("/api/v1/nodes/w/proxy/run/ns/p/uid/c?cmd=from+query");
        let run = KubeletRun::read(&post, &t, Some("cmd=echo+a++b")).unwrap();
        assert_eq!(run.command, ["echo", "a", "", "b"]);
        assert_eq!(run.call.uid.as_deref(), Some("uid"));
        assert_eq!(
            KubeletRun::read(&post, &t, None).unwrap().command,
            ["from", "query"]
        );
        assert!(KubeletRun::read(&http::Method::GET, &t, None).is_none());
        let exec = target("/api/v1/nodes/w/proxy/exec/ns/p/c");
        assert!(KubeletRun::read(&post, &exec, None).is_none());
        let audited = run.target();
        assert_eq!(audited.node.as_deref(), Some("w"));
        assert_eq!(audited.options.container.as_deref(), Some("c"));
    }
}
