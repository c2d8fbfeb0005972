//! `GET …/sessions?watch=true`: the live sessions as `ADDED` events, then every change as it
//! happens (`ADDED`, `MODIFIED` when an operator terminates one, `DELETED` when one ends), one
//! JSON object per line as the API server's watches send them, until `timeoutSeconds`, the
//! client's going away, or the watch falling [`WATCH_BACKLOG`] changes behind (its client then
//! lists again, as after any watch's end).
//!
//! [`WATCH_BACKLOG`]: crate::proxy::sessions::registry::live::WATCH_BACKLOG

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::{broadcast, mpsc};

use super::objects::Session;
use crate::proxy::sessions::registry::live::{ChangeKind, Changes, LiveSession, LiveSessions};
use crate::proxy::wire::body::ProxyBody;

/// Events written ahead of a slow client before the watch waits for it.
const AHEAD: usize = 16;

/// The watch of `cluster`'s sessions in `namespace` (`None`: all) on `live`, for at most
/// `timeout`.
pub fn watch(
    live: &LiveSessions,
    cluster: Option<String>,
    namespace: Option<String>,
    timeout: Duration,
) -> Response<ProxyBody> {
    let (now, changes) = live.watch(cluster.as_deref(), namespace.as_deref());
    let (tx, rx) = mpsc::channel::<Bytes>(AHEAD);
    let scope = Scope { cluster, namespace };
    tokio::spawn(async move {
        // Ends on the timeout; `send` fails once the client is gone (its body dropped).
        let _ = tokio::time::timeout(timeout, run(now, changes, scope, tx)).await;
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, hyper::Error>(Frame::data(line)), rx))
    });
    let mut resp = Response::new(StreamBody::new(frames).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Which sessions a watch is about.
struct Scope {
    cluster: Option<String>,
    namespace: Option<String>,
}

/// Sends the sessions live now, then each change in `scope`, until the client is gone or the
/// watch fell too far behind.
async fn run(
    now: Vec<Arc<LiveSession>>,
    mut changes: Changes,
    scope: Scope,
    tx: mpsc::Sender<Bytes>,
) {
    for session in now {
        if tx.send(event("ADDED", &session)).await.is_err() {
            return;
        }
    }
    loop {
        let change = tokio::select! {
            change = changes.recv() => change,
            () = tx.closed() => return,
        };
        let change = match change {
            Ok(change) => change,
            // Fell behind, or the proxy is gone: the client lists again.
            Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => {
                return
            }
        };
        if !change
            .session
            .is_in(scope.cluster.as_deref(), scope.namespace.as_deref())
        {
            continue;
        }
        let kind = match change.kind {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        };
        if tx.send(event(kind, &change.session)).await.is_err() {
            return;
        }
    }
}

/// One watch event, as a line.
fn event(kind: &str, session: &LiveSession) -> Bytes {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "type": kind,
        "object": Session::of(session),
    }))
    .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
