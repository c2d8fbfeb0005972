//! What an audit event says. Every field is always present (null or empty when not known),
//! so that consumers can rely on one schema.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::bounds::Truncations;
use super::port_forward::{ForwardedConnection, PortForwardReport};

/// The streaming subresource a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    Exec,
    Attach,
    PortForward,
    Log,
    /// The kubelet's `run` (`nodes/{node}/proxy/run/...`): a command run to its end, its
    /// output the response's body.
    Run,
}

/// How a session goes through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtocolPath {
    /// v5 WebSocket from the client, SPDY upstream.
    Translated,
    /// The port-forward tunnel: SPDY inside WebSocket messages.
    Tunnel,
    /// SPDY relayed byte for byte (kubectl ≤ 1.30, kubectl's fallback).
    RelaySpdy,
    /// A legacy WebSocket protocol relayed byte for byte (v1–v4, base64, logs, port-forward).
    RelayWebsocket,
    /// A plain streaming request (`kubectl logs -f`).
    Http,
    /// SPDY from the client (kubectl ≤ 1.30), a WebSocket upstream: exec/attach translated to
    /// `v5.channel.k8s.io`, port-forward carried in the `SPDY/3.1+portforward.k8s.io` tunnel.
    ReverseTranslated,
    /// v5 exec/attach or the port-forward tunnel passed to an upstream that serves them
    /// itself, unchanged (`--upstream-streaming`).
    PassThrough,
    /// Not decided yet: under `--upstream-streaming auto` the upstream's answers decide the
    /// path of an exec, attach or port-forward, and its audit trail starts before the upstream
    /// is asked. Only a `started` event says it; the `ended` event names the path taken.
    Auto,
}

/// Where the event's user and groups come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// The proxy authenticated the caller (impersonate and front-proxy modes).
    Authenticated,
    /// Passthrough: the upstream said who the caller's credentials are (a SelfSubjectReview
    /// made with them).
    SelfSubjectReview,
    /// Passthrough without credentials, or a cluster that could not say.
    Unknown,
}

/// Whom the caller asked to act as with its own `Impersonate-*` headers (`kubectl --as`), in
/// passthrough and front-proxy modes where they go upstream as sent; what kube-apiserver's
/// audit event calls `impersonatedUser`. The API server decides whether it is allowed: a
/// session it refused says so in its `ended` event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImpersonatedUser {
    /// `Impersonate-User`; `None` when groups or extras came without it.
    pub user: Option<String>,
    /// `Impersonate-Uid`.
    pub uid: Option<String>,
    /// Each `Impersonate-Group`.
    pub groups: Vec<String>,
    /// `Impersonate-Extra-<key>`, by key.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The HTTP version of the client's request that opened a session: an HTTP/1.1 upgrade, or
/// an HTTP/2 extended CONNECT (RFC 8441) that makes the session one stream of a shared
/// connection. A followed log says its plain request's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HttpVersion {
    #[serde(rename = "HTTP/1.0")]
    Http10,
    #[serde(rename = "HTTP/1.1")]
    Http11,
    #[serde(rename = "HTTP/2")]
    Http2,
}

impl From<http::Version> for HttpVersion {
    /// The listeners serve HTTP/1.0, HTTP/1.1 and HTTP/2 only; the others cannot reach here.
    fn from(version: http::Version) -> HttpVersion {
        match version {
            http::Version::HTTP_2 => HttpVersion::Http2,
            http::Version::HTTP_09 | http::Version::HTTP_10 => HttpVersion::Http10,
            _ => HttpVersion::Http11,
        }
    }
}

/// What is known of a session when it starts.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    /// Unique across replicas and restarts: `<instance>-<n>`.
    pub session_id: String,
    /// The named cluster the session went to (`/clusters/NAME/`); absent for the unnamed
    /// upstream of `--upstream`, `--kubeconfig` or `--in-cluster`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub verb: Verb,
    pub namespace: String,
    pub pod: String,
    pub container: Option<String>,
    /// The node whose kubelet the session reaches through `nodes/{node}/proxy` (the
    /// kubelet's own API); `None` for a pod's subresource, which the API server sends on.
    pub node: Option<String>,
    /// The command of an exec (`cp` is an exec of `tar`); empty otherwise.
    pub command: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
    /// The ports of a port-forward, as the request names them.
    pub ports: Vec<u16>,
    /// `None`: not known.
    pub user: Option<String>,
    pub groups: Vec<String>,
    pub identity_source: IdentitySource,
    /// Whom the caller asked to act as (`Impersonate-*`), if it asked: `user` and `groups`
    /// stay the caller's own.
    pub impersonated_user: Option<ImpersonatedUser>,
    /// The caller's address as the proxy saw it (`X-Forwarded-For` aside).
    pub client_address: String,
    /// How the client came: `HTTP/1.1` (or `HTTP/1.0`), or `HTTP/2` for a session on one
    /// stream of an HTTP/2 connection.
    pub http_version: HttpVersion,
    pub protocol_path: ProtocolPath,
    /// The subprotocol the client got (`v5.channel.k8s.io`, `SPDY/3.1`, ...), once known.
    pub protocol: Option<String>,
    /// The session's recording (`--record`), if it has one.
    pub recording: Option<String>,
    /// The `Audit-ID` of the request that opened the session: the id the API server's own audit
    /// log has for it (the proxy sets one where the client did not).
    pub audit_id: Option<String>,
    /// The address the session is charged to if it is refused (`X-Forwarded-For`'s, when
    /// trusted): the audit log's refusal budget ([`RefusalBudget`](super::refusals::RefusalBudget)).
    /// Not written.
    #[serde(skip)]
    pub charged_to: Option<IpAddr>,
}

/// How a session ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionEnd {
    /// Bytes from the client towards the pod (payload for exec/attach, raw for tunnels and
    /// relays, as the session metrics count them).
    pub bytes_in: u64,
    /// Bytes from the pod towards the client.
    pub bytes_out: u64,
    pub duration_ms: u64,
    /// The command's exit code, where the session carried one.
    pub exit_code: Option<i32>,
    /// The final Status the client got, in short (`Success`, `Failure: ...`), where known.
    pub status: Option<String>,
    /// The session metric's outcome label (`success`, `client_gone`, `idle_timeout`, ...).
    pub outcome: &'static str,
    /// Who or what ended it, in words (`completed`, `client unresponsive`, ...).
    pub ended_by: &'static str,
    /// Why the recording could not start or was cut short, if it was.
    pub recording_error: Option<String>,
    /// Its recording's cap (`--record-max-bytes`) cut it short: the cap, and the session bytes
    /// left out (`bytes_out`, and `bytes_in` with `--record-stdin`, say what flowed in all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recording_truncated: Option<crate::audit::recording::Truncation>,
    /// With `--record-upload`: the recording's object (`s3://BUCKET/KEY`) once stored before
    /// this event; `None` while its upload is pending (an `uploaded` event follows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recording_object: Option<String>,
    /// With `--record-upload`: `stored` or `pending`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recording_upload: Option<&'static str>,
    /// The operator who ended it through the sessions API, and the reason they gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminated_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<String>,
    /// A port-forward's connections (tunnel, relayed SPDY or legacy WebSocket), the first
    /// 1,000 in the order they were opened; empty for other sessions.
    pub connections: Vec<ForwardedConnection>,
    /// Connections opened after those listed, counted only.
    pub connections_omitted: u64,
    /// Why the connections could not be followed to the session's end, if they could not
    /// (those listed are then what was seen until then).
    pub connections_error: Option<String>,
    /// The ports the session was seen to forward. When set, the `ended` event's `ports` says
    /// these instead of the ones the request named (a tunnel's or SPDY relay's request names
    /// none).
    #[serde(skip)]
    pub ports_seen: Option<Vec<u16>>,
    /// The upstream's HTTP status when it refused the session (0 or `None`: no answer).
    #[serde(skip)]
    pub refused_with: Option<u16>,
}

/// What an `ended` event's `ended_by` says of a session the upstream would not open, or never
/// answered.
pub const UPSTREAM_REFUSED: &str = "upstream refused";

/// What an `ended` event's `ended_by` says of a session whose client's upgrade never completed.
pub const CLIENT_UPGRADE_FAILED: &str = "the client's upgrade did not complete";

/// What an `ended` event's `ended_by` says of a session whose client went away before the
/// upstream was asked.
pub const CLIENT_GONE_BEFORE_UPSTREAM: &str = "the client went away before the upstream was asked";

impl SessionEnd {
    /// Whether its caller's address pays for its events
    /// ([`RefusalBudget`](super::refusals::RefusalBudget)): the session never ran because the
    /// upstream would not let the caller in (401 or 403), or because the client left before
    /// it ran (it never completed its upgrade, or went away before the upstream was asked: a
    /// pair of events a client could otherwise write for free). A cluster that is down or
    /// failing (no answer, 5xx) charges nobody: an outage must not lock every client behind
    /// one address out once it is over.
    pub fn charges_caller(&self) -> bool {
        self.ended_by == CLIENT_UPGRADE_FAILED
            || self.ended_by == CLIENT_GONE_BEFORE_UPSTREAM
            || (self.ended_by == UPSTREAM_REFUSED && matches!(self.refused_with, Some(401 | 403)))
    }

    /// This end with what a port-forward's SPDY session was seen to carry.
    pub fn with_port_forwards(self, report: PortForwardReport) -> SessionEnd {
        SessionEnd {
            connections: report.connections,
            connections_omitted: report.omitted,
            connections_error: report.failure,
            ports_seen: Some(report.ports),
            ..self
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Serialize)]
pub(crate) struct Event<'a> {
    pub time: String,
    /// `started` or `ended`.
    pub stage: &'static str,
    #[serde(flatten)]
    pub info: &'a SessionInfo,
    #[serde(flatten)]
    pub end: Option<&'a SessionEnd>,
    /// The fields cut to their caps, with their original sizes; `null` when none was
    /// ([`bounds`](super::bounds)).
    pub truncated: Option<&'a Truncations>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn info() -> SessionInfo {
        SessionInfo {
            cluster: None,
            session_id: "0a1b2c3d-7".into(),
            verb: Verb::PortForward,
            namespace: "default".into(),
            pod: "web".into(),
            container: None,
            node: None,
            command: vec![],
            tty: false,
            stdin: false,
            ports: vec![8080, 9090],
            user: Some("alice".into()),
            groups: vec!["dev".into()],
            identity_source: IdentitySource::SelfSubjectReview,
            impersonated_user: None,
            client_address: "127.0.0.1:50000".into(),
            http_version: HttpVersion::Http2,
            protocol_path: ProtocolPath::Tunnel,
            protocol: Some("SPDY/3.1+portforward.k8s.io".into()),
            recording: None,
            audit_id: Some("5f0c6a52-1d2e-4c3b-9a8f-0e1d2c3b4a59".into()),
            charged_to: None,
        }
    }

    #[test]
    fn events_are_flat_json_with_every_field() {
        let info = info();
        let started = Event {
            time: "2026-11-25T01:02:03.456Z".into(),
            stage: "started",
            info: &info,
            end: None,
            truncated: None,
        };
        assert_eq!(
            serde_json::to_string(&started).unwrap(),
            r#"{"time":"2026-11-25T01:02:03.456Z","stage":"started","session_id":"0a1b2c3d-7","verb":"portforward","namespace":"default","pod":"web","container":null,"node":null,"command":[],"tty":false,"stdin":false,"ports":[8080,9090],"user":"alice","groups":["dev"],"identity_source":"self_subject_review","impersonated_user":null,"client_address":"127.0.0.1:50000","http_version":"HTTP/2","protocol_path":"tunnel","protocol":"SPDY/3.1+portforward.k8s.io","recording":null,"audit_id":"5f0c6a52-1d2e-4c3b-9a8f-0e1d2c3b4a59","truncated":null}"#
        );
        let end = SessionEnd {
            bytes_in: 10,
            bytes_out: 20,
            duration_ms: 30,
            exit_code: None,
            status: None,
            outcome: "success",
            ended_by: "upstream",
            recording_error: None,
            ..Default::default()
        };
        let ended = Event {
            time: "t".into(),
            stage: "ended",
            info: &info,
            end: Some(&end),
            truncated: None,
        };
        let v: serde_json::Value = serde_json::to_value(&ended).unwrap();
        assert_eq!(v["stage"], "ended");
        assert_eq!(v["bytes_in"], 10);
        assert_eq!(v["exit_code"], serde_json::Value::Null);
        assert_eq!(v["ended_by"], "upstream");
        assert_eq!(v["pod"], "web");
        // Present on every ended event, empty when nothing was forwarded or followed.
        assert_eq!(v["connections"], serde_json::json!([]));
        assert_eq!(v["connections_omitted"], 0);
        assert_eq!(v["connections_error"], serde_json::Value::Null);
        assert!(v.get("ports_seen").is_none());
    }

    #[test]
    fn http_versions_are_named_as_on_the_wire() {
        let named = |v: http::Version| serde_json::to_value(HttpVersion::from(v)).unwrap();
        assert_eq!(named(http::Version::HTTP_2), "HTTP/2");
        assert_eq!(named(http::Version::HTTP_11), "HTTP/1.1");
        assert_eq!(named(http::Version::HTTP_10), "HTTP/1.0");
        let mut info = info();
        info.http_version = HttpVersion::Http11;
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["http_version"], "HTTP/1.1");
    }

    #[test]
    fn port_forward_connections_are_listed_in_the_ended_event() {
        let info = info();
        let end = SessionEnd {
            outcome: "success",
            ended_by: "client",
            ..Default::default()
        }
        .with_port_forwards(PortForwardReport {
            ports: vec![5432],
            connections: vec![ForwardedConnection {
                port: Some(5432),
                request_id: "0".into(),
                bytes_in: 1200,
                bytes_out: 34_000,
                error: Some("connection refused".into()),
            }],
            omitted: 2,
            failure: None,
        });
        assert_eq!(end.ports_seen.as_deref(), Some(&[5432][..]));
        let ended = Event {
            time: "t".into(),
            stage: "ended",
            info: &info,
            end: Some(&end),
            truncated: None,
        };
        let v: serde_json::Value = serde_json::to_value(&ended).unwrap();
        assert_eq!(
            v["connections"],
            serde_json::json!([{
                "port": 5432,
                "request_id": "0",
                "bytes_in": 1200,
                "bytes_out": 34000,
                "error": "connection refused",
            }])
        );
        assert_eq!(v["connections_omitted"], 2);
        // `ports` stays a single key: the session's own (SessionAudit::end puts the seen
        // ones there).
        assert_eq!(v["ports"], serde_json::json!([8080, 9090]));
    }

    /// The caller's address pays for refusals of the caller and for sessions its client left
    /// before they ran, never for a cluster that is down or failing.
    #[test]
    fn only_refusals_of_the_caller_are_charged() {
        let end = |ended_by, refused_with| SessionEnd {
            ended_by,
            refused_with,
            ..SessionEnd::default()
        };
        assert!(end(UPSTREAM_REFUSED, Some(401)).charges_caller());
        assert!(end(UPSTREAM_REFUSED, Some(403)).charges_caller());
        assert!(end(CLIENT_UPGRADE_FAILED, None).charges_caller());
        assert!(end(CLIENT_GONE_BEFORE_UPSTREAM, None).charges_caller());
        for status in [None, Some(404), Some(500), Some(502), Some(503), Some(101)] {
            assert!(
                !end(UPSTREAM_REFUSED, status).charges_caller(),
                "{status:?}"
            );
        }
        assert!(!end("completed", Some(403)).charges_caller());
    }
}
