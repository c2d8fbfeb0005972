//! The Status an exec session ends with, and why. The ends the proxy itself puts to a session
//! are the same in both directions of translation (a v5 client to SPDY here, an SPDY client to
//! v5 in [`reverse`](crate::translate::reverse)): no data either way for the idle timeout, a
//! required recording failing, the drain, an upstream that stopped answering pings; each is
//! watched and worded here once.

use crate::session_stop::SessionStop;
use std::time::Duration;

use super::outcome::{SessionEndKind, SessionRecording};
use crate::activity_clock::ActivityClock;
use crate::session_memory::Refused;
use crate::translate::status::Status;

/// The Status a session ends with (the command's, or the proxy's reason), and why.
#[derive(Debug)]
pub struct EndStatus {
    pub status: Status,
    pub kind: SessionEndKind,
}

impl EndStatus {
    /// The upstream stopped answering the proxy's `pings` ("SPDY", "WebSocket") for `silent`.
    pub fn upstream_unresponsive(pings: &str, silent: Duration) -> EndStatus {
        EndStatus {
            status: Status::failure(
                504,
                "Timeout",
                format!(
                    "the upstream stopped answering: no reply to {pings} pings for {silent:?} \
                     (kube-ws-proxy --upstream-ping-timeout); the session was ended"
                ),
            ),
            kind: SessionEndKind::UpstreamUnresponsive,
        }
    }

    /// The upstream sent a frame the session's memory could not hold whole (`refused`: its
    /// cap, or the budget all sessions share).
    pub fn upstream_frame_refused(refused: &Refused) -> EndStatus {
        EndStatus {
            status: Status::failure(
                502,
                "BadGateway",
                format!(
                    "kube-ws-proxy ended the session: the upstream sent a frame of \
                     {} bytes; {refused}",
                    refused.wanted
                ),
            ),
            kind: SessionEndKind::UpstreamRefused,
        }
    }

    fn idle(quiet: Duration) -> EndStatus {
        EndStatus {
            status: Status::failure(
                504,
                "Timeout",
                format!(
                    "kube-ws-proxy ended the session: idle for {quiet:?}, no data either way \
                     (--stream-idle-timeout)"
                ),
            ),
            kind: SessionEndKind::IdleTimeout,
        }
    }

    fn recording_failed(why: &str) -> EndStatus {
        EndStatus {
            status: Status::failure(
                500,
                "InternalError",
                format!(
                    "kube-ws-proxy ended the session: its recording failed ({why}) and \
                     recordings are required (--record=required)"
                ),
            ),
            kind: SessionEndKind::RecordingFailed,
        }
    }

    /// `stop` fired: an operator's termination (who and why), else a drain.
    fn stopped(stop: &SessionStop) -> EndStatus {
        match stop.termination() {
            Some(t) => EndStatus {
                status: Status::failure(403, "Forbidden", t.message()),
                kind: SessionEndKind::Terminated,
            },
            None => EndStatus::drained(),
        }
    }

    /// Shutdown, or the session's cluster left the proxy's configuration: the command is
    /// still running; the client is told so rather than cut off.
    fn drained() -> EndStatus {
        EndStatus {
            status: Status::failure(
                503,
                "ServiceUnavailable",
                "kube-ws-proxy ended the session after the drain timeout: the proxy is shutting \
                 down, or the session's cluster left its configuration"
                    .into(),
            ),
            kind: SessionEndKind::Drained,
        }
    }
}

/// Resolves with the first end the proxy puts to a session whatever its direction: `data`
/// quiet for `idle_timeout`, a required recording failing (a best-effort one just stops), or
/// `stop`. Each is off while its setting is.
pub async fn first_proxy_end(
    data: &ActivityClock,
    idle_timeout: Option<Duration>,
    recording: Option<&SessionRecording>,
    stop: &SessionStop,
) -> EndStatus {
    let recording_failed = async {
        match recording.filter(|r| r.required) {
            Some(r) => r.recorder.failed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        quiet = data.quiet_for_limit(idle_timeout) => EndStatus::idle(quiet),
        why = recording_failed => EndStatus::recording_failed(&why),
        () = stop.stopped() => EndStatus::stopped(stop),
    }
}
