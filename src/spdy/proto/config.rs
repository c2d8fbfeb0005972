use std::sync::Arc;
use std::time::Duration;

use crate::session_memory::MemoryBudget;

/// Which side of the session we are: clients open odd stream ids and send odd ping ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opens streams (what the proxy is towards a kubelet or API server).
    Client,
    /// Accepts streams (used by the simulated cluster and tests).
    Server,
}

impl Role {
    /// First stream id this role opens (1 for clients, 2 for servers).
    pub(crate) fn first_stream_id(self) -> u32 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    /// Whether an id (stream or ping) was chosen by this role: odd ids are the client's.
    pub(crate) fn owns_id(self, id: u32) -> bool {
        (id % 2 == 1) == (self == Role::Client)
    }
}

/// Session tunables. The defaults follow what Kubernetes clients do (PROTOCOL.md §4.5).
#[derive(Debug, Clone)]
pub struct Config {
    /// Send a PING this often (client-go and the apiserver translator use 5 s; the
    /// port-forward tunnel uses 10 s). `None` disables our own pings; peer pings are always echoed.
    pub ping_interval: Option<Duration>,
    /// How long after a ping was due the peer may stay silent (nothing at all read from it)
    /// before the session ends with [`SessionEnd::PingTimeout`](super::SessionEnd). Only with
    /// `ping_interval`; `None`: silence is never held against the peer.
    pub ping_timeout: Option<Duration>,
    /// How long `open_stream` waits for the peer's SYN_REPLY (client-go: 30 s).
    pub syn_reply_timeout: Duration,
    /// Bytes of received DATA a stream may hold before the session stops reading the socket.
    pub stream_inbox_bytes: usize,
    /// Outgoing DATA frames that may wait for the socket before senders are slowed down.
    pub data_queue_frames: usize,
    /// Largest decompressed header block accepted from the peer.
    pub max_header_block: usize,
    /// Largest control frame accepted from the peer.
    pub max_control_frame: usize,
    /// Incoming streams that may wait for `Incoming::accept` (server role).
    pub accept_backlog: usize,
    /// The budget the session's reader holds what it reads from (a lane of its own: DATA
    /// until its stream's reader drops it, a frame larger than the lane's floor whole or the
    /// session ends); `None`: not counted.
    pub memory: Option<Arc<MemoryBudget>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ping_interval: Some(Duration::from_secs(5)),
            ping_timeout: None,
            syn_reply_timeout: Duration::from_secs(30),
            stream_inbox_bytes: 256 * 1024,
            data_queue_frames: 4,
            max_header_block: 64 * 1024,
            max_control_frame: 1024 * 1024,
            accept_backlog: 64,
            memory: None,
        }
    }
}
