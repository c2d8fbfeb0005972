//! An exec or attach's recording (translated either way, relayed or passed through): opened
//! before anything goes upstream, named in its audit `started` event, and finished with the
//! session. Under `--record=required` a recording that cannot start refuses the session.

use http::{Response, StatusCode};
use tracing::warn;

use crate::audit::recording::{RecordPolicy, Recorder, RecordingFeed, RecordingPlace};
use crate::audit::SessionInfo;
use crate::proxy::route::stream_request::{StreamRequest, StreamTarget};
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::translate::remote_command::SessionRecording;
use crate::translate::status::Status;

/// A session's recording as it started: recorded, not recorded (no `--record-dir`, or it
/// could not start), or refused for it.
#[derive(Default)]
pub struct OpenedRecording {
    /// The recording, when there is one.
    pub recording: Option<SessionRecording>,
    /// Why it could not start.
    error: Option<String>,
    /// It could not start and `--record=required`: the session is refused.
    refuses: bool,
}

impl OpenedRecording {
    /// Opens the recording of session `session_id` of `stream`, if recordings are on.
    pub async fn open(state: &ProxyState, session_id: u64, stream: &StreamRequest) -> Self {
        OpenedRecording::open_for(state, session_id, &stream.target).await
    }

    /// Opens the recording of session `session_id`, which `target` names, if recordings are
    /// on. A named cluster's recordings go in its own folder of `--record-dir`, and their
    /// title names it; the unnamed upstream's stay where they always were.
    pub async fn open_for(state: &ProxyState, session_id: u64, target: &StreamTarget) -> Self {
        let Some(recordings) = &state.recordings else {
            return OpenedRecording::default();
        };
        let required = recordings.policy() == RecordPolicy::Required;
        let id = crate::audit::instance::session_id(session_id);
        let name = state.cluster.name.as_ref().map(|n| n.as_str());
        let place = RecordingPlace {
            cluster: state.cluster.label(),
            folder: name,
            namespace: target.pod.as_ref().map_or("", |p| p.namespace.as_str()),
        };
        let mut title = target.recording_title();
        if let Some(name) = name {
            title.push_str(&format!(" in cluster {name}"));
        }
        let (command, tty) = (&target.options.command, target.options.tty);
        match recordings.open(place, &id, command, title, tty).await {
            Ok(recorder) => OpenedRecording {
                recording: Some(SessionRecording { recorder, required }),
                ..OpenedRecording::default()
            },
            Err(e) => {
                warn!(session = session_id, error = %e, "the session's recording could not start");
                OpenedRecording {
                    recording: None,
                    error: Some(e.to_string()),
                    refuses: required,
                }
            }
        }
    }

    /// Why the session is refused (its recording could not start under `--record=required`);
    /// `None` when it may go on.
    pub fn refusal(&self) -> Option<&str> {
        self.error.as_deref().filter(|_| self.refuses)
    }

    /// Why the recording could not start, if it could not.
    pub fn error(&self) -> Option<String> {
        self.error.clone()
    }

    /// The recording as its followers read it, if there is one.
    pub fn feed(&self) -> Option<RecordingFeed> {
        self.recording.as_ref().map(|r| r.recorder.feed())
    }

    /// Names the recording's file in the session's audit `started` event.
    pub fn name_in(&self, info: &mut Option<SessionInfo>) {
        if let (Some(info), Some(r)) = (info.as_mut(), &self.recording) {
            info.recording = Some(r.recorder.path().display().to_string());
        }
    }

    /// Its parts, for a relay that follows the session's bytes itself: the recorder, why the
    /// recording could not start, and whether recordings are required.
    pub fn into_parts(self) -> (Option<Recorder>, Option<String>, bool) {
        let required = self.refuses || self.recording.as_ref().is_some_and(|r| r.required);
        (self.recording.map(|r| r.recorder), self.error, required)
    }

    /// Finishes the recording of a session that ran, once its file is complete
    /// ([`Recorder::close`]); why it could not start or was cut short, if so. Awaited before
    /// the session's `ended` event is written.
    pub async fn finish(self) -> Option<String> {
        match (self.error, self.recording) {
            (Some(error), _) => Some(error),
            (None, Some(recording)) => recording.recorder.close().await,
            (None, None) => None,
        }
    }

    /// Finishes the recording of a session that never went upstream (nothing of it was
    /// recorded but the header), without waiting for the file; why it could not start, if so.
    pub fn finish_unstarted(self) -> Option<String> {
        self.error
            .or_else(|| self.recording.as_ref().and_then(|r| r.recorder.error()))
    }
}

/// What a client refused for its recording is told (`why`: why it could not start).
pub fn unrecordable(why: &str) -> String {
    format!(
        "kube-ws-proxy cannot record this session and recordings are required \
         (--record=required): {why}"
    )
}

/// The Status a translated exec or attach is told, inside its WebSocket, when it is refused
/// because it cannot be recorded under `--record=required`.
pub fn unrecordable_status(why: &str) -> Status {
    Status::failure(503, "ServiceUnavailable", unrecordable(why))
}

/// The HTTP answer (503) to a session refused before its upgrade because it cannot be
/// recorded under `--record=required`.
pub fn unrecordable_response(why: &str) -> Response<ProxyBody> {
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        unrecordable(why),
    )
}
