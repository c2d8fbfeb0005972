//! How an exec session ended, in either direction of translation: the bytes, the Status, why.

use std::time::{Duration, Instant};

use crate::audit::recording::Recorder;
use crate::translate::status::Status;

/// How a session ended, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// stdin bytes received from the client.
    pub bytes_in: u64,
    /// stdout/stderr bytes sent to the client.
    pub bytes_out: u64,
    /// The Status the session ended with (the command's result, or the proxy's reason), as
    /// queued on channel 3; a client that no longer read may not have got it, and `end` says
    /// why the session ended. Audit events take the exit code from here either way.
    pub status: Option<Status>,
    /// Why the session ended.
    pub end: SessionEndKind,
    pub duration: Duration,
}

impl Outcome {
    /// The outcome of a session `started` then, ending now.
    pub(crate) fn since(
        started: Instant,
        bytes_in: u64,
        bytes_out: u64,
        status: Option<Status>,
        end: SessionEndKind,
    ) -> Outcome {
        Outcome {
            bytes_in,
            bytes_out,
            status,
            end,
            duration: started.elapsed(),
        }
    }

    /// The command's exit code, when its final Status carried one.
    pub fn exit_code(&self) -> Option<u8> {
        self.status.as_ref().and_then(Status::exit_code)
    }

    /// The final Status in short, empty when there was none (for log lines).
    pub fn status_summary(&self) -> String {
        self.status
            .as_ref()
            .map(Status::summary)
            .unwrap_or_default()
    }
}

/// Why a translated session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEndKind {
    /// The command finished and its status was delivered.
    Completed,
    /// The client went away first; the upstream session was torn down.
    ClientGone,
    /// The client broke the protocol and was closed with an error code.
    ClientViolation,
    /// The upstream refused the session; its Status was delivered.
    UpstreamRefused,
    /// The proxy shut down before the command finished; a Failure Status said so.
    Drained,
    /// The client stopped answering pings; the upstream session was torn down.
    ClientUnresponsive,
    /// The upstream stopped answering pings; a Failure Status said so.
    UpstreamUnresponsive,
    /// No data either way for the idle timeout; a Failure Status said so.
    IdleTimeout,
    /// The recording failed under `--record=required`; a Failure Status said so.
    RecordingFailed,
    /// An operator ended it (the sessions API); a Failure Status said who and why.
    Terminated,
}

impl SessionEndKind {
    /// How the session log says it (`close_reason`).
    pub fn describe(self) -> &'static str {
        match self {
            SessionEndKind::Completed => "completed",
            SessionEndKind::ClientGone => "client gone",
            SessionEndKind::ClientViolation => "client protocol violation",
            // The audit's words: a session that never ran is charged to its caller's address.
            SessionEndKind::UpstreamRefused => crate::audit::UPSTREAM_REFUSED,
            SessionEndKind::Drained => "drained",
            SessionEndKind::ClientUnresponsive => "client unresponsive",
            SessionEndKind::UpstreamUnresponsive => "upstream unresponsive",
            SessionEndKind::IdleTimeout => "idle timeout",
            SessionEndKind::RecordingFailed => "recording failed",
            SessionEndKind::Terminated => "terminated",
        }
    }
}

/// A session's recording, and whether the session must end when it fails.
#[derive(Debug)]
pub struct SessionRecording {
    pub recorder: Recorder,
    /// `--record=required`.
    pub required: bool,
}
