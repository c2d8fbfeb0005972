//! `--upstream-streaming`: whether v5 exec/attach and the port-forward tunnel go upstream as
//! WebSocket unchanged (pass-through), are translated to SPDY, or (`auto`) the former where the
//! cluster serves it and the latter where it does not; and the mirror image for SPDY clients
//! (relayed, or translated to WebSocket).
//!
//! `auto` asks the upstream with the client's own protocol first, as kubectl's fallback
//! executor does. A refusal that carries a Kubernetes `Status` is the cluster's real answer
//! (401, 403, 404, a pod without a node …) and is delivered, not retried ([`after_refusal`]).
//! Any other refusal (an old cluster's kubelet, a gateway's page) makes `auto` ask the other
//! path once for this request ([`after_first`], [`after_second`]); if that refuses too, the
//! client gets the cluster's Status when the second answer is one, else the first refusal as
//! it came.
//!
//! Only positive evidence is remembered ([`StreamingMemory`]): a path is learned when its
//! upstream answered 101, never from a refusal, so no request (whoever sends it, whatever the
//! upstream answers it) can steer other callers to a path that does not work for them. A
//! remembered alternative is asked first; when it gives an unrecognised refusal it is
//! forgotten and the client's own path asked once. The fallback is thus paid once per memory
//! period, not per session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The `--upstream-streaming` setting.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
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

/// What an upstream's non-101 answer to a streaming upgrade is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalAnswer {
    /// The cluster's own answer (a Kubernetes `Status`, or a 401): give it to the client.
    Deliver,
    /// Not recognisably the cluster's: the path may not serve this protocol. `auto` tries the
    /// other path once for this request; if that refuses too, this answer goes to the client.
    Unrecognised,
}

/// Decides on an upstream's non-101 answer to a streaming upgrade (`status`, its
/// `Content-Type` and its body, or the first bytes of it).
///
/// An old cluster does not route v5 and the tunnel to a handler of its own: the API server
/// relays them to the kubelet, whose WebSocket server does not know `v5.channel.k8s.io` and
/// answers a bare `403` without a body (x/net's handshake refusal), or whose legacy port-forward
/// handler answers `400 query parameter "port" is required` as text; a gateway that drops
/// WebSocket or SPDY answers in its own words. None of those is a Kubernetes `Status`. Every
/// error the API server itself gives before an upgrade (authentication 401, authorization 403,
/// pod 404, a pod without a node 400, dial errors 500) is a JSON `Status`: delivered, since
/// asking with the other protocol would only ask the same question again. A redirect is never
/// followed (and means the path is not the API server's own handler).
///
/// Only a prefix of the body is needed: the decision reads the object's top-level keys up to
/// `kind` (kube-apiserver writes `kind` first), so a Status larger than any buffer still counts
/// as one when only its beginning was read.
pub fn after_refusal(status: u16, content_type: Option<&str>, body: &[u8]) -> RefusalAnswer {
    if status == 401 || is_status_body(content_type, body) {
        return RefusalAnswer::Deliver;
    }
    RefusalAnswer::Unrecognised
}

/// Whether a body (or its beginning) is a Kubernetes `Status` object: JSON by its content type
/// (or, without one, by its first byte), whose top-level `kind` is `Status`. A body that says
/// it is text is not one, whatever it looks like.
fn is_status_body(content_type: Option<&str>, body: &[u8]) -> bool {
    let json = match content_type {
        Some(c) => c.contains("json"),
        None => body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{'),
    };
    json && top_level_kind(body).as_deref() == Some("Status")
}

/// The top-level `kind` of a JSON object, read from as much of it as `body` holds: the keys
/// before `kind` are walked (their values skipped), nothing after it is looked at. `None` when
/// the body is not an object, has no `kind`, or ends before it.
fn top_level_kind(body: &[u8]) -> Option<String> {
    let mut scan = JsonScan { bytes: body, at: 0 };
    scan.expect(b'{')?;
    loop {
        let key = scan.string()?;
        scan.expect(b':')?;
        if key == "kind" {
            return scan.string();
        }
        scan.skip_value()?;
        scan.expect(b',')?;
    }
}

/// A forward-only reader over the beginning of a JSON document; every method returns `None`
/// when the bytes end (or are not JSON) before what it reads is complete.
struct JsonScan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl JsonScan<'_> {
    fn skip_whitespace(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_whitespace();
        (self.bytes.get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    /// A string, its escapes decoded.
    fn string(&mut self) -> Option<String> {
        self.skip_whitespace();
        let start = self.at;
        self.skip_string()?;
        serde_json::from_slice(&self.bytes[start..self.at]).ok()
    }

    fn skip_string(&mut self) -> Option<()> {
        if self.bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        loop {
            match self.bytes.get(self.at)? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    /// Any value: a string, a nested object or array (strings inside it respected), a scalar.
    fn skip_value(&mut self) -> Option<()> {
        self.skip_whitespace();
        match self.bytes.get(self.at)? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.bytes.get(self.at)? {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => depth -= 1,
                        _ => {}
                    }
                    self.at += 1;
                    if depth == 0 {
                        return Some(());
                    }
                }
            }
            _ => {
                let end = self.bytes[self.at..]
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())?;
                self.at += end;
                Some(())
            }
        }
    }
}

/// How one path's upstream answered a streaming upgrade, as `auto` judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 101: the path carries the protocol (positive evidence, the only kind learned from).
    Accepted,
    /// A non-101 answer that is the cluster's own ([`RefusalAnswer::Deliver`]).
    Status,
    /// A non-101 answer that is not ([`RefusalAnswer::Unrecognised`]), or a 101 the client
    /// cannot use.
    Unrecognised,
    /// No HTTP answer at all (dial, TLS, timeout): says nothing about the protocol.
    NoAnswer,
}

impl From<RefusalAnswer> for Answer {
    fn from(r: RefusalAnswer) -> Answer {
        match r {
            RefusalAnswer::Deliver => Answer::Status,
            RefusalAnswer::Unrecognised => Answer::Unrecognised,
        }
    }
}

/// What `auto` does once the first path it asked has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFirst {
    /// Run the session on that path, and remember it.
    Serve,
    /// Give the client that answer; memory unchanged.
    Deliver,
    /// Ask the other path once; with `forget`, the first path was the remembered alternative
    /// and is forgotten.
    TryOther { forget: bool },
}

/// Decides after the first answer. `remembered` says the path asked was the remembered
/// alternative (SPDY translation, reverse translator) rather than the client's own.
///
/// A Status is delivered from either path: it is the cluster's answer through a path that
/// reached it, the same whatever the protocol, so it is neither retried nor a reason to forget
/// (forgetting on it would let anyone who can get a 404 make every next caller pay the
/// fallback again).
pub fn after_first(remembered: bool, answer: Answer) -> AfterFirst {
    match answer {
        Answer::Accepted => AfterFirst::Serve,
        Answer::Status | Answer::NoAnswer => AfterFirst::Deliver,
        Answer::Unrecognised => AfterFirst::TryOther { forget: remembered },
    }
}

/// What `auto` does once the second path has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterSecond {
    /// Run the session on the second path, and remember it.
    Serve,
    /// Give the client the second path's answer: the cluster's Status.
    DeliverSecond,
    /// Give the client the first answer (unrecognised, passed on as it came).
    DeliverFirst,
}

/// Decides after the second path answered (the first was unrecognised).
pub fn after_second(second: Answer) -> AfterSecond {
    match second {
        Answer::Accepted => AfterSecond::Serve,
        Answer::Status => AfterSecond::DeliverSecond,
        Answer::Unrecognised | Answer::NoAnswer => AfterSecond::DeliverFirst,
    }
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

    /// Notes that `path` worked (its upstream answered 101) for `upstream`, `family` and the
    /// client protocol the path starts from, as of `now`;
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

    /// Forgets that `path` worked for `upstream` and `family` (it just failed); an entry that
    /// meanwhile names another path stays. Returns whether something was forgotten.
    pub fn forget(&self, upstream: &str, family: StreamFamily, path: UpstreamPath) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let key = (upstream.to_owned(), family, path.client());
        if entries.get(&key).is_some_and(|(p, _)| *p == path) {
            entries.remove(&key);
            return true;
        }
        false
    }
}

/// Logs that a remembered path failed and was forgotten.
pub fn log_forgotten(upstream: &str, family: StreamFamily, path: UpstreamPath) {
    tracing::info!(
        upstream,
        family = family.label(),
        path = ?path,
        "the remembered upstream path refused a session: forgotten, asking the client's own path"
    );
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
    fn an_old_clusters_refusals_are_unrecognised() {
        // The kubelet's x/net handshake: no subprotocol it knows.
        assert_eq!(after_refusal(403, None, b""), RefusalAnswer::Unrecognised);
        // The kubelet's legacy port-forward handler, reached by a tunnel request.
        assert_eq!(
            after_refusal(
                400,
                Some("text/plain; charset=utf-8"),
                b"query parameter \"port\" is required"
            ),
            RefusalAnswer::Unrecognised
        );
        // A gateway's own page, a redirect, a bare 426.
        assert_eq!(
            after_refusal(400, Some("text/html"), b"<html>no websockets</html>"),
            RefusalAnswer::Unrecognised
        );
        assert_eq!(after_refusal(302, None, b""), RefusalAnswer::Unrecognised);
        assert_eq!(after_refusal(426, None, b""), RefusalAnswer::Unrecognised);
        // JSON that is not a Status.
        assert_eq!(
            after_refusal(400, Some("application/json"), br#"{"error":"x"}"#),
            RefusalAnswer::Unrecognised
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

    /// A 403 for a very long pod name, as kube-apiserver writes it (`kind` first).
    fn long_status(name_len: usize) -> String {
        let name = "p".repeat(name_len);
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"pods \"{name}\" is forbidden","reason":"Forbidden","details":{{"name":"{name}","kind":"pods"}},"code":403}}"#
        )
    }

    #[test]
    fn a_status_larger_than_any_buffer_is_still_a_status() {
        let body = long_status(100 * 1024);
        assert!(body.len() > 128 * 1024);
        // Whole, cut after 64 KiB, cut right after the kind: a Status each time.
        for cut in [body.len(), 64 * 1024, 17] {
            for ct in [Some("application/json"), None] {
                assert_eq!(
                    after_refusal(403, ct, &body.as_bytes()[..cut]),
                    RefusalAnswer::Deliver,
                    "cut at {cut}, {ct:?}"
                );
            }
        }
        // Cut before the kind's value is complete: not (yet) recognisable.
        assert_eq!(
            after_refusal(403, Some("application/json"), &body.as_bytes()[..14]),
            RefusalAnswer::Unrecognised
        );
    }

    #[test]
    fn the_kind_is_found_after_other_keys_but_only_at_the_top_level() {
        let later = br#" { "apiVersion" : "v1", "metadata": {"a": [1, {"kind": "x"}], "s": "}\""}, "n": -1.5e3, "t": true, "kind" : "Status", "code": 404"#;
        assert_eq!(
            after_refusal(404, Some("application/json"), later),
            RefusalAnswer::Deliver
        );
        let nested = br#"{"details": {"kind": "Status"}, "error": "x"}"#;
        assert_eq!(
            after_refusal(400, Some("application/json"), nested),
            RefusalAnswer::Unrecognised
        );
        let other_kind = br#"{"kind":"Pod","apiVersion":"v1"}"#;
        assert_eq!(
            after_refusal(400, Some("application/json"), other_kind),
            RefusalAnswer::Unrecognised
        );
        let escaped = br#"{"kind":"Stat\u0075s"}"#;
        assert_eq!(after_refusal(400, None, escaped), RefusalAnswer::Deliver);
        // Text that merely mentions a Status, and Go's answer to a bad escape.
        assert_eq!(
            after_refusal(400, Some("text/plain"), br#"{"kind":"Status"} is not here"#),
            RefusalAnswer::Unrecognised
        );
        assert_eq!(
            after_refusal(400, Some("text/plain; charset=utf-8"), b"400 Bad Request"),
            RefusalAnswer::Unrecognised
        );
    }

    #[test]
    fn only_a_101_is_learned_and_a_status_is_never_retried() {
        for remembered in [false, true] {
            assert_eq!(after_first(remembered, Answer::Accepted), AfterFirst::Serve);
            assert_eq!(after_first(remembered, Answer::Status), AfterFirst::Deliver);
            assert_eq!(
                after_first(remembered, Answer::NoAnswer),
                AfterFirst::Deliver
            );
            assert_eq!(
                after_first(remembered, Answer::Unrecognised),
                AfterFirst::TryOther { forget: remembered }
            );
        }
        assert_eq!(after_second(Answer::Accepted), AfterSecond::Serve);
        assert_eq!(after_second(Answer::Status), AfterSecond::DeliverSecond);
        assert_eq!(
            after_second(Answer::Unrecognised),
            AfterSecond::DeliverFirst
        );
        assert_eq!(after_second(Answer::NoAnswer), AfterSecond::DeliverFirst);
    }

    #[test]
    fn forgetting_removes_only_the_path_that_failed() {
        let m = StreamingMemory::with_period(Duration::from_secs(600));
        let t0 = Instant::now();
        let f = StreamFamily::RemoteCommand;
        let ws = ClientProtocol::WebSocket;
        assert!(!m.forget("u", f, UpstreamPath::Spdy));
        m.learn("u", f, UpstreamPath::PassThrough, t0);
        // Another request learned the client's own path meanwhile: it stays.
        assert!(!m.forget("u", f, UpstreamPath::Spdy));
        assert_eq!(m.recall("u", f, ws, t0), Some(UpstreamPath::PassThrough));
        m.learn("u", f, UpstreamPath::Spdy, t0);
        assert!(m.forget("u", f, UpstreamPath::Spdy));
        assert_eq!(m.recall("u", f, ws, t0), None);
        // The SPDY clients' entry is separate.
        m.learn("u", f, UpstreamPath::Reverse, t0);
        assert!(!m.forget("u", f, UpstreamPath::Spdy));
        assert!(m.forget("u", f, UpstreamPath::Reverse));
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
