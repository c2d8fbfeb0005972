//! `GET …/sessions?watch=true`: the live sessions as `ADDED` events, then every change as it
//! happens (`ADDED`; `MODIFIED` when an operator terminates one, and at most every
//! [`TRAFFIC_REFRESH`] for one whose bytes moved since the watch last told of it; `DELETED`
//! when one ends), one JSON object per line as the API server's watches send them, until
//! `timeoutSeconds`, the client's going away, or the watch falling [`WATCH_BACKLOG`] changes
//! behind (its client then lists again, as after any watch's end). An idle session is not
//! sent again: its `idleSeconds` grows by itself, and `lastActivity` says since when.
//!
//! A caller keeps at most [`WATCHES_PER_CALLER`] watches open, a replica
//! [`WATCHES_PER_REPLICA`]: one more is answered 429 with `Retry-After`.
//!
//! [`WATCH_BACKLOG`]: crate::proxy::sessions::registry::live::WATCH_BACKLOG
//! [`WATCHES_PER_CALLER`]: crate::proxy::sessions::registry::watchers::WATCHES_PER_CALLER
//! [`WATCHES_PER_REPLICA`]: crate::proxy::sessions::registry::watchers::WATCHES_PER_REPLICA

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::objects::Session;
use crate::proxy::auth::Caller;
use crate::proxy::sessions::registry::live::{
    ChangeKind, Changes, LiveSession, LiveSessions, TRAFFIC_REFRESH,
};
use crate::proxy::sessions::registry::watchers::{TooManyWatches, WatchPermit, WatcherKey};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// Events written ahead of a slow client before the watch waits for it.
const AHEAD: usize = 16;

/// How long a caller refused a watch is told to wait: watches last minutes, so a place
/// frees up at no particular moment.
const RETRY_AFTER_SECONDS: u64 = 10;

/// The watch of `cluster`'s sessions in `namespace` (`None`: all) on `live` for `caller`, for
/// at most `timeout`; or 429 when the caller or the replica has as many open as it may.
pub fn watch(
    live: &Arc<LiveSessions>,
    caller: &Caller,
    cluster: Option<String>,
    namespace: Option<String>,
    timeout: Duration,
) -> Response<ProxyBody> {
    let permit = match live.watchers().admit(watcher_key(caller)) {
        Ok(permit) => permit,
        Err(too_many) => return refused(too_many),
    };
    let (now, version, changes) = live.watch(cluster.as_deref(), namespace.as_deref());
    let (tx, rx) = mpsc::channel::<Bytes>(AHEAD);
    let watched = Watched {
        live: live.clone(),
        cluster,
        namespace,
        version,
        refresh: live.refresh_traffic(Instant::now().into_std()),
        _permit: permit,
    };
    tokio::spawn(async move {
        // Ends on the timeout; `send` fails once the client is gone (its body dropped).
        let _ = tokio::time::timeout(timeout, watched.run(now, changes, tx)).await;
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

/// Whom a watch is charged to: the user the proxy authenticated, or for a passthrough caller
/// (whom only the cluster knows) its address, as its reviews are charged.
fn watcher_key(caller: &Caller) -> WatcherKey {
    match caller {
        Caller::Identified { identity, .. } => WatcherKey::new("user", identity.user()),
        Caller::Passthrough { address, .. } => {
            let group = crate::address_budget::group(*address);
            WatcherKey::new("address", &group.to_string())
        }
    }
}

/// The 429 for a watch past its bounds.
fn refused(too_many: TooManyWatches) -> Response<ProxyBody> {
    let message = match too_many {
        TooManyWatches::Caller => {
            "too many watches of sessions open by this caller; try again later"
        }
        TooManyWatches::Replica => {
            "too many watches of sessions open on this replica; try again later"
        }
    };
    let mut resp = failure(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    resp
}

/// One watch: which sessions it is about, and how far it has told of them.
struct Watched {
    live: Arc<LiveSessions>,
    cluster: Option<String>,
    namespace: Option<String>,
    /// The list's version it has told of.
    version: u64,
    /// The traffic refresh it has told of.
    refresh: u64,
    /// Its place among the replica's watches, given back when it ends.
    _permit: WatchPermit,
}

impl Watched {
    /// Sends the sessions live now, then each change in scope and the traffic of those that
    /// moved, until the client is gone or the watch fell too far behind.
    async fn run(
        mut self,
        now: Vec<Arc<LiveSession>>,
        mut changes: Changes,
        tx: mpsc::Sender<Bytes>,
    ) {
        for session in now {
            if tx.send(event("ADDED", &session)).await.is_err() {
                return;
            }
        }
        let mut refresh = tokio::time::interval(TRAFFIC_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        refresh.tick().await;
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = refresh.tick() => {
                    if self.send_traffic(&tx).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = tx.closed() => return,
            };
            let change = match change {
                Ok(change) => change,
                // Fell behind, or the proxy is gone: the client lists again.
                Err(
                    broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed,
                ) => return,
            };
            self.version = change.version;
            if !change
                .session
                .is_in(self.cluster.as_deref(), self.namespace.as_deref())
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

    /// `MODIFIED` for each session in scope whose bytes moved since the watch last told of
    /// its traffic (and that it has told of at all).
    async fn send_traffic(&mut self, tx: &mpsc::Sender<Bytes>) -> Result<(), ()> {
        let refresh = self.live.refresh_traffic(Instant::now().into_std());
        let (cluster, namespace) = (self.cluster.as_deref(), self.namespace.as_deref());
        let moved = self
            .live
            .moved(cluster, namespace, self.version, self.refresh);
        self.refresh = refresh;
        for session in moved {
            tx.send(event("MODIFIED", &session)).await.map_err(|_| ())?;
        }
        Ok(())
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
