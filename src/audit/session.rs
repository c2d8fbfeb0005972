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

/// What a session's events say of it, cut to the caps once ([`bounds::bound_info`]) and held
/// once: its audit trail and the registry of live sessions share it.
#[derive(Debug, Clone)]
pub struct BoundedInfo {
    pub info: Arc<SessionInfo>,
    /// What had to be cut.
    pub truncated: Truncations,
}

impl BoundedInfo {
    /// `info`, cut to the caps.
    pub fn new(mut info: SessionInfo) -> BoundedInfo {
        let truncated = bounds::bound_info(&mut info);
        BoundedInfo {
            info: Arc::new(info),
            truncated,
        }
    }
}

/// One session's audit trail.
#[derive(Debug)]
pub struct SessionAudit {
    log: Arc<AuditLog>,
    /// As the `started` event said it; shared, so changed (a copy made) only for the `ended`
    /// event, where the path or the ports differ.
    info: Arc<SessionInfo>,
    /// What the `started` event had to cut.
    truncated: Truncations,
    started: Instant,
    ended: bool,
}

impl SessionAudit {
    /// Writes the `started` event.
    pub fn start(log: Arc<AuditLog>, info: BoundedInfo) -> SessionAudit {
        let audit = SessionAudit {
            log,
            info: info.info,
            truncated: info.truncated,
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
    /// `auto`), and a relayed session's protocol is in the upstream's answer. Once per
    /// session at most, off the hot path: the copy of a shared info is made here.
    pub fn set_path(&mut self, path: ProtocolPath, protocol: Option<String>) {
        if self.info.protocol_path == path && (protocol.is_none() || protocol == self.info.protocol)
        {
            return;
        }
        let info = Arc::make_mut(&mut self.info);
        info.protocol_path = path;
        if protocol.is_some() {
            info.protocol = protocol;
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
            Arc::make_mut(&mut self.info).ports = ports;
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
