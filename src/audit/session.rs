//! The handle a session holds between its two events: `started` when it is made, `ended` when
//! the session says how it ended, or, should the session's task end without saying, when the
//! handle is dropped (so that every start has its end).
//!
//! What the events carry from the caller is cut to its caps first ([`bounds`](super::bounds)),
//! and a session that never ran is charged to its caller's address
//! ([`RefusalBudget`](super::refusals::RefusalBudget)).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::bounds::{self, Truncations};
use super::event::{Event, ProtocolPath, SessionEnd, SessionInfo};
use super::log_file::AuditLog;
use crate::timestamp::rfc3339_millis;

/// One session's audit trail.
#[derive(Debug)]
pub struct SessionAudit {
    log: Arc<AuditLog>,
    info: SessionInfo,
    /// What the `started` event had to cut.
    truncated: Truncations,
    started: Instant,
    ended: bool,
}

impl SessionAudit {
    /// Writes the `started` event.
    pub fn start(log: Arc<AuditLog>, mut info: SessionInfo) -> SessionAudit {
        let truncated = bounds::bound_info(&mut info);
        let audit = SessionAudit {
            log,
            info,
            truncated,
            started: Instant::now(),
            ended: false,
        };
        audit.emit("started", None, &audit.truncated);
        audit
    }

    /// What the session's events say about it.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// The path the session took and the protocol it agreed on, for its `ended` event: under
    /// `--upstream-streaming auto` the path is decided after the `started` event (which says
    /// `auto`), and a relayed session's protocol is in the upstream's answer.
    pub fn set_path(&mut self, path: ProtocolPath, protocol: Option<String>) {
        self.info.protocol_path = path;
        if protocol.is_some() {
            self.info.protocol = protocol;
        }
    }

    /// Time since the start.
    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Writes the `ended` event of a session that never carried a byte: refused, or whose
    /// client never completed its upgrade.
    pub fn end_unstarted(
        self,
        outcome: &'static str,
        ended_by: &'static str,
        status: Option<String>,
        recording_error: Option<String>,
        refused_with: Option<u16>,
    ) {
        let duration_ms = self.elapsed_ms();
        self.end(SessionEnd {
            duration_ms,
            status,
            refused_with,
            outcome,
            ended_by,
            recording_error,
            ..SessionEnd::default()
        });
    }

    /// Writes the `ended` event; a session that never ran is charged to its caller's address.
    pub fn end(mut self, mut end: SessionEnd) {
        self.ended = true;
        let mut truncated = self.truncated.merged(&bounds::bound_end(&mut end));
        if let Some(mut ports) = end.ports_seen.take() {
            truncated = truncated.merged(&bounds::bound_ports(&mut ports));
            self.info.ports = ports;
        }
        if let (true, Some(caller)) = (end.charges_caller(), self.info.charged_to) {
            self.log.refusals().charge(caller);
        }
        self.emit("ended", Some(&end), &truncated);
    }

    fn emit(&self, stage: &'static str, end: Option<&SessionEnd>, truncated: &Truncations) {
        self.log.emit(&Event {
            time: rfc3339_millis(SystemTime::now()),
            stage,
            info: &self.info,
            end,
            truncated: (!truncated.is_empty()).then_some(truncated),
        });
    }
}

impl Drop for SessionAudit {
    fn drop(&mut self) {
        if !self.ended {
            let end = SessionEnd {
                bytes_in: 0,
                bytes_out: 0,
                duration_ms: self.elapsed_ms(),
                exit_code: None,
                status: None,
                outcome: "aborted",
                ended_by: "the proxy's session task ended without a result",
                recording_error: None,
                ..Default::default()
            };
            self.emit("ended", Some(&end), &self.truncated);
        }
    }
}
