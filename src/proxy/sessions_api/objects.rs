//! The sessions API's objects as JSON, shaped as Kubernetes objects are (`kind`,
//! `apiVersion`, `metadata`, `spec`, `status`), so that `kubectl get --raw` and any client that
//! reads Kubernetes lists read them too.

use serde::Serialize;

use crate::audit::{HttpVersion, ProtocolPath, Verb};
use crate::proxy::route::sessions_api::{GROUP, RESOURCE, VERSION};
use crate::proxy::sessions::registry::live::LiveSession;

/// `kube-ws-proxy.io/v1`.
fn api_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// One live session.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Session<'a> {
    kind: &'static str,
    api_version: String,
    metadata: Metadata<'a>,
    spec: Spec<'a>,
    status: SessionStatus<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    /// The session id (`<replica>-<n>`), as its audit events and recording name it.
    name: &'a str,
    namespace: &'a str,
    creation_timestamp: String,
}

/// Who runs what where, as the session's audit `started` event says it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<&'a str>,
    /// `None`: not known (passthrough without the audit log reviews nobody).
    user: Option<&'a str>,
    groups: &'a [String],
    verb: Verb,
    pod: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    command: &'a [String],
    tty: bool,
    stdin: bool,
    #[serde(skip_serializing_if = "<[u16]>::is_empty")]
    ports: &'a [u16],
    client_address: &'a str,
    protocol_path: ProtocolPath,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<String>,
    http_version: HttpVersion,
}

/// How it is doing, read from its traffic counter when the object is made.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionStatus<'a> {
    started: String,
    /// Bytes from the client towards the pod so far (payload for a translated exec or
    /// attach, the stream as it is for tunnels and relays, as the `ended` audit event counts).
    bytes_from_client: u64,
    /// Bytes from the pod towards the client so far.
    bytes_to_client: u64,
    /// When it last carried a byte either way (its start if it never did), to the second.
    last_activity: String,
    /// Whole seconds since then.
    idle_seconds: u64,
    /// Whether it is recorded, and where (`--record-dir` on its replica).
    recorded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    recording: Option<&'a str>,
    /// The replica (process) serving it: the first part of its name.
    replica: &'static str,
    /// An operator terminated it; it is ending.
    #[serde(skip_serializing_if = "Option::is_none")]
    terminated_by: Option<&'a str>,
}

impl<'a> Session<'a> {
    /// `live` as the API shows it.
    pub fn of(live: &'a LiveSession) -> Session<'a> {
        let info = &live.info;
        let traffic = &live.traffic;
        let started = crate::timestamp::rfc3339(traffic.started());
        let (protocol_path, protocol) = live.path();
        Session {
            kind: "Session",
            api_version: api_version(),
            metadata: Metadata {
                name: &info.session_id,
                namespace: &info.namespace,
                creation_timestamp: started.clone(),
            },
            spec: Spec {
                cluster: info.cluster.as_deref(),
                user: info.user.as_deref(),
                groups: &info.groups,
                verb: info.verb,
                pod: &info.pod,
                container: info.container.as_deref(),
                node: info.node.as_deref(),
                command: &info.command,
                tty: info.tty,
                stdin: info.stdin,
                ports: &info.ports,
                client_address: &info.client_address,
                protocol_path,
                protocol,
                http_version: info.http_version,
            },
            status: SessionStatus {
                started,
                bytes_from_client: traffic.bytes_from_client(),
                bytes_to_client: traffic.bytes_to_client(),
                last_activity: crate::timestamp::rfc3339(traffic.last_activity()),
                idle_seconds: traffic.idle_seconds(),
                recorded: info.recording.is_some(),
                recording: info.recording.as_deref(),
                replica: crate::audit::instance::instance_id(),
                terminated_by: live.stop.termination().map(|t| t.by.as_str()),
            },
        }
    }
}

/// Live sessions.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionList<'a> {
    kind: &'static str,
    api_version: String,
    metadata: ListMetadata,
    items: Vec<Session<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ListMetadata {
    resource_version: String,
}

impl<'a> SessionList<'a> {
    /// `sessions` as a list at `version`.
    pub fn of(sessions: &'a [std::sync::Arc<LiveSession>], version: u64) -> SessionList<'a> {
        SessionList {
            kind: "SessionList",
            api_version: api_version(),
            metadata: ListMetadata {
                resource_version: version.to_string(),
            },
            items: sessions.iter().map(|s| Session::of(s)).collect(),
        }
    }
}

/// The group as discovery shows it (`GET /apis/kube-ws-proxy.io`).
pub fn api_group() -> serde_json::Value {
    let version = serde_json::json!({"groupVersion": api_version(), "version": VERSION});
    serde_json::json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    })
}

/// Its resources as discovery shows them (`GET /apis/kube-ws-proxy.io/v1`).
pub fn api_resources() -> serde_json::Value {
    serde_json::json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version(),
        "resources": [{
            "name": RESOURCE,
            "singularName": "session",
            "namespaced": true,
            "kind": "Session",
            "verbs": ["delete", "get", "list", "watch"],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session_stop::{SessionStop, Termination};

    use crate::session_traffic::SessionTraffic;
    use std::sync::Arc;
    use std::time::{Duration, Instant, UNIX_EPOCH};

    /// A session that started at the epoch, 90 s ago on the monotonic clock.
    fn live() -> LiveSession {
        let mut info = crate::audit::event::tests::info();
        info.session_id = "abcd-7".into();
        info.namespace = "team-a".into();
        info.recording = Some("/rec/x.cast".into());
        let started = Instant::now() - Duration::from_secs(90);
        let traffic = Arc::new(SessionTraffic::started_at(started, UNIX_EPOCH));
        LiveSession::new(7, Arc::new(info), traffic, SessionStop::default())
    }

    #[test]
    fn a_session_reads_as_a_kubernetes_object() {
        let s = live();
        let v = serde_json::to_value(Session::of(&s)).unwrap();
        assert_eq!(v["kind"], "Session");
        assert_eq!(v["apiVersion"], "kube-ws-proxy.io/v1");
        assert_eq!(v["metadata"]["name"], "abcd-7");
        assert_eq!(v["metadata"]["namespace"], "team-a");
        assert_eq!(v["metadata"]["creationTimestamp"], "1970-01-01T00:00:00Z");
        assert_eq!(v["status"]["started"], "1970-01-01T00:00:00Z");
        assert_eq!(v["status"]["recorded"], true);
        assert_eq!(v["status"]["recording"], "/rec/x.cast");
        assert!(v["status"].get("terminatedBy").is_none());
        assert!(v["spec"]["protocolPath"].is_string(), "{v}");
        s.stop.terminate(Termination {
            by: "alice".into(),
            reason: String::new(),
        });
        let v = serde_json::to_value(Session::of(&s)).unwrap();
        assert_eq!(v["status"]["terminatedBy"], "alice");
    }

    #[test]
    fn its_status_shows_its_traffic_and_how_long_it_has_been_idle() {
        let s = live();
        let v = serde_json::to_value(Session::of(&s)).unwrap();
        let status = &v["status"];
        assert_eq!(
            (&status["bytesFromClient"], &status["bytesToClient"]),
            (&0.into(), &0.into())
        );
        assert_eq!(status["lastActivity"], "1970-01-01T00:00:00Z");
        assert!(status["idleSeconds"].as_u64().unwrap() >= 90, "{v}");
        assert_eq!(status["replica"], crate::audit::instance::instance_id());
        s.traffic.from_client(12);
        s.traffic.to_client(34);
        let v = serde_json::to_value(Session::of(&s)).unwrap();
        let status = &v["status"];
        assert_eq!(status["bytesFromClient"], 12);
        assert_eq!(status["bytesToClient"], 34);
        assert!(status["idleSeconds"].as_u64().unwrap() < 90, "{v}");
        let last = status["lastActivity"].as_str().unwrap();
        assert!(last >= "1970-01-01T00:01:30Z", "{last}");
    }

    #[test]
    fn a_list_has_its_version_and_items() {
        let s = std::sync::Arc::new(live());
        let v = serde_json::to_value(SessionList::of(&[s.clone(), s], 42)).unwrap();
        assert_eq!(v["kind"], "SessionList");
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["items"].as_array().unwrap().len(), 2);
    }
}
