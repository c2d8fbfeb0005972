//! Sessions as a `meta.k8s.io/v1` `Table`, the form `kubectl get` asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`): the columns kubectl prints, each
//! row with its object (`?includeObject=`: `None`, `Metadata` by default, or `Object`), from
//! which kubectl takes the NAMESPACE column with `-A`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{header, HeaderMap};
use serde_json::{json, Value};

use super::objects::Session;
use crate::proxy::sessions::registry::live::LiveSession;

/// Whether the request's `Accept` asks for a `meta.k8s.io/v1` `Table`.
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            let params: Vec<&str> = params.collect();
            media.eq_ignore_ascii_case("application/json")
                && params.contains(&"as=Table")
                && params.contains(&"g=meta.k8s.io")
                && params.contains(&"v=v1")
        })
}

/// What each row carries of its session (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    /// From the query's `includeObject` value (the API server's default: `Metadata`).
    pub fn read(value: Option<&str>) -> IncludeObject {
        match value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// The table of `sessions` (at list version `version`, if a list).
pub fn table(sessions: &[Arc<LiveSession>], version: Option<u64>, include: IncludeObject) -> Value {
    let now = SystemTime::now();
    let rows: Vec<Value> = sessions.iter().map(|s| row(s, now, include)).collect();
    let mut metadata = json!({});
    if let Some(v) = version {
        metadata["resourceVersion"] = v.to_string().into();
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(),
        "rows": rows,
    })
}

fn columns() -> Value {
    let column = |name: &str, kind: &str, format: &str, priority: u8, what: &str| json!({"name": name, "type": kind, "format": format, "description": what, "priority": priority});
    json!([
        column("Name", "string", "name", 0, "The session id."),
        column("User", "string", "", 0, "Who runs it."),
        column("Pod", "string", "", 0, "The pod it runs in."),
        column("Container", "string", "", 0, "The container, if named."),
        column(
            "Command",
            "string",
            "",
            0,
            "The command (exec), empty for attach and port-forward."
        ),
        column(
            "Verb",
            "string",
            "",
            0,
            "exec, attach, portforward or a kubelet call."
        ),
        column("Age", "date", "", 0, "How long it has been running."),
        column("Replica", "string", "", 1, "The replica serving it."),
    ])
}

fn row(live: &LiveSession, now: SystemTime, include: IncludeObject) -> Value {
    let info = &live.info;
    let age = now
        .duration_since(live.traffic.started())
        .unwrap_or_default();
    let verb = serde_json::to_value(info.verb).unwrap_or_default();
    let cells = json!([
        info.session_id,
        info.user.as_deref().unwrap_or("<unknown>"),
        info.pod,
        info.container.as_deref().unwrap_or(""),
        info.command.join(" "),
        verb,
        human(age),
        crate::audit::instance::instance_id(),
    ]);
    let object = match include {
        IncludeObject::None => None,
        IncludeObject::Object => serde_json::to_value(Session::of(live)).ok(),
        IncludeObject::Metadata => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": info.session_id,
                "namespace": info.namespace,
                "creationTimestamp": crate::timestamp::rfc3339(live.traffic.started()),
            },
        })),
    };
    match object {
        Some(object) => json!({"cells": cells, "object": object}),
        None => json!({"cells": cells}),
    }
}

/// A duration as kubectl prints ages: two units at most, coarser as it grows.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    match s {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if days < 8 => format!("{days}d{}h", h % 24),
        _ => format!("{days}d"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let mut h = HeaderMap::new();
        assert!(!wanted(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            ),
        );
        assert!(wanted(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wanted(&h));
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let d = Duration::from_secs;
        assert_eq!(human(d(5)), "5s");
        assert_eq!(human(d(125)), "2m5s");
        assert_eq!(human(d(3600)), "60m");
        assert_eq!(human(d(4 * 3600 + 120)), "4h2m");
        assert_eq!(human(d(10 * 3600)), "10h");
        assert_eq!(human(d(3 * 86_400 + 3600)), "3d1h");
        assert_eq!(human(d(30 * 86_400)), "30d");
    }

    #[test]
    fn a_table_has_its_columns_and_rows_with_metadata() {
        let mut info = crate::audit::event::tests::info();
        info.session_id = "abcd-7".into();
        info.namespace = "team-a".into();
        let traffic = Arc::new(crate::session_traffic::SessionTraffic::started_at(
            std::time::Instant::now(),
            SystemTime::now(),
        ));
        let live = Arc::new(LiveSession::new(
            7,
            Arc::new(info),
            traffic,
            crate::session_stop::SessionStop::default(),
        ));
        let t = table(
            std::slice::from_ref(&live),
            Some(3),
            IncludeObject::Metadata,
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["metadata"]["resourceVersion"], "3");
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "User",
                "Pod",
                "Container",
                "Command",
                "Verb",
                "Age",
                "Replica"
            ]
        );
        let row = &t["rows"][0];
        assert_eq!(row["cells"].as_array().unwrap().len(), names.len());
        assert_eq!(row["cells"][0], "abcd-7");
        assert_eq!(row["object"]["metadata"]["namespace"], "team-a");
        let t = table(&[live], None, IncludeObject::None);
        assert!(t["rows"][0].get("object").is_none());
    }
}
