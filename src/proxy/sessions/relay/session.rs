//! A relayed session once the upstream switched protocols and the client was answered: in
//! the background, the client's upgrade is awaited, bytes are relayed both ways until the
//! session ends (either side, drain, idle, an unresponsive client, a recording that failed
//! under `--record=required`), and its end is audited, counted and logged.

use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tracing::{debug, info, warn};

use super::pings::PingInjector;
use super::pump::{pump, RelayHooks, RelayKeepalive};
use super::recording::{RelayTap, TapEnd};
use crate::activity_clock::ActivityClock;
use crate::peer_hangup::PeerHangup;
use crate::proxy::observability::metrics::{SessionKind, SessionOutcome};
use crate::proxy::sessions::lifecycle::audit;
use crate::proxy::sessions::lifecycle::end::{Finished, Running};
use crate::proxy::wire::client_stream::ClientStream;
use crate::translate::observe::PortForwardWatch;
use crate::translate::ws::{Keepalive, Liveness};

/// A relayed session the upstream switched protocols for, as it goes to the background.
pub(super) struct RelaySession {
    /// The request's path, for the log line.
    pub path: String,
    pub kind: SessionKind,
    pub session_id: u64,
    /// Its audit trail, admission and metrics, each ended once when the session ends.
    pub running: Running,
    /// Why the session is not recorded, if it should be and is not.
    pub recording_error: Option<String>,
    /// The client connection and how it asked.
    pub client_stream: ClientStream,
    /// Who asked, for the log line.
    pub user: Option<String>,
    /// The recording, or the watch for the exit code.
    pub tap: Option<RelayTap>,
    /// A port-forward's audit.
    pub watch: Option<PortForwardWatch>,
    /// `--handshake-timeout`, for the client's upgrade.
    pub handshake_timeout: Duration,
    /// `--close-drain-timeout`: how long one direction may outlive the other.
    pub linger: Duration,
    /// Pings to the client of a relayed WebSocket.
    pub keepalive: Option<Keepalive>,
    /// `--stream-idle-timeout`, where it applies.
    pub idle_timeout: Option<Duration>,
    /// The TCP socket under the upstream connection this session is given.
    pub upstream_hangup: Option<PeerHangup>,
}

/// How the relay ended, and why the recording failed if that ended it.
struct Ended {
    outcome: SessionOutcome,
    recording_failure: Option<String>,
}

impl RelaySession {
    /// Waits for the client's upgrade, relays until the session ends, then finishes it.
    pub async fn run(
        self,
        on_upgrade: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::Upgraded,
    ) {
        let client = match tokio::time::timeout(self.handshake_timeout, on_upgrade).await {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                debug!(error = %e, "client upgrade failed");
                self.client_gone();
                return;
            }
            Err(_) => {
                debug!("client upgrade timed out");
                self.client_gone();
                return;
            }
        };
        let started = Instant::now();
        let ended = self
            .relay_until_ended(TokioIo::new(client), TokioIo::new(upstream))
            .await;
        self.finish(ended, started).await;
    }

    /// The client went before its upgrade: nothing was relayed.
    fn client_gone(self) {
        self.running.unstarted(
            SessionOutcome::ClientGone,
            audit::CLIENT_UPGRADE_FAILED,
            None,
        );
    }

    /// Relays until the session ends, and says why it did.
    async fn relay_until_ended<C, U>(&self, client: C, upstream: U) -> Ended
    where
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        // A relay carries a protocol we do not parse: on shutdown it can only be cut. A tap
        // that follows it (a recording, the audit log's exit code) knows where its frames
        // begin, so that a termination's Status can go between two of them.
        let activity = ActivityClock::new();
        let idle = async {
            match self.idle_timeout {
                Some(limit) => activity.quiet_for(limit).await,
                None => std::future::pending().await,
            }
        };
        let must_end = async {
            match &self.tap {
                Some(tap) => tap.must_end().await,
                None => std::future::pending().await,
            }
        };
        let mut recording_failure = None;
        let liveness = Liveness::new(self.keepalive);
        let hooks = RelayHooks {
            tap: self.tap.as_ref(),
            watch: self.watch.as_ref(),
            keepalive: self.keepalive.map(|k| RelayKeepalive {
                pings: PingInjector::new(k.interval),
                liveness: liveness.clone(),
            }),
            linger: Some(self.linger),
            upstream_hangup: self.upstream_hangup,
            stop: Some(self.running.slot().stop()),
        };
        let session_id = self.session_id;
        let traffic = self.running.traffic();
        let mut relay = Box::pin(pump(client, upstream, traffic, &activity, hooks));
        let mut relay_done = false;
        let outcome = tokio::select! {
            // A relay that delivered an operator's termination then ends with its client:
            // when both are ready the select may take either, and the session ended as the
            // operator's, not as a client that closed.
            () = &mut relay => {
                relay_done = true;
                match self.running.slot().stop().termination() {
                    Some(_) => SessionOutcome::Terminated,
                    None => SessionOutcome::Success,
                }
            }
            silent = liveness.lost() => {
                info!(session = session_id, silent_ms = silent.as_millis() as u64, "relayed session ended: the client stopped answering pings");
                SessionOutcome::ClientUnresponsive
            }
            _ = self.running.slot().stop().stopped_owned() => match self.running.slot().stop().termination() {
                Some(_) => SessionOutcome::Terminated,
                None => SessionOutcome::Drained,
            },
            _ = idle => SessionOutcome::IdleTimeout,
            e = must_end => {
                warn!(session = session_id, error = %e, "relayed session ended: its recording failed and recordings are required");
                recording_failure = Some(e);
                SessionOutcome::RecordingFailed
            }
        };
        if !relay_done && self.ends_itself(outcome) {
            // The relay ends it itself: the frame the client has begun, the Status, and the
            // client's own close, within the close drain timeout; then both are cut.
            let _ = tokio::time::timeout(self.linger, &mut relay).await;
        }
        drop(relay);
        // A relay that ended the session itself before the select saw why.
        match self.tap.as_ref().and_then(RelayTap::must_have_ended) {
            Some(e) if outcome == SessionOutcome::Success => Ended {
                outcome: SessionOutcome::RecordingFailed,
                recording_failure: Some(e),
            },
            _ => Ended {
                outcome,
                recording_failure,
            },
        }
    }

    /// Whether the relay ends a session that ran to `outcome` itself, with a Status of the
    /// proxy's: a required recording that failed, or an operator's termination where the tap
    /// can say it. Anything else is cut.
    fn ends_itself(&self, outcome: SessionOutcome) -> bool {
        match outcome {
            SessionOutcome::RecordingFailed => true,
            SessionOutcome::Terminated => self.tap.as_ref().is_some_and(RelayTap::terminable),
            _ => false,
        }
    }

    /// Audits, counts and logs the end of a session that ran since `started`.
    async fn finish(self, ended: Ended, started: Instant) {
        let TapEnd {
            exit_code,
            status,
            recording_error: tap_error,
        } = match self.tap {
            Some(tap) => tap.finish().await,
            None => TapEnd::default(),
        };
        // A command that ended with a non-zero exit code is counted as such, as on the
        // translated path (the relay only knows it where it followed the stream).
        let outcome = match (ended.outcome, exit_code) {
            (SessionOutcome::Success, Some(code)) if code != 0 => SessionOutcome::NonZeroExit,
            (outcome, _) => outcome,
        };
        let recording_error = ended
            .recording_failure
            .or(tap_error)
            .or(self.recording_error);
        let duration = started.elapsed();
        let (bytes_in, bytes_out) = self.running.traffic().moved();
        self.running.finish(
            Finished {
                exit_code,
                status,
                recording_error,
                ..Finished::new(outcome, bytes_in, bytes_out, duration, ended_by(outcome))
            }
            .with_port_forwards(self.watch),
        );
        info!(
            session = self.session_id,
            kind = self.kind.label(),
            user = self.user.as_deref().unwrap_or(""),
            http_version = self.client_stream.form.http_version(),
            connection = self.client_stream.connection.0,
            path = crate::audit::bounds::log_field(&self.path),
            outcome = outcome.label(),
            bytes_up = bytes_in,
            bytes_down = bytes_out,
            duration_ms = duration.as_millis() as u64,
            "relayed upgrade finished"
        );
    }
}

/// What the audit event says ended a relayed session that ran to `outcome`.
fn ended_by(outcome: SessionOutcome) -> &'static str {
    match outcome {
        SessionOutcome::Drained => "drained",
        SessionOutcome::Terminated => "terminated",
        SessionOutcome::IdleTimeout => "idle timeout",
        SessionOutcome::RecordingFailed => "recording failed",
        SessionOutcome::ClientUnresponsive => "client unresponsive",
        _ => "connection closed",
    }
}
