//! Session audit (`--audit-log`): one JSON line when a streaming session starts and one when
//! it ends, for exec, attach, cp (an exec of `tar`), port-forward and followed logs, whatever
//! path the session takes through the proxy. The Kubernetes audit log records that a session
//! was asked for; these events say who held it, on which pod, how long, how many bytes each
//! way and how it ended.
//!
//! - [`event`]: what an event says.
//! - [`bounds`]: what an event may carry from its caller: each field's cap, and the event's.
//! - [`refusals`]: how many refused sessions one caller address may have audited.
//! - [`log_file`]: where events go (a file with size-based rotation, or stdout), written off
//!   the sessions' tasks through a bounded queue.
//! - [`port_forward`]: what a port-forward carried, connection by connection.
//! - [`session`]: the handle a session holds between its two events.
//! - [`recording`]: asciicast recordings of exec and attach sessions.
//! - [`upload`]: recordings to an S3-compatible object store.
//!
//! Uses no protocol code (`translate`, `spdy`, `proxy`): the sessions that hold an audit
//! handle or a recorder depend on it, never the reverse.

pub mod bounds;
pub mod event;
pub mod instance;
pub mod log_file;
pub mod port_forward;
pub mod recording;
pub mod refusals;
pub mod session;
pub mod upload;

pub use event::{
    HttpVersion, IdentitySource, ImpersonatedUser, ProtocolPath, SessionEnd, SessionInfo, Verb,
    CLIENT_GONE_BEFORE_UPSTREAM, CLIENT_UPGRADE_FAILED, UPSTREAM_REFUSED,
};
pub use log_file::{AuditCounters, AuditLog, AuditLogConfig, AuditTarget};
pub use port_forward::{ForwardedConnection, PortForwardReport};
pub use refusals::RefusalLimits;
pub use session::{BoundedInfo, SessionAudit};
