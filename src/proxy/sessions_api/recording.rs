//! `GET …/namespaces/NS/sessions/ID/recording`: the session's asciicast so far
//! (`application/x-asciicast`); with `?follow=true`, as it grows, until the session ends and
//! its file is complete. A live session's recording, one that ended lately (the registry
//! remembers the last 1,024), or an older one found on disk by its name and header.
//!
//! A reader has a place among [`READERS_MAX`] (and [`READERS_PER_ADDRESS`] per address; a
//! 429 otherwise), reads the file with its own file handle, and costs the session nothing
//! ([`crate::audit::recording::follow`]).
//!
//! [`READERS_MAX`]: crate::proxy::sessions::registry::readers::READERS_MAX
//! [`READERS_PER_ADDRESS`]: crate::proxy::sessions::registry::readers::READERS_PER_ADDRESS

use std::fs::File;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use crate::audit::recording::follow::{open_regular, AHEAD_CHUNKS};
use crate::audit::recording::{RecordingFeed, SessionKey};
use crate::audit::upload::Store;
use crate::proxy::auth::Caller;
use crate::proxy::sessions::registry::live::RecordingLookup;
use crate::proxy::sessions::registry::readers::ReadersFull;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// The media type of an asciicast, as asciinema's server serves one.
pub const ASCIICAST: &str = "application/x-asciicast";

/// How long a reader turned away for want of a place is told to wait.
const RETRY_AFTER_SECONDS: &str = "5";

/// Which session's recording, and how.
#[derive(Debug, Clone)]
pub struct RecordingCall {
    pub namespace: String,
    pub name: String,
    /// Follow it as it grows until the session ends (`?follow=true`).
    pub follow: bool,
}

/// Answers a call `caller` is authorized for: the recording as a body that streams it, or why
/// not (404 when the session is not recorded or its file is gone, 429 when readers are many);
/// `None` when this replica knows no such session (another replica may).
pub async fn serve(
    state: &ProxyState,
    caller: &Caller,
    call: RecordingCall,
) -> Option<Response<ProxyBody>> {
    let place = match state.sessions.recording_readers().take(caller.address()) {
        Ok(place) => place,
        Err(full) => return Some(too_many(full)),
    };
    let found = match find(state, &call).await {
        Ok(found) => found,
        Err(Missing::Unknown) => return None,
        Err(Missing::Answer(answer)) => return Some(answer),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(AHEAD_CHUNKS);
    tokio::spawn(async move {
        // The place is held as long as the recording is being sent.
        let _place = place;
        match found {
            Found::File(file, feed) => feed.send(file, tx, call.follow).await,
            Found::Stored(store, key) => {
                if let Err(e) = store.send_object(&key, tx).await {
                    // The answer's head is sent: the body ends short, as a cut file's would.
                    tracing::warn!(key = %key, error = %e, "a stored recording could not be read back");
                }
            }
        }
    });
    Some(asciicast_body(rx))
}

/// Where a recording is read from.
enum Found {
    /// Its file in the spool, written as its feed says.
    File(File, RecordingFeed),
    /// Uploaded and gone from the spool: the object at this key (`--record-upload`).
    Stored(Store, String),
}

/// Why there is no recording to send.
enum Missing {
    /// This replica knows no such session.
    Unknown,
    /// It does, and this answer says why there is none.
    Answer(Response<ProxyBody>),
}

impl From<Response<ProxyBody>> for Missing {
    fn from(answer: Response<ProxyBody>) -> Missing {
        Missing::Answer(answer)
    }
}

/// The session's recording, opened: a live session's or one that ended lately, as the
/// registry has it, or one found on disk; or why there is none.
async fn find(state: &ProxyState, call: &RecordingCall) -> Result<Found, Missing> {
    let cluster = state.cluster.name.as_ref().map(|n| n.as_str());
    let (namespace, name) = (call.namespace.as_str(), call.name.as_str());
    let feed = match state.sessions.live().recording(cluster, namespace, name) {
        RecordingLookup::Recorded(feed) => feed,
        RecordingLookup::NotRecorded => return Err(not_recorded(name).into()),
        RecordingLookup::Unknown => {
            let key = SessionKey {
                session_id: name,
                namespace,
                cluster,
            };
            let found = match &state.recordings {
                Some(recordings) => recordings.find(&key).await,
                None => None,
            };
            return found
                .map(|(file, feed)| Found::File(file, feed))
                .ok_or(Missing::Unknown);
        }
    };
    let path = feed.path().to_owned();
    match tokio::task::spawn_blocking(move || open_regular(&path)).await {
        Ok(Ok((file, _))) => Ok(Found::File(file, feed)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => match stored(state, &feed) {
            Some(found) => Ok(found),
            None => Err(gone(name).into()),
        },
        _ => Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("the recording of sessions.kube-ws-proxy.io \"{name}\" cannot be read"),
        )
        .into()),
    }
}

/// A recording that left the spool for the store: read back from there.
fn stored(state: &ProxyState, feed: &RecordingFeed) -> Option<Found> {
    let stored = feed.stored()?;
    let uploader = state.recordings.as_ref()?.uploader()?;
    Some(Found::Stored(uploader.store().clone(), stored.key.clone()))
}

/// The 404 for a session that is live but not recorded. A 404, not a 409: the subresource
/// does not exist for this session and never will (a session is recorded from its start or
/// not at all), so there is no state to wait for or retry against.
fn not_recorded(name: &str) -> Response<ProxyBody> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("sessions.kube-ws-proxy.io \"{name}\" is not recorded"),
    )
}

/// The 404 for a recording the proxy knows of whose file is no longer there.
fn gone(name: &str) -> Response<ProxyBody> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("the recording of sessions.kube-ws-proxy.io \"{name}\" is no longer on disk"),
    )
}

/// The 429 for a reader with no place.
fn too_many(full: ReadersFull) -> Response<ProxyBody> {
    let whose = match full {
        ReadersFull::All => "the proxy is serving as many recordings as it serves at once",
        ReadersFull::Address => "this client address is reading as many recordings as it may",
    };
    let mut resp = failure(
        StatusCode::TOO_MANY_REQUESTS,
        "TooManyRequests",
        format!("{whose}; try again later"),
    );
    resp.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECONDS),
    );
    resp
}

/// A 200 whose body is what comes on `rx`, as an asciicast that is not to be cached.
fn asciicast_body(rx: mpsc::Receiver<Bytes>) -> Response<ProxyBody> {
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, hyper::Error>(Frame::data(chunk)), rx))
    });
    let mut resp = Response::new(StreamBody::new(frames).boxed());
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ASCIICAST));
    // What a session showed may hold secrets: no cache keeps it.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}
