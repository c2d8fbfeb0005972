//! The one way a streaming session ends. Each kind of session says how it ended in a
//! [`Finished`]; [`Running::finish`] turns that into its audit `ended` event, gives its slot
//! back and counts it in the metrics, in that order, for every kind alike. A [`Running`] exists
//! from the session's admission ([`task`](super::task)), so that every
//! admitted session, whenever and however it ends, ends here. The registry of live sessions
//! (list, follow, end) hooks in here.

use std::sync::Arc;
use std::time::Duration;

use super::audit;
use super::task::ClientPresence;
use crate::audit::recording::RecordingFeed;
use crate::audit::upload::UploadState;
use crate::audit::{ProtocolPath, SessionAudit, SessionEnd as AuditEnd, SessionInfo};
use crate::proxy::observability::metrics::{SessionGuard, SessionKind, SessionOutcome};
use crate::proxy::sessions::registry::live::{Listing, LiveSession};
use crate::proxy::sessions::registry::SessionSlot;
use crate::proxy::sessions::state::ProxyState;
use crate::session_traffic::SessionTraffic;
use crate::translate::observe::PortForwardWatch;
use crate::translate::remote_command::{Outcome, SessionEndKind};
use crate::translate::tunnel::{TunnelEnd, TunnelOutcome};

/// A session from its admission to its end: its id, its audit trail (once started, if the
/// audit log is on), its `--max-sessions` slot, its metrics and whether its client is still
/// waiting for the answer; each ended exactly once by [`finish`](Self::finish) or
/// [`unstarted`](Self::unstarted) (or, should its task end without either, by the drops of
/// its parts: an `aborted` audit event and an `upstream_error` count).
pub struct Running {
    session_id: u64,
    audit: Option<SessionAudit>,
    /// Its place on the list of live sessions, from its audit trail's start to its end.
    listing: Option<Listing>,
    /// Its recording, if it is recorded: its `ended` event says whether its cap cut it short.
    recording: Option<RecordingFeed>,
    /// What it carried and when, counted by its runner, shown by its listing.
    traffic: Arc<SessionTraffic>,
    slot: SessionSlot,
    guard: SessionGuard,
    client: ClientPresence,
}

/// How a session ended, as its audit event and metrics say it.
pub struct Finished {
    /// The metric's outcome (and the event's `outcome` label).
    pub outcome: SessionOutcome,
    /// Bytes from the client towards the pod.
    pub bytes_in: u64,
    /// Bytes from the pod towards the client.
    pub bytes_out: u64,
    pub duration: Duration,
    /// Who or what ended it, in words.
    pub ended_by: &'static str,
    /// The command's exit code, where the session carried one.
    pub exit_code: Option<i32>,
    /// The final Status in short, where known.
    pub status: Option<String>,
    /// Why the recording could not start or was cut short.
    pub recording_error: Option<String>,
    /// The connections a port-forward was seen to carry (only when audited).
    pub port_forwards: Option<PortForwardWatch>,
    /// The upstream's HTTP status when it refused the session.
    pub refused_with: Option<u16>,
}

impl Finished {
    /// A session that moved bytes and ended for `ended_by`; nothing else known yet.
    pub fn new(
        outcome: SessionOutcome,
        bytes_in: u64,
        bytes_out: u64,
        duration: Duration,
        ended_by: &'static str,
    ) -> Finished {
        Finished {
            outcome,
            bytes_in,
            bytes_out,
            duration,
            ended_by,
            exit_code: None,
            status: None,
            recording_error: None,
            port_forwards: None,
            refused_with: None,
        }
    }

    /// A translated exec or attach (either direction) that ran to `outcome`, counted as
    /// `result`.
    pub fn remote_command(
        outcome: &Outcome,
        result: SessionOutcome,
        recording_error: Option<String>,
    ) -> Finished {
        Finished {
            exit_code: outcome.exit_code().map(i32::from),
            status: outcome.status.as_ref().map(|s| s.summary()),
            recording_error,
            refused_with: (outcome.end == SessionEndKind::UpstreamRefused)
                .then(|| outcome.status.as_ref().map(|s| u16::try_from(s.code).ok()))
                .flatten()
                .flatten(),
            ..Finished::new(
                result,
                outcome.bytes_in,
                outcome.bytes_out,
                outcome.duration,
                outcome.end.describe(),
            )
        }
    }

    /// A port-forward (tunnelled, or reverse-translated for a SPDY client) that ran to
    /// `outcome`; `watch` lists its connections in the audit event.
    pub fn tunnel(outcome: &TunnelOutcome, watch: Option<PortForwardWatch>) -> Finished {
        Finished::new(
            tunnel_outcome(outcome.ended_by),
            outcome.bytes_up,
            outcome.bytes_down,
            outcome.duration,
            outcome.ended_by.describe(),
        )
        .with_port_forwards(watch)
    }

    /// The same end, with the port-forward watch whose connections its event lists.
    pub fn with_port_forwards(self, watch: Option<PortForwardWatch>) -> Finished {
        Finished {
            port_forwards: watch,
            ..self
        }
    }

    /// The audit log's `ended` event.
    fn audit_event(self) -> AuditEnd {
        let end = AuditEnd {
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            duration_ms: self.duration.as_millis() as u64,
            exit_code: self.exit_code,
            status: self.status,
            outcome: self.outcome.label(),
            ended_by: self.ended_by,
            recording_error: self.recording_error,
            refused_with: self.refused_with,
            ..Default::default()
        };
        match self.port_forwards {
            Some(watch) => end.with_port_forwards(watch.finish()),
            None => end,
        }
    }
}

impl Running {
    /// The session `session_id` admitted with `slot`, counted by `guard` (from its admission),
    /// its client's presence told by `client`. Its audit trail starts later
    /// ([`start_audit`](Self::start_audit)), once the caller is identified.
    pub fn admitted(
        session_id: u64,
        slot: SessionSlot,
        guard: SessionGuard,
        client: ClientPresence,
    ) -> Running {
        Running {
            session_id,
            audit: None,
            listing: None,
            recording: None,
            traffic: Arc::new(SessionTraffic::new()),
            slot,
            guard,
            client,
        }
    }

    /// Its id (the audit events' and recording's `<replica>-<id>`, the log lines' `session`).
    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// Writes its audit `started` event (nothing without the audit log) and lists it among
    /// the live sessions (nothing for a request that names no pod), both describing it with
    /// the same shared [`SessionInfo`], followed through `recording` if it is recorded. Called
    /// once, before anything of the session goes upstream.
    pub fn start_audit(
        &mut self,
        state: &ProxyState,
        info: Option<SessionInfo>,
        recording: Option<RecordingFeed>,
    ) {
        debug_assert!(self.audit.is_none(), "a session's trail starts once");
        let Some(info) = info else {
            return;
        };
        let info = audit::bounded(state, info);
        let session = LiveSession::new(
            self.session_id,
            info.info.clone(),
            self.traffic.clone(),
            self.slot.stop(),
        );
        let live = state.sessions.live();
        self.recording = recording.clone();
        self.listing = Some(live.list(session.recorded(recording)));
        self.audit = audit::start_bounded(state, &info);
    }

    /// Where its runner counts what it carries (the sessions API shows it).
    pub fn traffic(&self) -> &Arc<SessionTraffic> {
        &self.traffic
    }

    /// Whether the client went away before it got its answer (its request was dropped).
    pub fn client_gone(&self) -> bool {
        self.client.is_gone()
    }

    /// The session took `path` as `kind` (`--upstream-streaming auto` decides on the upstream's
    /// answer), with `protocol` where it is known now: it runs, is counted and ends as that.
    pub fn took_path(&mut self, kind: SessionKind, path: ProtocolPath, protocol: Option<String>) {
        self.guard.relabel(kind);
        self.agreed(path, protocol);
    }

    /// What its `ended` event says of the path and the protocol the session agreed on (a
    /// relay or a tunnel learns it from the upstream's answer).
    pub fn agreed(&mut self, path: ProtocolPath, protocol: Option<String>) {
        if let Some(session) = self.listing.as_ref().and_then(Listing::session) {
            session.agreed(path, protocol.clone());
        }
        if let Some(audit) = self.audit.as_mut() {
            audit.set_path(path, protocol);
        }
    }

    /// The kind it runs and is counted as.
    pub fn kind(&self) -> SessionKind {
        self.guard.kind()
    }

    /// Whether the session is audited (the audit log is on and it names a pod).
    pub fn is_audited(&self) -> bool {
        self.audit.is_some()
    }

    /// What its audit events say about it, if it is audited.
    pub fn audit_info(&self) -> Option<&SessionInfo> {
        self.audit.as_ref().map(SessionAudit::info)
    }

    /// Its `--max-sessions` slot (the drain signal).
    pub fn slot(&self) -> &SessionSlot {
        &self.slot
    }

    /// Ends a session that ran: its audit `ended` event, then its slot, then its metrics.
    pub fn finish(self, end: Finished) {
        let (outcome, bytes_in, bytes_out) = (end.outcome, end.bytes_in, end.bytes_out);
        // Before the slot goes: a drained proxy exits once every slot is back.
        if let Some(audit) = self.audit {
            let mut event = end.audit_event();
            if let (SessionOutcome::Terminated, Some(t)) = (outcome, self.slot.stop().termination())
            {
                event.terminated_by = Some(t.by.clone());
                event.termination_reason = Some(t.reason.clone());
            }
            event.recording_truncated = self.recording.as_ref().and_then(|r| r.truncation());
            match self.recording.as_ref().and_then(|r| r.upload()) {
                Some(UploadState::Stored(stored)) => {
                    event.recording_object = Some(stored.object.clone());
                    event.recording_upload = Some("stored");
                }
                Some(UploadState::Pending) => event.recording_upload = Some("pending"),
                None => {}
            }
            audit.end(event);
        }
        drop(self.listing);
        drop(self.slot);
        self.guard.finish(outcome, bytes_in, bytes_out);
    }

    /// Ends a session that never carried a byte (its client's upgrade did not complete, or it
    /// was refused once admitted): its audit `ended` event, its metrics, then its slot.
    pub fn unstarted(
        self,
        outcome: SessionOutcome,
        ended_by: &'static str,
        recording_error: Option<String>,
    ) {
        self.end_unstarted(outcome, ended_by, None, recording_error, None);
    }

    /// Ends, as [`unstarted`](Self::unstarted) does, a session the upstream refused or never
    /// handed over once admitted; `why` is what its event's status says. Counted as
    /// `upstream_error`. `upstream_status` is the upstream's HTTP answer (0: none): a 401 or
    /// 403 is charged to the caller's address.
    pub fn upstream_refused(self, why: String, upstream_status: u16) {
        self.end_unstarted(
            SessionOutcome::UpstreamError,
            audit::UPSTREAM_REFUSED,
            Some(why),
            None,
            (upstream_status != 0).then_some(upstream_status),
        );
    }

    fn end_unstarted(
        self,
        outcome: SessionOutcome,
        ended_by: &'static str,
        status: Option<String>,
        recording_error: Option<String>,
        refused_with: Option<u16>,
    ) {
        audit::end_unstarted(
            self.audit,
            outcome,
            ended_by,
            status,
            recording_error,
            refused_with,
        );
        self.guard.finish(outcome, 0, 0);
        drop(self.listing);
        drop(self.slot);
    }
}

/// How a translated exec or attach that ran counts in the metrics.
pub fn remote_command_outcome(outcome: &Outcome) -> SessionOutcome {
    match outcome.end {
        SessionEndKind::Completed => match outcome.exit_code() {
            Some(0) => SessionOutcome::Success,
            Some(_) => SessionOutcome::NonZeroExit,
            None => SessionOutcome::UpstreamError,
        },
        SessionEndKind::UpstreamRefused => SessionOutcome::UpstreamError,
        SessionEndKind::ClientGone | SessionEndKind::ClientViolation => SessionOutcome::ClientGone,
        SessionEndKind::Drained => SessionOutcome::Drained,
        SessionEndKind::Terminated => SessionOutcome::Terminated,
        SessionEndKind::ClientUnresponsive => SessionOutcome::ClientUnresponsive,
        SessionEndKind::UpstreamUnresponsive => SessionOutcome::UpstreamUnresponsive,
        SessionEndKind::IdleTimeout => SessionOutcome::IdleTimeout,
        SessionEndKind::RecordingFailed => SessionOutcome::RecordingFailed,
    }
}

/// How a port-forward (tunnelled, or reverse-translated for a SPDY client) counts in the
/// metrics, by how it ended.
pub fn tunnel_outcome(end: TunnelEnd) -> SessionOutcome {
    match end {
        TunnelEnd::Drained => SessionOutcome::Drained,
        TunnelEnd::Terminated => SessionOutcome::Terminated,
        TunnelEnd::Upstream => SessionOutcome::Success,
        TunnelEnd::Client | TunnelEnd::ClientViolation => SessionOutcome::ClientGone,
        TunnelEnd::ClientUnresponsive => SessionOutcome::ClientUnresponsive,
        TunnelEnd::IdleTimeout => SessionOutcome::IdleTimeout,
    }
}
