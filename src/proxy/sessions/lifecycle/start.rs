//! What every streaming session does between its admission and its first word to the
//! upstream, in the order that keeps the evidence ahead of the effect: the caller identified
//! (a TokenReview or SelfSubjectReview is not the session's request), an exec or attach's
//! recording opened, the audit `started` event written (naming the recording); then the
//! session goes upstream only if it may: under `--record=required` a session that cannot be
//! recorded is refused, and a session whose client already went away ends there, with nothing
//! asked of the upstream.

use http::Response;

use super::audit;
use super::end::Running;
use super::recording::{unrecordable_response, OpenedRecording};
use crate::audit::ProtocolPath;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::observability::metrics::SessionOutcome;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// A session whose trail has begun: its [`Running`] (audited from here) and its recording.
pub struct Begun {
    pub running: Running,
    pub recording: OpenedRecording,
}

/// Why a session that has begun does not go upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Its recording could not start and recordings are required: why.
    Unrecordable(String),
    /// Its client went away before it was answered.
    ClientGone,
}

/// Identifies the caller, opens the recording of an exec or attach (with `--record`), and
/// writes the session's audit `started` event, saying `path` and, where it is known before the
/// upstream answers, `protocol`. Nothing goes upstream here but the identity review.
pub async fn begin(
    state: &ProxyState,
    req: &UpgradeRequest,
    stream: &StreamRequest,
    running: &mut Running,
    path: ProtocolPath,
    protocol: Option<String>,
) -> OpenedRecording {
    let credentials = audit::outbound_credentials(state, &stream.caller, &req.parts.headers);
    let identity = audit::identify(state, &stream.caller, credentials).await;
    let recording = match stream.target.is_remote_command() {
        true => OpenedRecording::open(state, running.session_id(), stream).await,
        false => OpenedRecording::default(),
    };
    let mut info = audit::stream_info(running.session_id(), stream, identity, path, protocol);
    recording.name_in(&mut info);
    running.start_audit(state, info, recording.feed());
    recording
}

/// Whether a session that has begun may go upstream now: not when it cannot be recorded under
/// `--record=required`, nor when its client has gone.
pub fn may_go_upstream(running: &Running, recording: &OpenedRecording) -> Result<(), Held> {
    if let Some(why) = recording.refusal() {
        return Err(Held::Unrecordable(why.to_owned()));
    }
    if running.client_gone() {
        return Err(Held::ClientGone);
    }
    Ok(())
}

/// Ends a session held back before the upstream (`held`: why), counted and audited as every
/// session is; the answer for the client (a 503 for a session that cannot be recorded; the
/// answer to a client that is gone goes nowhere).
pub fn end_held(running: Running, recording: OpenedRecording, held: Held) -> Response<ProxyBody> {
    match held {
        Held::Unrecordable(why) => {
            let refusal = unrecordable_response(&why);
            running.unstarted(
                SessionOutcome::RecordingFailed,
                audit::REFUSED_UNRECORDABLE,
                recording.finish_unstarted(),
            );
            refusal
        }
        Held::ClientGone => {
            running.unstarted(
                SessionOutcome::ClientGone,
                audit::CLIENT_GONE_BEFORE_UPSTREAM,
                recording.finish_unstarted(),
            );
            failure(
                http::StatusCode::BAD_REQUEST,
                "BadRequest",
                "the client went away",
            )
        }
    }
}
