//! What an audit event may carry from its caller. Every field a caller chooses (names, the
//! command, the ports, identity and impersonation, the audit id) or an upstream answers on its
//! behalf (a status, a protocol, an error) is cut to a cap of its own, counted in the bytes the
//! field takes in the JSON line (escapes included). The caps add up to less than [`EVENT_CAP`],
//! the most one line may take, so no request can make an event larger (a property test below
//! holds the sum to it). A cut keeps the beginning, so a truncated command still shows what it
//! started with; the event's `truncated` object names every cut field with its original size.
//!
//! Recording titles and log lines carry the same fields: [`log_field`] bounds those.

use std::collections::BTreeMap;

use serde::Serialize;

use super::event::{ImpersonatedUser, SessionEnd, SessionInfo};
use super::port_forward::ForwardedConnection;

/// The most one audit event line may take, its newline aside.
pub const EVENT_CAP: usize = 32 * 1024;
/// A namespace, pod, container or node name (Kubernetes names are at most 253 bytes).
pub const NAME_CAP: usize = 256;
/// The whole command of an exec: every argument, with its quotes and commas.
pub const COMMAND_CAP: usize = 4 * 1024;
/// The user name.
pub const USER_CAP: usize = 512;
/// All groups together, as the command is counted.
pub const GROUPS_CAP: usize = 2 * 1024;
/// Everything the caller asked to act as (`Impersonate-*`): user, uid, groups and extras.
pub const IMPERSONATION_CAP: usize = 2 * 1024;
/// The request's `Audit-ID` (kube-apiserver's are 36-byte UUIDs).
pub const AUDIT_ID_CAP: usize = 128;
/// The subprotocol or stream protocol named in the upgrade.
pub const PROTOCOL_CAP: usize = 256;
/// A status, an error text, the recording's path.
pub const TEXT_CAP: usize = 1024;
/// The ports of a port-forward, by number.
pub const PORTS_CAP: usize = 64;
/// A port-forward's connections, all together; those past it are counted only.
pub const CONNECTIONS_CAP: usize = 8 * 1024;
/// One forwarded connection's `requestid`.
pub const REQUEST_ID_CAP: usize = 64;
/// What one forwarded connection's error stream said.
pub const CONNECTION_ERROR_CAP: usize = 256;
/// A caller-chosen field in a log line or a recording's title.
pub const LOG_FIELD_CAP: usize = 256;

/// What a field was before it was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// Its text as sent, in bytes (UTF-8): every string of a list or object together.
    pub original_bytes: u64,
    /// A list's entries as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_items: Option<u64>,
}

/// The fields an event had to cut, by their names in the event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Truncations(BTreeMap<&'static str, Cut>);

impl Truncations {
    /// Whether nothing was cut.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What `field` was before it was cut, if it was.
    pub fn get(&self, field: &str) -> Option<Cut> {
        self.0.get(field).copied()
    }

    /// Adds `other`'s cuts (an `ended` event's fields beside its `started` ones).
    pub fn merged(&self, other: &Truncations) -> Truncations {
        let mut all = self.clone();
        all.0.extend(other.0.iter().map(|(k, v)| (*k, *v)));
        all
    }

    fn note(&mut self, field: &'static str, cut: bool, original: Cut) {
        if cut {
            self.0.insert(field, original);
        }
    }

    fn text(&mut self, field: &'static str, s: &mut String, cap: usize) {
        let original = text_size(s);
        let cut = cut_text(s, cap);
        self.note(field, cut, original);
    }

    fn optional_text(&mut self, field: &'static str, s: &mut Option<String>, cap: usize) {
        if let Some(s) = s.as_mut() {
            self.text(field, s, cap);
        }
    }

    fn list(&mut self, field: &'static str, items: &mut Vec<String>, cap: usize) {
        let original = list_size(items);
        let mut budget = Budget::new(cap);
        budget.list(items);
        self.note(field, budget.cut, original);
    }

    fn ports(&mut self, ports: &mut Vec<u16>) {
        if ports.len() > PORTS_CAP {
            let original = Cut {
                original_bytes: 0,
                original_items: Some(ports.len() as u64),
            };
            ports.truncate(PORTS_CAP);
            self.note("ports", true, original);
        }
    }
}

/// Bytes `c` takes inside a JSON string as serde_json writes it.
fn char_json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes `s` takes inside a JSON string.
pub fn json_len(s: &str) -> usize {
    s.chars().map(char_json_len).sum()
}

/// Cuts `s` to its longest beginning that takes at most `cap` bytes inside a JSON string;
/// whether it cut.
pub fn cut_text(s: &mut String, cap: usize) -> bool {
    // Most text is plain: no escape can make it longer than this, so no walk is needed.
    if s.len() <= cap && !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        return false;
    }
    let mut taken = 0;
    for (at, c) in s.char_indices() {
        taken += char_json_len(c);
        if taken > cap {
            s.truncate(at);
            return true;
        }
    }
    false
}

fn text_size(s: &str) -> Cut {
    Cut {
        original_bytes: s.len() as u64,
        original_items: None,
    }
}

fn list_size(items: &[String]) -> Cut {
    Cut {
        original_bytes: items.iter().map(|s| s.len() as u64).sum(),
        original_items: Some(items.len() as u64),
    }
}

/// A run of strings sharing one cap: each costs its JSON bytes plus its quotes and a comma.
struct Budget {
    left: usize,
    cut: bool,
}

/// A string's quotes and the comma (or colon) after it.
const STRING_OVERHEAD: usize = 3;

impl Budget {
    fn new(cap: usize) -> Budget {
        Budget {
            left: cap,
            cut: false,
        }
    }

    /// Takes `s` whole, or as much of its beginning as is left (`false`: nothing of it fits,
    /// or nothing was left).
    fn text(&mut self, s: &mut String) -> bool {
        let cost = json_len(s) + STRING_OVERHEAD;
        if cost <= self.left {
            self.left -= cost;
            return true;
        }
        self.cut = true;
        let room = self.left.saturating_sub(STRING_OVERHEAD);
        self.left = 0;
        cut_text(s, room);
        !s.is_empty()
    }

    /// Keeps `items` in order while they fit; the one that crosses the cap keeps its
    /// beginning, the rest go.
    fn list(&mut self, items: &mut Vec<String>) {
        let mut kept = items.len();
        for (i, item) in items.iter_mut().enumerate() {
            if self.cut {
                kept = i;
                break;
            }
            if !self.text(item) {
                kept = i;
                break;
            }
        }
        if kept < items.len() {
            self.cut = true;
            items.truncate(kept);
        }
    }
}

/// Cuts what `info` carries from its caller to the caps; what was cut.
pub fn bound_info(info: &mut SessionInfo) -> Truncations {
    let mut t = Truncations::default();
    t.text("namespace", &mut info.namespace, NAME_CAP);
    t.text("pod", &mut info.pod, NAME_CAP);
    t.optional_text("container", &mut info.container, NAME_CAP);
    t.optional_text("node", &mut info.node, NAME_CAP);
    t.list("command", &mut info.command, COMMAND_CAP);
    t.ports(&mut info.ports);
    t.optional_text("user", &mut info.user, USER_CAP);
    t.list("groups", &mut info.groups, GROUPS_CAP);
    if let Some(asked) = info.impersonated_user.as_mut() {
        let original = impersonation_size(asked);
        let cut = bound_impersonation(asked);
        t.note("impersonated_user", cut, original);
    }
    t.optional_text("protocol", &mut info.protocol, PROTOCOL_CAP);
    t.optional_text("recording", &mut info.recording, TEXT_CAP);
    t.optional_text("audit_id", &mut info.audit_id, AUDIT_ID_CAP);
    t
}

/// Cuts the ports an `ended` event says were seen (a port-forward's streams name them).
pub fn bound_ports(ports: &mut Vec<u16>) -> Truncations {
    let mut t = Truncations::default();
    t.ports(ports);
    t
}

fn impersonation_size(asked: &ImpersonatedUser) -> Cut {
    let strings = asked
        .user
        .iter()
        .chain(asked.uid.iter())
        .chain(asked.groups.iter())
        .chain(asked.extra.keys())
        .chain(asked.extra.values().flatten());
    Cut {
        original_bytes: strings.map(|s| s.len() as u64).sum(),
        original_items: None,
    }
}

/// Cuts everything `asked` names to [`IMPERSONATION_CAP`] together, in the order user, uid,
/// groups, extras; whether it cut.
fn bound_impersonation(asked: &mut ImpersonatedUser) -> bool {
    let mut budget = Budget::new(IMPERSONATION_CAP);
    for s in [asked.user.as_mut(), asked.uid.as_mut()]
        .into_iter()
        .flatten()
    {
        budget.text(s);
    }
    budget.list(&mut asked.groups);
    let mut kept = BTreeMap::new();
    for (mut key, mut values) in std::mem::take(&mut asked.extra) {
        // A key's list brackets beside its quotes and colon.
        if budget.cut || !budget.text(&mut key) || budget.left < 2 {
            budget.cut = true;
            break;
        }
        budget.left -= 2;
        budget.list(&mut values);
        kept.insert(key, values);
    }
    asked.extra = kept;
    budget.cut
}

/// Cuts what `end` carries (its status and errors, a port-forward's connections) to the caps;
/// what was cut. Connections past [`CONNECTIONS_CAP`] are counted in `connections_omitted`.
pub fn bound_end(end: &mut SessionEnd) -> Truncations {
    let mut t = Truncations::default();
    t.optional_text("status", &mut end.status, TEXT_CAP);
    t.optional_text("recording_error", &mut end.recording_error, TEXT_CAP);
    t.optional_text("terminated_by", &mut end.terminated_by, TEXT_CAP);
    t.optional_text("termination_reason", &mut end.termination_reason, TEXT_CAP);
    t.optional_text("connections_error", &mut end.connections_error, TEXT_CAP);
    let original = Cut {
        original_bytes: end
            .connections
            .iter()
            .map(|c| (c.request_id.len() + c.error.as_ref().map_or(0, String::len)) as u64)
            .sum(),
        original_items: Some(end.connections.len() as u64),
    };
    let (cut, dropped) = bound_connections(&mut end.connections);
    end.connections_omitted = end.connections_omitted.saturating_add(dropped);
    t.note("connections", cut, original);
    t
}

/// The most one connection takes in the line besides its two strings: the keys, a port and
/// two byte counts of up to 20 digits, the braces and a comma.
const CONNECTION_OVERHEAD: usize = 112;

/// Cuts each connection's strings, then keeps connections while they fit; whether anything
/// was cut, and how many connections were dropped.
fn bound_connections(connections: &mut Vec<ForwardedConnection>) -> (bool, u64) {
    let mut cut = false;
    let mut left = CONNECTIONS_CAP;
    let mut kept = connections.len();
    for (i, c) in connections.iter_mut().enumerate() {
        cut |= cut_text(&mut c.request_id, REQUEST_ID_CAP);
        if let Some(e) = c.error.as_mut() {
            cut |= cut_text(e, CONNECTION_ERROR_CAP);
        }
        let cost =
            CONNECTION_OVERHEAD + json_len(&c.request_id) + c.error.as_deref().map_or(0, json_len);
        if cost > left {
            kept = i;
            break;
        }
        left -= cost;
    }
    let dropped = (connections.len() - kept) as u64;
    connections.truncate(kept);
    (cut || dropped > 0, dropped)
}

/// A command as a recording's header names it: cut as an event's `command` is
/// ([`COMMAND_CAP`]).
pub fn bounded_command(command: &[String]) -> Vec<String> {
    let mut command = command.to_vec();
    Budget::new(COMMAND_CAP).list(&mut command);
    command
}

/// `s` for a log line or a recording's title: its beginning, at most [`LOG_FIELD_CAP`] bytes
/// (at a character boundary).
pub fn log_field(s: &str) -> &str {
    if s.len() <= LOG_FIELD_CAP {
        return s;
    }
    let mut end = LOG_FIELD_CAP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    use proptest::prelude::*;

    use super::*;
    use crate::audit::event::{Event, HttpVersion, IdentitySource, ProtocolPath, Verb};

    fn info() -> SessionInfo {
        SessionInfo {
            cluster: None,
            session_id: "0a1b2c3d-7".into(),
            verb: Verb::Exec,
            namespace: "default".into(),
            pod: "web".into(),
            container: Some("main".into()),
            node: None,
            command: vec!["sh".into(), "-c".into(), "id".into()],
            tty: false,
            stdin: false,
            ports: vec![],
            user: None,
            groups: vec![],
            identity_source: IdentitySource::Unknown,
            impersonated_user: None,
            client_address: "127.0.0.1:50000".into(),
            http_version: HttpVersion::Http11,
            protocol_path: ProtocolPath::PassThrough,
            protocol: None,
            recording: None,
            audit_id: Some("5f0c6a52-1d2e-4c3b-9a8f-0e1d2c3b4a59".into()),
            charged_to: None,
        }
    }

    fn line(info: &SessionInfo, end: Option<&SessionEnd>, t: &Truncations) -> String {
        serde_json::to_string(&Event {
            time: "2026-11-25T01:02:03.456Z".into(),
            stage: if end.is_some() { "ended" } else { "started" },
            info,
            end,
            truncated: (!t.is_empty()).then_some(t),
        })
        .unwrap()
    }

    #[test]
    fn what_fits_is_left_alone() {
        let mut i = info();
        let before = i.clone();
        assert!(bound_info(&mut i).is_empty());
        assert_eq!(format!("{i:?}"), format!("{before:?}"));
    }

    #[test]
    fn a_long_command_keeps_its_beginning_and_says_how_long_it_was() {
        let mut i = info();
        i.command = vec!["sh".into(), "-c".into(), "x".repeat(60_000), "tail".into()];
        let t = bound_info(&mut i);
        // `"sh",` and `"-c",` take 5 bytes each; the third keeps what is left of 4096.
        assert_eq!(i.command.len(), 3);
        assert_eq!(i.command[..2], ["sh", "-c"]);
        assert_eq!(i.command[2], "x".repeat(COMMAND_CAP - 10 - 3));
        assert_eq!(
            t.get("command"),
            Some(Cut {
                original_bytes: 60_008,
                original_items: Some(4),
            })
        );
        let v: serde_json::Value = serde_json::from_str(&line(&i, None, &t)).unwrap();
        assert_eq!(
            v["truncated"],
            serde_json::json!({"command": {"original_bytes": 60008, "original_items": 4}})
        );
    }

    #[test]
    fn escapes_count_and_cuts_fall_on_characters() {
        let mut s = "\u{1}".repeat(100);
        assert!(cut_text(&mut s, 20));
        // Each control character takes six bytes (`\u0001`): three fit in 20.
        assert_eq!(s, "\u{1}".repeat(3));
        let mut s = "é".repeat(10);
        assert!(cut_text(&mut s, 5));
        assert_eq!(s, "éé");
        // `a"b` takes 4 bytes (`a\"b`); at 2 the quote no longer fits.
        let mut s = r#"a"b"#.to_owned();
        assert!(!cut_text(&mut s, 4));
        assert!(cut_text(&mut s, 3));
        assert_eq!(s, r#"a""#);
        assert!(cut_text(&mut s, 2));
        assert_eq!(s, "a");
    }

    #[test]
    fn names_identity_and_texts_are_cut_to_their_caps() {
        let mut i = info();
        i.pod = "p".repeat(300);
        i.namespace = "n".repeat(NAME_CAP);
        i.user = Some("u".repeat(600));
        i.groups = (0..1000).map(|n| format!("group-{n}")).collect();
        i.audit_id = Some("a".repeat(200));
        i.ports = (1..=100).collect();
        let t = bound_info(&mut i);
        assert_eq!(i.pod.len(), NAME_CAP);
        assert_eq!(i.namespace.len(), NAME_CAP, "exactly the cap is not cut");
        assert_eq!(i.user.as_deref().map(str::len), Some(USER_CAP));
        assert_eq!(i.audit_id.as_deref().map(str::len), Some(AUDIT_ID_CAP));
        assert_eq!(i.ports, (1..=PORTS_CAP as u16).collect::<Vec<_>>());
        let cost: usize = i.groups.iter().map(|g| g.len() + 3).sum();
        assert!(cost <= GROUPS_CAP, "{cost}");
        let keys: Vec<&str> = t.0.keys().copied().collect();
        assert_eq!(keys, ["audit_id", "groups", "pod", "ports", "user"]);
        assert_eq!(t.get("pod").unwrap().original_bytes, 300);
        assert_eq!(
            t.get("ports"),
            Some(Cut {
                original_bytes: 0,
                original_items: Some(100)
            })
        );
    }

    #[test]
    fn impersonation_shares_one_cap_in_order() {
        let mut extra = BTreeMap::new();
        extra.insert("a".to_owned(), vec!["v".repeat(3000)]);
        extra.insert("b".to_owned(), vec!["w".into()]);
        let mut i = info();
        i.impersonated_user = Some(ImpersonatedUser {
            user: Some("jane".into()),
            uid: None,
            groups: vec!["team".into()],
            extra,
        });
        let t = bound_info(&mut i);
        let asked = i.impersonated_user.as_ref().unwrap();
        assert_eq!(asked.user.as_deref(), Some("jane"));
        assert_eq!(asked.groups, ["team"]);
        // `"jane",` 7, `"team",` 7, `"a":[` 6: what is left of the cap holds the value's start.
        assert_eq!(asked.extra["a"][0].len(), IMPERSONATION_CAP - 7 - 7 - 6 - 3);
        assert!(!asked.extra.contains_key("b"));
        assert_eq!(
            t.get("impersonated_user").unwrap().original_bytes,
            4 + 4 + 1 + 3000 + 1 + 1
        );
    }

    #[test]
    fn connections_past_their_cap_are_counted_only() {
        let mut end = SessionEnd {
            outcome: "success",
            ended_by: "client",
            status: Some("s".repeat(5000)),
            connections_omitted: 7,
            connections: (0..1000)
                .map(|n| ForwardedConnection {
                    port: Some(8080),
                    request_id: format!("{n}{}", "r".repeat(100)),
                    bytes_in: 1,
                    bytes_out: 2,
                    error: Some("e".repeat(2000)),
                })
                .collect(),
            ..SessionEnd::default()
        };
        let t = bound_end(&mut end);
        let each = CONNECTION_OVERHEAD + REQUEST_ID_CAP + CONNECTION_ERROR_CAP;
        let kept = CONNECTIONS_CAP / each;
        assert_eq!(end.connections.len(), kept);
        assert_eq!(end.connections_omitted, 7 + (1000 - kept) as u64);
        assert_eq!(end.connections[0].request_id.len(), REQUEST_ID_CAP);
        assert!(end.connections[0].request_id.starts_with("0r"));
        assert_eq!(end.status.as_deref().map(str::len), Some(TEXT_CAP));
        assert_eq!(t.get("connections").unwrap().original_items, Some(1000));
        assert_eq!(t.get("status").unwrap().original_bytes, 5000);
    }

    #[test]
    fn log_fields_keep_their_beginning() {
        assert_eq!(log_field("web"), "web");
        assert_eq!(log_field(&"é".repeat(200)).len(), LOG_FIELD_CAP);
        assert_eq!(
            log_field(&format!("a{}", "é".repeat(200))).len(),
            LOG_FIELD_CAP - 1
        );
        let c = bounded_command(&["x".repeat(10_000)]);
        assert_eq!(c[0].len(), COMMAND_CAP - 3);
    }

    fn text() -> impl Strategy<Value = String> {
        // Control characters and quotes take more than a byte each: the worst case.
        let chars = prop::sample::select(vec!['a', 'é', '\u{1}', '"', '\\', '\n', '😀']);
        (prop::collection::vec(chars, 0..64), 0usize..12_000).prop_map(|(cs, n)| {
            cs.iter()
                .cycle()
                .take(if cs.is_empty() { 0 } else { n })
                .collect()
        })
    }

    fn texts() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(text(), 0..40)
    }

    fn any_info() -> impl Strategy<Value = SessionInfo> {
        (
            (text(), text(), text(), text(), texts()),
            (text(), texts(), text(), texts(), texts()),
            (
                text(),
                text(),
                text(),
                prop::collection::vec(any::<u16>(), 0..3000),
            ),
        )
            .prop_map(|(names, who, more)| {
                let (namespace, pod, container, node, command) = names;
                let (user, groups, imp_user, imp_groups, extra_keys) = who;
                let (protocol, recording, audit_id, ports) = more;
                let extra = extra_keys
                    .into_iter()
                    .map(|k| (k, vec![imp_user.clone(); 3]))
                    .collect();
                SessionInfo {
                    namespace,
                    pod,
                    container: Some(container),
                    node: Some(node),
                    command,
                    ports,
                    user: Some(user),
                    groups,
                    impersonated_user: Some(ImpersonatedUser {
                        user: Some(imp_user.clone()),
                        uid: Some(imp_user),
                        groups: imp_groups,
                        extra,
                    }),
                    client_address: SocketAddr::from(([0xffff; 8], 65535)).to_string(),
                    protocol: Some(protocol),
                    recording: Some(recording),
                    audit_id: Some(audit_id),
                    session_id: "ffffffff-18446744073709551615".into(),
                    // The longest cluster name (a DNS label).
                    cluster: Some("c".repeat(63)),
                    ..info()
                }
            })
    }

    fn any_end() -> impl Strategy<Value = SessionEnd> {
        (
            text(),
            text(),
            text(),
            prop::collection::vec((text(), text()), 0..1500),
            (text(), text()),
        )
            .prop_map(
                |(status, recording_error, connections_error, connections, (by, why))| SessionEnd {
                    bytes_in: u64::MAX,
                    bytes_out: u64::MAX,
                    duration_ms: u64::MAX,
                    exit_code: Some(i32::MIN),
                    status: Some(status),
                    outcome: "upstream_unresponsive",
                    ended_by: "the proxy's session task ended without a result",
                    recording_error: Some(recording_error),
                    recording_truncated: Some(crate::audit::recording::Truncation {
                        max_bytes: u64::MAX,
                        unrecorded_bytes: u64::MAX,
                    }),
                    // The longest key: a 63-byte bucket, a 512-byte prefix, a cluster's
                    // folder, the date and the session id.
                    recording_object: Some(format!(
                        "s3://{}/{}/{}/2026/11/29/{}.cast",
                        "b".repeat(63),
                        "p".repeat(512),
                        "c".repeat(63),
                        "s".repeat(40)
                    )),
                    recording_upload: Some("pending"),
                    terminated_by: Some(by),
                    termination_reason: Some(why),
                    connections: connections
                        .into_iter()
                        .map(|(request_id, error)| ForwardedConnection {
                            port: Some(u16::MAX),
                            request_id,
                            bytes_in: u64::MAX,
                            bytes_out: u64::MAX,
                            error: Some(error),
                        })
                        .collect(),
                    connections_omitted: u64::MAX - 2000,
                    connections_error: Some(connections_error),
                    ports_seen: None,
                    refused_with: Some(u16::MAX),
                },
            )
    }

    /// Every field as large as a request can make it, in the costliest characters.
    #[test]
    fn the_largest_events_fit_the_cap() {
        let big = "\u{1}".repeat(20_000);
        let many = vec![big.clone(); 1000];
        let mut i = info();
        for s in [&mut i.namespace, &mut i.pod] {
            *s = big.clone();
        }
        for s in [
            &mut i.container,
            &mut i.node,
            &mut i.user,
            &mut i.protocol,
            &mut i.recording,
            &mut i.audit_id,
        ] {
            *s = Some(big.clone());
        }
        i.command = many.clone();
        i.groups = many.clone();
        i.ports = (0..3000).collect();
        i.impersonated_user = Some(ImpersonatedUser {
            user: Some(big.clone()),
            uid: Some(big.clone()),
            groups: many.clone(),
            extra: (0..20)
                .map(|n| (format!("{n}{big}"), many.clone()))
                .collect(),
        });
        let connection = ForwardedConnection {
            port: Some(u16::MAX),
            request_id: big.clone(),
            bytes_in: u64::MAX,
            bytes_out: u64::MAX,
            error: Some(big.clone()),
        };
        let mut end = SessionEnd {
            bytes_in: u64::MAX,
            bytes_out: u64::MAX,
            duration_ms: u64::MAX,
            exit_code: Some(i32::MIN),
            status: Some(big.clone()),
            recording_error: Some(big.clone()),
            terminated_by: Some(big.clone()),
            termination_reason: Some(big.clone()),
            connections_error: Some(big),
            connections: vec![connection; 1500],
            connections_omitted: u64::MAX - 5000,
            ..SessionEnd::default()
        };
        let started = bound_info(&mut i);
        let ended = started.merged(&bound_end(&mut end));
        assert!(line(&i, None, &started).len() <= EVENT_CAP);
        assert!(line(&i, Some(&end), &ended).len() <= EVENT_CAP);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever a caller sends, neither event of its session exceeds the cap.
        #[test]
        fn no_event_exceeds_the_cap(mut i in any_info(), mut end in any_end()) {
            let started = bound_info(&mut i);
            let started_line = line(&i, None, &started);
            prop_assert!(started_line.len() <= EVENT_CAP, "started: {}", started_line.len());
            let ended = started.merged(&bound_end(&mut end));
            let ended_line = line(&i, Some(&end), &ended);
            prop_assert!(ended_line.len() <= EVENT_CAP, "ended: {}", ended_line.len());
            // Still one parseable line.
            prop_assert!(serde_json::from_str::<serde_json::Value>(&ended_line).is_ok());
        }
    }
}
