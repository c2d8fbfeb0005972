//! Passive observers of relayed sessions: fed the bytes a relay copies each way, they follow
//! the protocol the two ends agreed on (SPDY/3.1 or a legacy WebSocket channel protocol) and
//! say what the session carried — for exec/attach stdin, stdout, stderr, terminal sizes and
//! the error stream, so that the relay can record it; for a SPDY port-forward (relayed or in
//! the tunnel) each forwarded connection's port and bytes, for its audit event
//! ([`PortForwardWatch`]). Not a byte on the wire is changed.
//!
//! Pure logic, no sockets. Memory is bounded: an observer holds at most one incomplete frame
//! (or message) per direction, up to [`MAX_FRAME`] bytes, and with a memory lane
//! ([`Observer::charging`], [`PortForwardWatch::charging`]) holds them from its session's
//! memory: a frame the lane refuses (past the session's cap, or the budget all sessions share
//! spent) stops the observation like any other. Whatever it cannot follow ends the observation
//! with one error; the relay goes on regardless, the observer is never in its way.

mod port_forward;
mod spdy;
mod tunnel;
mod websocket;

#[cfg(test)]
mod header_tests;
#[cfg(test)]
mod memory_tests;
#[cfg(test)]
mod port_forward_tests;
#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tunnel_tests;

use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

pub use port_forward::{OpenForwards, MAX_CONNECTIONS};
pub use spdy::{RemoteCommandStreams, SpdyObserver};
pub use tunnel::TunnelObserver;
pub use websocket::{WebSocketFraming, WebSocketObserver};

use crate::audit::port_forward::PortForwardReport;
use crate::session_memory::{Held, MemoryLane, Refused};
use crate::translate::resize::TerminalSize;
use crate::translate::status::Status;

/// The SPDY stream protocol of port-forward sessions.
pub const PORT_FORWARD: &str = "portforward.k8s.io";

/// Largest frame (SPDY) or message (WebSocket) an observer buffers, payload and head. Clients
/// and kubelets write their streams in pieces of 32 KiB at most; 1 MiB leaves a wide margin.
pub const MAX_FRAME: usize = 1 << 20;

/// Most bytes of the error stream kept for the session's end (a Status is a few hundred).
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// Which way bytes were relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the upstream: stdin and terminal sizes.
    ClientToUpstream,
    /// From the upstream to the client: stdout, stderr and the error stream.
    UpstreamToClient,
}

/// What one piece of relayed bytes carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// What the client sent to the process.
    Stdin(Bytes),
    /// The process's stdout, as the client got it.
    Stdout(Bytes),
    /// The process's stderr, as the client got it.
    Stderr(Bytes),
    /// The client's terminal size.
    Resize(TerminalSize),
    /// Bytes of the error stream (a Status, or a text message on the oldest protocols).
    Error(Bytes),
    /// SPDY: the client opened a stream whose type the proxy does not know (why, in words):
    /// nothing on it is observed. No client sends one (nor would the kubelet use it, as the
    /// proxy reads it), but a reading that differed from the kubelet's would hide a stream
    /// this way, so a required recording ends the session on it.
    UnknownStream(String),
}

/// How much of a remote-command session an observer looks at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every stream: stdin, stdout, stderr, terminal sizes and the error stream (a recording).
    #[default]
    Everything,
    /// The error stream alone, for the exit code (the audit log without a recording): the
    /// payloads of every other stream are passed over by their length, never buffered or
    /// copied. SPDY control frames are still all followed (their header blocks share one zlib
    /// context per direction); a WebSocket message is looked at only as far as its channel.
    /// Only [`Observed::Error`] events are yielded.
    ErrorStream,
}

/// Why an observer stopped following a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    /// The SPDY framing could not be followed.
    #[error("cannot follow the SPDY session: {0}")]
    Spdy(String),
    /// The WebSocket framing could not be followed.
    #[error("cannot follow the WebSocket session: {0}")]
    WebSocket(String),
    /// A frame or message larger than the observer buffers.
    #[error("a frame of {0} bytes is larger than the {MAX_FRAME} bytes observed")]
    TooLarge(u64),
    /// More streams than a remote-command session opens.
    #[error("more than {0} streams open")]
    TooManyStreams(usize),
    /// The terminal sizes could not be decoded.
    #[error("cannot decode a terminal size: {0}")]
    Resize(String),
    /// A base64 message could not be decoded.
    #[error("cannot decode a base64 message: {0}")]
    Base64(String),
    /// The session's memory could not hold the frame being followed.
    #[error("cannot hold a frame to follow: {0}")]
    Memory(Refused),
}

/// The observer of one relayed session, whichever its protocol. After its first error it
/// observes nothing more (and says so once).
#[derive(Debug)]
pub struct Observer {
    /// `None` once stopped: its buffers and zlib contexts are freed at once.
    protocol: Option<Protocol>,
    /// What its buffers hold of the session's memory, if that is counted.
    memory: Option<Held>,
}

#[derive(Debug)]
enum Protocol {
    Spdy(Box<SpdyObserver>),
    WebSocket(Box<WebSocketObserver>),
    /// A port-forward tunnel's WebSocket, its SPDY followed inside (watches only).
    Tunnel(Box<TunnelObserver>),
}

impl Observer {
    /// An observer for a session the upstream answered with `upgrade` (its `Upgrade` header)
    /// and `subprotocol` (its `Sec-WebSocket-Protocol` or `X-Stream-Protocol-Version`); `None`
    /// for a protocol it cannot follow.
    pub fn for_protocol(upgrade: Option<&str>, subprotocol: Option<&str>) -> Option<Observer> {
        Observer::with_scope(upgrade, subprotocol, Scope::Everything)
    }

    /// [`Observer::for_protocol`], looking at as much of the session as `scope` says.
    pub fn with_scope(
        upgrade: Option<&str>,
        subprotocol: Option<&str>,
        scope: Scope,
    ) -> Option<Observer> {
        let upgrade = upgrade?;
        let protocol = if upgrade.eq_ignore_ascii_case("SPDY/3.1") {
            if subprotocol == Some(PORT_FORWARD) {
                Protocol::Spdy(Box::new(SpdyObserver::port_forward()))
            } else {
                Protocol::Spdy(Box::new(SpdyObserver::with_scope(scope)))
            }
        } else if upgrade.eq_ignore_ascii_case("websocket") {
            // A kubelet that was offered no subprotocol speaks `channel.k8s.io` under no name
            // (it answers with an empty `Sec-WebSocket-Protocol`, or none).
            let framing = match subprotocol.filter(|p| !p.is_empty()) {
                None => WebSocketFraming::Binary,
                Some(name) => WebSocketFraming::from_subprotocol(name)?,
            };
            Protocol::WebSocket(Box::new(WebSocketObserver::with_scope(framing, scope)))
        } else {
            return None;
        };
        Some(Observer {
            protocol: Some(protocol),
            memory: None,
        })
    }

    /// The observer, holding what it buffers from `lane`.
    pub fn charging(mut self, lane: MemoryLane) -> Observer {
        self.memory = Some(lane.none());
        self
    }

    /// Follows `bytes`, relayed in `direction`, appending what they carried to `out`. The
    /// first error stops the observer: later calls add nothing and return `Ok`.
    pub fn feed(
        &mut self,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        let Some(protocol) = self.protocol.as_mut() else {
            return Ok(());
        };
        let result = protocol
            .feed(direction, bytes, out)
            .and_then(|()| hold(protocol, self.memory.as_mut()));
        if result.is_err() {
            // Free the buffers and zlib contexts now: nothing more will be looked at.
            self.protocol = None;
            self.memory = None;
        }
        result
    }

    /// Bytes relayed in `direction` that it holds without having reported them yet: the
    /// unfinished frame (and the earlier fragments of an unfinished message). Under
    /// `--record=required` they count against what may run ahead of the recording, since the
    /// relay has passed them on already.
    pub fn held(&self, direction: Direction) -> usize {
        match &self.protocol {
            Some(Protocol::Spdy(o)) => o.held(direction),
            Some(Protocol::WebSocket(o)) => o.held(direction),
            Some(Protocol::Tunnel(_)) | None => 0,
        }
    }

    /// SPDY remote command: the streams the upstream writes on, as far as seen.
    pub fn spdy_streams(&self) -> Option<RemoteCommandStreams> {
        match &self.protocol {
            Some(Protocol::Spdy(o)) => Some(o.remote_command_streams()),
            _ => None,
        }
    }

    /// Whether an error stopped the observer.
    pub fn stopped(&self) -> bool {
        self.protocol.is_none()
    }
}

/// Follows one port-forward session (SPDY, relayed or carried by the tunnel, the tunnel's
/// WebSocket passed through, or a relayed legacy WebSocket one) for its audit event. Both
/// directions of a session run in one task: the lock is never contended, and a `Mutex` rather
/// than a `RefCell` only because that task may move between threads. It is never held across
/// an await.
#[derive(Debug)]
pub struct PortForwardWatch {
    state: Mutex<WatchState>,
}

#[derive(Debug)]
struct WatchState {
    /// `None` once stopped; what it had seen is then in `report`.
    observer: Option<Protocol>,
    report: PortForwardReport,
    /// What its buffers hold of the session's memory, if that is counted.
    memory: Option<Held>,
}

impl Protocol {
    /// Follows `bytes` with whichever observer the session's protocol needs.
    fn feed(
        &mut self,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        match self {
            Protocol::Spdy(o) => o.feed(direction, bytes, out),
            Protocol::WebSocket(o) => o.feed(direction, bytes, out),
            Protocol::Tunnel(o) => o.feed(direction, bytes),
        }
    }

    fn port_forwards(&self) -> PortForwardReport {
        match self {
            Protocol::Spdy(o) => o.port_forwards(),
            Protocol::WebSocket(o) => o.port_forwards(),
            Protocol::Tunnel(o) => Some(o.port_forwards()),
        }
        .unwrap_or_default()
    }

    /// Bytes its buffers hold now, both directions.
    fn buffered(&self) -> usize {
        let both = [Direction::ClientToUpstream, Direction::UpstreamToClient];
        match self {
            Protocol::Spdy(o) => both.iter().map(|&d| o.held(d)).sum(),
            Protocol::WebSocket(o) => both.iter().map(|&d| o.held(d)).sum(),
            Protocol::Tunnel(o) => o.buffered(),
        }
    }
}

/// Holds what `protocol` buffers now from `memory` (if counted): more taken at once, or the
/// observation stops; less given back.
fn hold(protocol: &Protocol, memory: Option<&mut Held>) -> Result<(), ObserveError> {
    let Some(held) = memory else {
        return Ok(());
    };
    let now = protocol.buffered();
    if now <= held.len() {
        held.shrink_to(now);
        return Ok(());
    }
    let more = held
        .lane()
        .try_take(now - held.len())
        .map_err(ObserveError::Memory)?;
    held.absorb(more);
    Ok(())
}

impl Default for PortForwardWatch {
    fn default() -> Self {
        PortForwardWatch::new()
    }
}

impl PortForwardWatch {
    /// A watch on a SPDY port-forward (`portforward.k8s.io`) that has not sent a frame yet.
    pub fn new() -> PortForwardWatch {
        Self::of(Protocol::Spdy(Box::new(SpdyObserver::port_forward())))
    }

    /// A watch on a legacy WebSocket port-forward (PROTOCOL.md §2.2) framed as `framing`.
    pub fn websocket(framing: WebSocketFraming) -> PortForwardWatch {
        Self::of(Protocol::WebSocket(Box::new(
            WebSocketObserver::port_forward(framing),
        )))
    }

    /// A watch on a port-forward tunnel passed through unchanged: a WebSocket whose
    /// subprotocol is `SPDY/3.1+portforward.k8s.io` and whose binary messages carry a SPDY
    /// port-forward session's bytes (PROTOCOL.md §2.1).
    pub fn tunnel() -> PortForwardWatch {
        Self::of(Protocol::Tunnel(Box::default()))
    }

    fn of(protocol: Protocol) -> PortForwardWatch {
        PortForwardWatch {
            state: Mutex::new(WatchState {
                observer: Some(protocol),
                report: PortForwardReport::default(),
                memory: None,
            }),
        }
    }

    /// The watch, holding what it buffers from `lane`.
    pub fn charging(self, lane: MemoryLane) -> PortForwardWatch {
        self.lock().memory = Some(lane.none());
        self
    }

    /// Follows the bytes relayed in `direction`. Once they cannot be followed the watch keeps
    /// what it saw until then, and why it stopped, and looks at nothing more.
    pub fn relayed(&self, direction: Direction, bytes: &[u8]) {
        let mut state = self.lock();
        let WatchState {
            observer, memory, ..
        } = &mut *state;
        let Some(observer) = observer.as_mut() else {
            return;
        };
        // A port-forward observer yields no events: nothing is ever pushed here.
        let fed = observer
            .feed(direction, bytes, &mut Vec::new())
            .and_then(|()| hold(observer, memory.as_mut()));
        if let Err(e) = fed {
            let mut report = observer.port_forwards();
            report.failure = Some(e.to_string());
            state.report = report;
            // Frees the buffers and zlib contexts at once.
            state.observer = None;
            state.memory = None;
        }
    }

    /// The SPDY port-forward's streams the upstream has not ended yet (none known once the
    /// watch stopped, or for a legacy WebSocket port-forward, which has no streams).
    pub fn open_forwards(&self) -> OpenForwards {
        match &self.lock().observer {
            Some(Protocol::Spdy(o)) => o.open_forwards().unwrap_or_default(),
            Some(Protocol::Tunnel(o)) => o.open_forwards(),
            _ => OpenForwards::default(),
        }
    }

    /// What the session carried.
    pub fn finish(self) -> PortForwardReport {
        let state = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        match state.observer {
            Some(observer) => observer.port_forwards(),
            None => state.report,
        }
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        // A panic while it was held loses at most the counts of one read.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The error stream's bytes, kept (up to 64 KiB) to tell how the session ended.
#[derive(Debug, Default)]
pub struct ErrorStream {
    bytes: Vec<u8>,
}

impl ErrorStream {
    /// Adds bytes of the error stream; beyond 64 KiB they are dropped.
    pub fn push(&mut self, data: &[u8]) {
        let room = MAX_ERROR_BYTES.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The exit code and a summary (`Success`, `exit 3`, a reason or the message), if the
    /// stream said anything: a Status on v4 and later protocols; on older ones a text message
    /// sent on failure only, so silence there says nothing either way.
    pub fn outcome(&self) -> (Option<i32>, Option<String>) {
        if self.bytes.is_empty() {
            return (None, None);
        }
        match serde_json::from_slice::<Status>(&self.bytes) {
            Ok(status) => (status.exit_code().map(i32::from), Some(status.summary())),
            Err(_) => {
                let text = String::from_utf8_lossy(&self.bytes);
                (None, Some(text.trim().chars().take(512).collect()))
            }
        }
    }
}
