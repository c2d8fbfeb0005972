//! The handle a session holds between its two events: `started` when it is made, `ended` when
//! the session says how it ended, or, should the session's task end without saying, when the
//! handle is dropped (so that every start has its end).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::event::{Event, ProtocolPath, SessionEnd, SessionInfo};
use super::log_file::AuditLog;
use crate::timestamp::rfc3339_millis;

/// One session's audit trail.
#[derive(Debug)]
pub struct SessionAudit {
    log: Arc<AuditLog>,
    info: SessionInfo,
    started: Instant,
    ended: bool,
}

impl SessionAudit {
    /// Writes the `started` event.
    pub fn start(log: Arc<AuditLog>, info: SessionInfo) -> SessionAudit {
        let audit = SessionAudit {
            log,
            info,
            started: Instant::now(),
            ended: false,
        };
        audit.emit("started", None);
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
    ) {
        let duration_ms = self.elapsed_ms();
        self.end(SessionEnd {
            duration_ms,
            status,
            outcome,
            ended_by,
            recording_error,
            ..SessionEnd::default()
        });
    }

    /// Writes the `ended` event.
    pub fn end(mut self, mut end: SessionEnd) {
        self.ended = true;
        if let Some(ports) = end.ports_seen.take() {
            self.info.ports = ports;
        }
        self.emit("ended", Some(&end));
    }

    fn emit(&self, stage: &'static str, end: Option<&SessionEnd>) {
        self.log.emit(&Event {
            time: rfc3339_millis(SystemTime::now()),
            stage,
            info: &self.info,
            end,
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
            self.emit("ended", Some(&end));
        }
    }
}
