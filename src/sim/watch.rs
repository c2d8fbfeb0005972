//! `GET .../pods?watch=true`: a watch of pods, as kube-apiserver streams one (a JSON watch
//! event per line, chunked). Without a `resourceVersion` (or with `0`) it starts with an
//! `ADDED` for each pod; then every pod it covers is `MODIFIED` every 200 ms (its
//! `resourceVersion` going up), up to 300 times, or until the client goes. A
//! `fieldSelector=metadata.name=NAME` watches that pod alone (`kubectl get pod NAME --watch`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::logs::ChannelBody;
use super::objects;
use super::query::Query;
use super::response::Body;
use super::Inner;

/// Pause between rounds of `MODIFIED` events.
const PERIOD: Duration = Duration::from_millis(200);
/// Rounds of `MODIFIED` events before the watch ends.
const ROUNDS: u64 = 300;

/// Whether a read of pods is a watch.
pub(crate) fn wanted(query: &Query) -> bool {
    query.flag("watch")
}

/// The watch of the pods of `ns` (all namespaces: `None`) that `query` selects.
pub(crate) fn serve(inner: Arc<Inner>, query: &Query, ns: Option<&str>) -> Response<Body> {
    let by_name = query
        .first("fieldSelector")
        .and_then(|s| s.strip_prefix("metadata.name="));
    let pods = match by_name {
        Some(name) => vec![(ns.unwrap_or("default").to_owned(), name.to_owned())],
        None => inner.pods(ns),
    };
    let initial = matches!(query.first("resourceVersion"), None | Some("" | "0"));
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let event = |kind: &str, (ns, name): &(String, String), version: u64| {
            let mut pod = objects::pod(ns, name, inner.started);
            pod["metadata"]["resourceVersion"] = Value::String(version.to_string());
            let mut line = serde_json::to_vec(&json!({"type": kind, "object": pod})).unwrap();
            line.push(b'\n');
            Bytes::from(line)
        };
        if initial {
            for pod in &pods {
                if tx.send(event("ADDED", pod, 1)).await.is_err() {
                    return;
                }
            }
        }
        for round in 0..ROUNDS {
            tokio::select! {
                _ = tokio::time::sleep(PERIOD) => {}
                _ = inner.shutdown.cancelled() => return,
            }
            for pod in &pods {
                if tx.send(event("MODIFIED", pod, round + 2)).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut resp = Response::new(ChannelBody { rx }.boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
