//! `--upstream-streaming`: whether v5 exec/attach and the port-forward tunnel go upstream as
//! WebSocket unchanged (pass-through), are translated to SPDY, or (`auto`) the former where the
//! cluster serves it and the latter where it does not.
//!
//! `auto` asks the upstream with the client's WebSocket first, as kubectl's fallback executor
//! does, and falls back to SPDY when the answer is an old cluster's refusal of the upgrade
//! ([`after_refusal`]). Unlike kubectl, which retries on any non-101 answer, a refusal that
//! carries a Kubernetes `Status` is the cluster's real answer (401, 403, 404, a pod without a
//! node …) and is delivered, not retried. What worked is remembered per upstream and stream
//! family ([`StreamingMemory`]), so the fallback is paid once per memory period, not per session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The `--upstream-streaming` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamStreaming {
    /// WebSocket upstream where the cluster serves it, else SPDY translation (remembered).
    #[default]
    Auto,
    /// Always translate v5 and the tunnel to SPDY (clusters before 1.31, SPDY-only paths).
    Spdy,
    /// Always pass v5 and the tunnel through as WebSocket (1.31+ clusters with the gates on).
    #[value(name = "websocket")]
    #[serde(rename = "websocket")]
    WebSocket,
}

/// A family of streaming requests, each behind its own API server feature gate: a cluster can
/// serve v5 exec/attach (`TranslateStreamCloseWebsocketRequests`, on since 1.30) but not yet
/// the tunnel (`PortForwardWebsockets`, on since 1.31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamFamily {
    /// `pods/exec` and `pods/attach` with `v5.channel.k8s.io`.
    RemoteCommand,
    /// `pods/portforward` with `SPDY/3.1+portforward.k8s.io`.
    PortForward,
}

impl StreamFamily {
    /// How logs name it.
    pub fn label(self) -> &'static str {
        match self {
            StreamFamily::RemoteCommand => "exec/attach",
            StreamFamily::PortForward => "port-forward",
        }
    }
}

/// What the client speaks, which decides the question `auto` asks the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientProtocol {
    /// v5 exec/attach or the port-forward tunnel (kubectl ≥ 1.31, browsers, the Python and
    /// Node clients): does the upstream serve them as WebSocket?
    WebSocket,
    /// SPDY/3.1 (kubectl ≤ 1.30 and kubectl's fallback): does the path to the upstream carry
    /// SPDY?
    Spdy,
}

/// How a session goes upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamPath {
    /// The client's WebSocket, unchanged.
    PassThrough,
    /// The client's WebSocket translated to SPDY.
    Spdy,
    /// The client's SPDY, relayed unchanged.
    Relay,
    /// The client's SPDY translated to WebSocket (the reverse translator).
    Reverse,
}

impl UpstreamPath {
    /// Whose question this path answers.
    pub fn client(self) -> ClientProtocol {
        match self {
            UpstreamPath::PassThrough | UpstreamPath::Spdy => ClientProtocol::WebSocket,
            UpstreamPath::Relay | UpstreamPath::Reverse => ClientProtocol::Spdy,
        }
    }
}

/// What to do with an upstream's non-101 answer to the client's WebSocket upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalAnswer {
    /// The upstream does not serve this WebSocket protocol: translate to SPDY instead.
    FallBack,
    /// The cluster's real answer: give it to the client.
    Deliver,
}

/// Decides on an upstream's non-101 answer to a v5 or tunnel WebSocket upgrade (`status`, its
/// `Content-Type` and body).
///
/// An old cluster does not route these to a handler of its own: the API server relays them to
/// the kubelet, whose WebSocket server does not know `v5.channel.k8s.io` and answers a bare
/// `403` without a body (x/net's handshake refusal), or whose legacy port-forward handler
/// answers `400 query parameter "port" is required` as text; a gateway that drops WebSocket
/// answers in its own words. None of those is a Kubernetes `Status`. Every error the API server
/// itself gives before an upgrade (authentication 401, authorization 403, pod 404, a pod
/// without a node 400, dial errors 500) is a JSON `Status`: delivered, since retrying with SPDY
/// would only ask the same question again. A redirect is never followed (and means the path is
/// not the API server's own handler): fall back, as kubectl would.
pub fn after_refusal(status: u16, content_type: Option<&str>, body: &[u8]) -> RefusalAnswer {
    if status == 401 || is_status_body(content_type, body) {
        return RefusalAnswer::Deliver;
    }
    RefusalAnswer::FallBack
}

/// Whether a body is a Kubernetes `Status` object.
fn is_status_body(content_type: Option<&str>, body: &[u8]) -> bool {
    let json = content_type.is_some_and(|c| c.contains("json"))
        || body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !json {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(default)]
        kind: String,
    }
    serde_json::from_slice::<Kind>(body).is_ok_and(|k| k.kind == "Status")
}

/// How long `auto` trusts what it learned about an upstream.
pub const MEMORY_PERIOD: Duration = Duration::from_secs(10 * 60);

/// The key of what `auto` learned: upstream, family and what the client speaks.
type MemoryKey = (String, StreamFamily, ClientProtocol);

/// What `auto` learned per upstream, family and client protocol, for [`MEMORY_PERIOD`]. The
/// lock is held only to read or write one entry, never across an await.
#[derive(Debug, Default)]
pub struct StreamingMemory {
    entries: Mutex<HashMap<MemoryKey, (UpstreamPath, Instant)>>,
    period: Option<Duration>,
}

impl StreamingMemory {
    /// A memory that forgets after `period`.
    pub fn with_period(period: Duration) -> StreamingMemory {
        StreamingMemory {
            entries: Mutex::default(),
            period: Some(period),
        }
    }

    fn period(&self) -> Duration {
        self.period.unwrap_or(MEMORY_PERIOD)
    }

    /// What was learned about `upstream` for `family` and `client` within the period, as of
    /// `now`.
    pub fn recall(
        &self,
        upstream: &str,
        family: StreamFamily,
        client: ClientProtocol,
        now: Instant,
    ) -> Option<UpstreamPath> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&(upstream.to_owned(), family, client))
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.period())
            .map(|(path, _)| *path)
    }

    /// Notes that `path` worked (or is the one to use) for `upstream`, `family` and the client
    /// protocol the path starts from, as of `now`;
    /// returns whether that changes what was believed (nothing known, expired, or the other
    /// path), so that the change can be logged once.
    pub fn learn(
        &self,
        upstream: &str,
        family: StreamFamily,
        path: UpstreamPath,
        now: Instant,
    ) -> bool {
        let period = self.period();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let previous = entries.insert((upstream.to_owned(), family, path.client()), (path, now));
        !matches!(previous, Some((p, at)) if p == path && now.saturating_duration_since(at) < period)
    }
}

/// Logs a decision about an upstream once per change.
pub fn log_decision(upstream: &str, family: StreamFamily, path: UpstreamPath) {
    match path {
        UpstreamPath::PassThrough => tracing::info!(
            upstream,
            family = family.label(),
            "upstream speaks WebSocket streaming: passing through"
        ),
        UpstreamPath::Spdy => tracing::info!(
            upstream,
            family = family.label(),
            "upstream does not speak WebSocket streaming: translating to SPDY"
        ),
        UpstreamPath::Relay => tracing::info!(
            upstream,
            family = family.label(),
            "upstream takes SPDY: relaying SPDY clients"
        ),
        UpstreamPath::Reverse => tracing::info!(
            upstream,
            family = family.label(),
            "upstream refuses SPDY: translating SPDY clients to WebSocket"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS_403: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" is forbidden","reason":"Forbidden","code":403}"#;
    const STATUS_404: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" not found","reason":"NotFound","code":404}"#;
    const STATUS_400: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pod p does not have a host assigned","reason":"BadRequest","code":400}"#;

    #[test]
    fn an_old_clusters_refusals_fall_back() {
        // The kubelet's x/net handshake: no subprotocol it knows.
        assert_eq!(after_refusal(403, None, b""), RefusalAnswer::FallBack);
        // The kubelet's legacy port-forward handler, reached by a tunnel request.
        assert_eq!(
            after_refusal(
                400,
                Some("text/plain; charset=utf-8"),
                b"query parameter \"port\" is required"
            ),
            RefusalAnswer::FallBack
        );
        // A gateway's own page, a redirect, a bare 426.
        assert_eq!(
            after_refusal(400, Some("text/html"), b"<html>no websockets</html>"),
            RefusalAnswer::FallBack
        );
        assert_eq!(after_refusal(302, None, b""), RefusalAnswer::FallBack);
        assert_eq!(after_refusal(426, None, b""), RefusalAnswer::FallBack);
        // JSON that is not a Status.
        assert_eq!(
            after_refusal(400, Some("application/json"), br#"{"error":"x"}"#),
            RefusalAnswer::FallBack
        );
    }

    #[test]
    fn the_clusters_real_answers_are_delivered() {
        for (code, body) in [(403, STATUS_403), (404, STATUS_404), (400, STATUS_400)] {
            assert_eq!(
                after_refusal(code, Some("application/json"), body.as_bytes()),
                RefusalAnswer::Deliver,
                "{code}"
            );
            // Recognised by its body even without a content type.
            assert_eq!(
                after_refusal(code, None, body.as_bytes()),
                RefusalAnswer::Deliver
            );
        }
        // 401 is about the caller whatever the body says.
        assert_eq!(
            after_refusal(401, None, b"Unauthorized"),
            RefusalAnswer::Deliver
        );
    }

    #[test]
    fn memory_recalls_within_the_period_and_forgets_after() {
        let m = StreamingMemory::with_period(Duration::from_secs(600));
        let t0 = Instant::now();
        let up = "https://10.0.0.1:6443";
        let ws = ClientProtocol::WebSocket;
        assert_eq!(m.recall(up, StreamFamily::RemoteCommand, ws, t0), None);
        assert!(m.learn(up, StreamFamily::RemoteCommand, UpstreamPath::Spdy, t0));
        assert_eq!(
            m.recall(
                up,
                StreamFamily::RemoteCommand,
                ws,
                t0 + Duration::from_secs(599)
            ),
            Some(UpstreamPath::Spdy)
        );
        assert_eq!(
            m.recall(
                up,
                StreamFamily::RemoteCommand,
                ws,
                t0 + Duration::from_secs(600)
            ),
            None
        );
        // Families, upstreams and client protocols are separate.
        assert_eq!(m.recall(up, StreamFamily::PortForward, ws, t0), None);
        assert_eq!(
            m.recall("http://other", StreamFamily::RemoteCommand, ws, t0),
            None
        );
        let spdy = ClientProtocol::Spdy;
        assert_eq!(m.recall(up, StreamFamily::RemoteCommand, spdy, t0), None);
        assert!(m.learn(up, StreamFamily::RemoteCommand, UpstreamPath::Reverse, t0));
        assert_eq!(
            m.recall(up, StreamFamily::RemoteCommand, spdy, t0),
            Some(UpstreamPath::Reverse)
        );
        assert_eq!(
            m.recall(up, StreamFamily::RemoteCommand, ws, t0),
            Some(UpstreamPath::Spdy)
        );
    }

    #[test]
    fn learning_reports_changes_only() {
        let m = StreamingMemory::with_period(Duration::from_secs(600));
        let t0 = Instant::now();
        let up = "u";
        let f = StreamFamily::PortForward;
        assert!(m.learn(up, f, UpstreamPath::PassThrough, t0));
        assert!(!m.learn(
            up,
            f,
            UpstreamPath::PassThrough,
            t0 + Duration::from_secs(1)
        ));
        assert!(m.learn(up, f, UpstreamPath::Spdy, t0 + Duration::from_secs(2)));
        // Relearned after it expired: logged again.
        assert!(m.learn(up, f, UpstreamPath::Spdy, t0 + Duration::from_secs(700)));
    }

    #[test]
    fn setting_names() {
        use clap::ValueEnum;
        let names: Vec<String> = UpstreamStreaming::value_variants()
            .iter()
            .map(|v| v.to_possible_value().unwrap().get_name().to_owned())
            .collect();
        assert_eq!(names, ["auto", "spdy", "websocket"]);
        assert_eq!(UpstreamStreaming::default(), UpstreamStreaming::Auto);
    }
}
