//! A streaming request read once: what it asks for (pod, subresource, exec options, ports) and
//! who asks and how (caller, client connection and handshake form, audit id). The front door
//! (src/proxy/listen/server.rs) builds it from the one reading of the request target
//! ([`RequestTarget`]) and hands it to the session; nothing downstream re-reads the path or
//! the query. What goes upstream is still the request's canonical URI.

use std::net::SocketAddr;

use super::kubelet::kubelet_call;
use crate::audit::bounds::log_field;
use crate::proxy::auth::Caller;
use crate::proxy::wire::client_stream::ClientStream;
use crate::request::go_url::slice_to_bool;
use crate::request::node::{kubelet_flag, KubeletCall, KubeletTarget};
use crate::request::pod::{parse_pod_subresource, pod_subresource, PodTarget, Subresource};
use crate::request::target::RequestTarget;
use crate::translate::exec_options::ExecOptions;

/// What a request names, as the API server reads it: the pod subresource and its options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamTarget {
    /// The pod and streaming subresource; `None` for a path that is not one (an upgrade
    /// relayed as it is, unaudited).
    pub pod: Option<PodTarget>,
    /// The node whose kubelet a `nodes/{node}/proxy` request reaches (its exec, attach or
    /// portForward: `pod` names the pod), `None` for a pod's subresource.
    pub node: Option<String>,
    /// The exec/attach options (a log's `container` among them).
    pub options: ExecOptions,
    /// The ports a port-forward names (`ports=8080&ports=9090` or `ports=8080,9090`; the
    /// kubelet's `port=8080`).
    pub ports: Vec<u16>,
}

impl StreamTarget {
    /// Reads `target`'s pod subresource (or kubelet call, for `method`), options and ports.
    pub fn read(method: &http::Method, target: &RequestTarget) -> StreamTarget {
        if let Some(kubelet) = kubelet_call(method, target) {
            return StreamTarget::kubelet(kubelet, target);
        }
        let Some(pod) = parse_pod_subresource(target.path()) else {
            return StreamTarget::default();
        };
        // Every option is read whatever the subresource: the audit names a log's container too.
        let options = ExecOptions::from_target(target);
        let ports = ports(target);
        StreamTarget {
            pod: Some(pod),
            node: None,
            options,
            ports,
        }
    }

    /// A kubelet's exec, attach or portForward, with its options as the kubelet reads them
    /// (`run` is no streaming session: [`KubeletRun`]).
    fn kubelet(call: KubeletTarget, target: &RequestTarget) -> StreamTarget {
        let subresource = match call.call {
            KubeletCall::Exec => Subresource::Exec,
            KubeletCall::Attach => Subresource::Attach,
            KubeletCall::PortForward => Subresource::PortForward,
            KubeletCall::Run => return StreamTarget::default(),
        };
        let query = target.query();
        let options = ExecOptions {
            stdin: kubelet_flag(query, "input"),
            stdout: kubelet_flag(query, "output"),
            stderr: kubelet_flag(query, "error"),
            tty: kubelet_flag(query, "tty"),
            container: call.container,
            command: target.all("command").map(str::to_owned).collect(),
        };
        StreamTarget {
            pod: Some(PodTarget {
                namespace: call.namespace,
                pod: call.pod,
                subresource,
            }),
            node: Some(call.node),
            options,
            ports: target.all("port").filter_map(|p| p.parse().ok()).collect(),
        }
    }

    /// The subresource named, if the path is a pod's streaming subresource.
    pub fn subresource(&self) -> Option<Subresource> {
        self.pod.as_ref().map(|p| p.subresource)
    }

    /// Whether it is an exec or an attach (a remote command: recorded, its exit code followed).
    pub fn is_remote_command(&self) -> bool {
        matches!(
            self.subresource(),
            Some(Subresource::Exec | Subresource::Attach)
        )
    }

    /// Exec, attach or port-forward of a pod: the requests `--upstream-streaming` decides on
    /// for SPDY clients; anything else (a kubelet's, through `nodes/{node}/proxy`, too) is
    /// always relayed.
    pub fn streaming_subresource(&self) -> Option<Subresource> {
        self.subresource().filter(|s| {
            self.node.is_none()
                && matches!(
                    s,
                    Subresource::Exec | Subresource::Attach | Subresource::PortForward
                )
        })
    }

    /// The title of its recording: `ns/pod`, with the container when one is named and the
    /// node when the kubelet was reached directly (empty for a path that is no pod's); each
    /// name bounded as log fields are.
    pub fn recording_title(&self) -> String {
        let Some(t) = &self.pod else {
            return String::new();
        };
        let mut title = format!("{}/{}", log_field(&t.namespace), log_field(&t.pod));
        if let Some(c) = &self.options.container {
            title.push_str(&format!(" ({})", log_field(c)));
        }
        if let Some(node) = &self.node {
            title.push_str(&format!(" on node {}", log_field(node)));
        }
        title
    }

    /// The namespace, or `""` (log fields: bounded).
    pub fn namespace(&self) -> &str {
        log_field(self.pod.as_ref().map_or("", |p| p.namespace.as_str()))
    }

    /// The pod's name, or `""` (log fields: bounded).
    pub fn pod_name(&self) -> &str {
        log_field(self.pod.as_ref().map_or("", |p| p.pod.as_str()))
    }

    /// The container named, or `""` (log fields: bounded).
    pub fn container(&self) -> &str {
        log_field(self.options.container.as_deref().unwrap_or(""))
    }
}

/// One streaming request as every session handler takes it: read once by the front door.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// What it names.
    pub target: StreamTarget,
    /// Who asks (authenticated as `--auth-mode` says).
    pub caller: Caller,
    /// The client's address.
    pub peer: SocketAddr,
    /// The client connection and its handshake form (HTTP/1.1 upgrade or HTTP/2 CONNECT).
    pub client: ClientStream,
    /// The request's `Audit-ID`.
    pub audit_id: Option<String>,
}

/// Whether a plain request is a followed pod log (`kubectl logs -f`): a streaming session over
/// plain HTTP, audited like the others. `follow` is read as the API server reads it: its first
/// value, true unless `0` or `false`.
pub fn is_followed_log(method: &http::Method, target: &RequestTarget) -> bool {
    method == http::Method::GET
        && pod_subresource(target.path()) == Some(Subresource::Log)
        && slice_to_bool(target.first("follow"))
}

/// The ports a port-forward request names.
fn ports(target: &RequestTarget) -> Vec<u16> {
    target
        .all("ports")
        .flat_map(|v| v.split(','))
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pq: &str) -> StreamTarget {
        StreamTarget::read(
            &http::Method::GET,
            &RequestTarget::parse_path_and_query(pq).unwrap(),
        )
    }

    #[test]
    fn exec_requests_name_pod_container_and_command() {
        let t = read("/api/v1/namespaces/team/pods/web/%65xec?command=tar&command=cf&command=-&container=main&container=x&stdin=true&tty=false");
        let pod = t.pod.as_ref().unwrap();
        assert_eq!((pod.namespace.as_str(), pod.pod.as_str()), ("team", "web"));
        assert_eq!(t.subresource(), Some(Subresource::Exec));
        assert_eq!(t.options.container.as_deref(), Some("main"));
        assert_eq!(t.options.command, ["tar", "cf", "-"]);
        assert!(t.options.stdin && !t.options.tty);
        assert!(t.is_remote_command());
        assert_eq!(t.recording_title(), "team/web (main)");
    }

    #[test]
    fn port_forward_ports_and_other_paths() {
        let t = read("/api/v1/namespaces/default/pods/db/portforward?ports=5432&ports=8080,9090");
        assert_eq!(t.ports, [5432, 8080, 9090]);
        assert_eq!(t.streaming_subresource(), Some(Subresource::PortForward));
        assert!(!t.is_remote_command());
        let log = read("/api/v1/namespaces/default/pods/db/log?follow=true");
        assert_eq!(log.subresource(), Some(Subresource::Log));
        assert_eq!(log.streaming_subresource(), None);
        let other = read("/api/v1/namespaces/default/services/x/proxy?command=id");
        assert_eq!(other, StreamTarget::default());
        assert_eq!(other.recording_title(), "");
    }

    #[test]
    fn kubelet_sessions_name_their_node_and_read_the_kubelets_options() {
        let t = read("/api/v1/nodes/https:w-1:10250/proxy/exec/team/web/uid/main?command=id&command=-u&input=1&output=1&error=true&tty=1&stdin=1");
        assert_eq!(t.node.as_deref(), Some("w-1"));
        let pod = t.pod.as_ref().unwrap();
        assert_eq!((pod.namespace.as_str(), pod.pod.as_str()), ("team", "web"));
        assert_eq!(t.subresource(), Some(Subresource::Exec));
        assert_eq!(t.options.container.as_deref(), Some("main"));
        assert_eq!(t.options.command, ["id", "-u"]);
        // The kubelet's names, each on only when `1`.
        assert!(t.options.stdin && t.options.stdout && !t.options.stderr && t.options.tty);
        assert!(t.is_remote_command());
        // Always relayed: never translated or reverse-translated.
        assert_eq!(t.streaming_subresource(), None);
        assert_eq!(t.recording_title(), "team/web (main) on node w-1");
        let pf = read("/api/v1/nodes/w/proxy/portForward/ns/db?port=5432&port=x&ports=1");
        assert_eq!(pf.subresource(), Some(Subresource::PortForward));
        assert_eq!(pf.ports, [5432]);
        // `run` is no streaming session; other node proxy paths are none either.
        assert_eq!(
            read("/api/v1/nodes/w/proxy/run/ns/p/c?cmd=id"),
            StreamTarget::default()
        );
        assert_eq!(
            read("/api/v1/nodes/w/proxy/metrics"),
            StreamTarget::default()
        );
    }

    #[test]
    fn log_fields_and_titles_are_bounded() {
        let long = "p".repeat(1000);
        let t = read(&format!(
            "/api/v1/namespaces/ns/pods/{long}/exec?container={long}"
        ));
        assert_eq!(t.pod_name().len(), 256);
        assert_eq!(t.container().len(), 256);
        assert_eq!(
            t.recording_title().len(),
            "ns/".len() + 256 + " ()".len() + 256
        );
    }

    #[test]
    fn followed_logs_are_told_apart() {
        let get = http::Method::GET;
        let target = |pq: &str| RequestTarget::parse_path_and_query(pq).unwrap();
        let follows = |pq: &str| is_followed_log(&get, &target(pq));
        assert!(follows("/api/v1/namespaces/a/pods/p/log?follow=true"));
        assert!(follows(
            "/api/v1/namespaces/a/pods/p/log?container=c&follow=1"
        ));
        assert!(!follows("/api/v1/namespaces/a/pods/p/log"));
        assert!(!follows("/api/v1/namespaces/a/pods/p/log?follow=false"));
        assert!(!follows("/api/v1/namespaces/a/pods?follow=true"));
        // As the API server reads `follow`: the first value, true unless 0 or false.
        assert!(follows("/api/v1/namespaces/a/pods/p/log?follow=yes"));
        assert!(follows(
            "/api/v1/namespaces/a/pods/p/%6Cog?follow=&follow=false"
        ));
        assert!(!follows(
            "/api/v1/namespaces/a/pods/p/log?follow=0&follow=true"
        ));
        assert!(!follows("/api/v1/namespaces/a/pods/p/log?follow=true;x"));
        assert!(!is_followed_log(
            &http::Method::POST,
            &target("/api/v1/namespaces/a/pods/p/log?follow=true")
        ));
    }

    /// The sessions take the request as the front door read it: none of them reads the path
    /// or the query again.
    #[test]
    fn no_session_reads_the_request_target_again() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy/sessions");
        let forbidden = [
            "parse_pod_subresource",
            "pod_subresource",
            "ExecOptions::from_query",
            "ExecOptions::from_target",
            "RequestTarget::parse",
            "parse_query",
        ];
        // Every file of the room, its inner rooms' too.
        let mut files = Vec::new();
        crate::layering::rust_files(&dir, &mut files);
        assert!(files.len() > 20, "the sessions' files: {files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            // Test code may build requests any way it likes.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                for name in forbidden {
                    assert!(
                        !line.contains(name),
                        "{}:{}: `{name}`: sessions take the StreamRequest the front door read",
                        path.display(),
                        n + 1
                    );
                }
            }
        }
    }
}
