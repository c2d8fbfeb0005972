//! What every request handler shares: the limits, the sessions, the audit log and recordings
//! ([`Shared`]), with the cluster its request goes to ([`ProxyState`]).

use std::ops::Deref;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderMap;

use super::registry::Sessions;
use crate::audit::recording::Recordings;
use crate::audit::AuditLog;
use crate::proxy::client::upgrade_request::UpgradeBodyBudget;
use crate::proxy::client::waiting_connections::{WaitingConnections, DEFAULT_MAX_PENDING};
use crate::proxy::client::websocket::{upgraded, ClientSocket, ClientUpgradeError};
use crate::proxy::observability::log_throttle::LogThrottle;
use crate::proxy::observability::metrics::Metrics;
use crate::proxy::route::cluster::Cluster;
use crate::proxy::route::kubelet::NodeProxySessions;
use crate::proxy::route::stream_request::StreamRequest;
use crate::proxy::upstream::spdy_dial::upstream_headers;
use crate::request::host::HostSuffix;
use crate::session_memory::{LaneLimits, MemoryBudget};
use crate::translate::remote_command::SessionLimits;
use crate::translate::ws::{Config, Keepalive};

/// Default of `--session-memory-budget`: what sessions may hold beyond their floors, all
/// together. With the manifests' 2,000 sessions and everything else bounded, the worst case
/// stays below their 1 GiB limit (SECURITY.md, "Memory").
pub const DEFAULT_SESSION_MEMORY_BUDGET: usize = 128 * 1024 * 1024;

/// What each direction of a session holds on its own, without the budget, so that a session
/// keeps moving whatever others hold: two of kubectl's 32 KiB messages (or a kubelet's frames)
/// with their heads, or one of the Node client's 64 KiB stream chunks with its channel byte and
/// head.
pub const LANE_FLOOR: usize = 65 * 1024;

/// What a direction may hold queued behind its largest message (kubectl's 16 queued stdin
/// messages are 512 KiB).
const LANE_QUEUE: usize = 1024 * 1024;

/// The memory limits of one session direction: its floor, and a cap of the largest message
/// (`--max-message-size`, with its frame head) and what may wait behind it.
pub fn session_lane_limits(max_message_size: usize) -> LaneLimits {
    LaneLimits {
        floor: LANE_FLOOR,
        cap: max_message_size
            .saturating_add(crate::translate::ws::frame::MAX_HEAD_LEN)
            .saturating_add(LANE_QUEUE),
    }
}

/// What a request handler sees: the state every request shares, and the cluster this one is
/// routed to (`state.metrics` is shared, `state.cluster.upstream` the request's own).
pub struct ProxyState {
    shared: Arc<Shared>,
    /// The cluster the request goes to.
    pub cluster: Arc<Cluster>,
    /// The memory budget as this request's session takes it (made when first asked).
    session_memory: OnceLock<Arc<MemoryBudget>>,
}

impl ProxyState {
    /// The state of a request routed to `cluster`.
    pub fn new(shared: Arc<Shared>, cluster: Arc<Cluster>) -> ProxyState {
        ProxyState {
            shared,
            cluster,
            session_memory: OnceLock::new(),
        }
    }

    /// The state every request shares.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Where a session takes its memory lanes from: the shared budget
    /// (`--session-memory-budget`), its ended sessions counted as its cluster's.
    pub fn session_memory(&self) -> &Arc<MemoryBudget> {
        self.session_memory.get_or_init(|| {
            let ends = self.metrics.memory_ends(self.cluster.metrics_label());
            self.shared.memory_budget.counting(ends)
        })
    }

    /// The client's WebSocket, once its upgrade completes (within `--handshake-timeout`), with
    /// the client settings ([`client_socket_config`](Self::client_socket_config)).
    pub async fn client_websocket(
        &self,
        on_upgrade: hyper::upgrade::OnUpgrade,
    ) -> Result<ClientSocket, ClientUpgradeError> {
        upgraded(
            on_upgrade,
            self.client_socket_config(),
            self.handshake_timeout,
        )
        .await
    }

    /// WebSocket settings for client connections (buffers size themselves to the traffic).
    pub fn client_socket_config(&self) -> Config {
        Config {
            max_message_size: self.max_message_size,
            keepalive: self.client_keepalive,
            memory: Some(self.session_memory().clone()),
        }
    }
}

impl Deref for ProxyState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// Read-only state every request shares, whichever cluster it goes to.
pub struct Shared {
    pub session_limits: SessionLimits,
    /// Largest WebSocket message accepted from a client.
    pub max_message_size: usize,
    /// What sessions may make the proxy hold (`--session-memory-budget`, and each direction's
    /// floor and cap). Sessions take it through [`ProxyState::session_memory`].
    pub memory_budget: Arc<MemoryBudget>,
    /// How often translated sessions ping the upstream (keeps middleboxes from cutting them).
    pub upstream_ping_interval: Option<Duration>,
    /// How long after a ping was due a translated session's upstream may stay silent.
    pub upstream_ping_timeout: Option<Duration>,
    /// Pings to the clients of WebSocket sessions (translated, tunnels, relayed), and how long
    /// they may stay silent.
    pub client_keepalive: Option<Keepalive>,
    /// How long a streaming session may carry no data either way.
    pub stream_idle_timeout: Option<Duration>,
    /// TCP keepalive idle time on accepted client connections.
    pub tcp_keepalive: Option<Duration>,
    /// Longest wait for the upstream's answer to an upgrade, and for a client's upgrade to
    /// complete.
    pub handshake_timeout: Duration,
    /// Longest time from a client's accept (TLS handshake included) to its first complete
    /// request head, and for every later request head.
    pub request_header_timeout: Duration,
    /// How long a client connection with no request in flight stays open.
    pub idle_connection_timeout: Duration,
    /// How long a plain response may wait for its client to take any of it
    /// (`--response-write-timeout`; `None`: for ever).
    pub response_write_timeout: Option<Duration>,
    /// Whether the proxy sits behind a proxy it trusts to set `X-Forwarded-For`: the caller's
    /// value is then kept and extended; otherwise it is replaced by the caller's address.
    pub trust_forwarded_for: bool,
    /// Largest request head accepted from a client.
    pub max_request_header_bytes: usize,
    /// Bytes of upgrade request bodies held at once, all callers together
    /// (`--upgrade-body-budget`).
    pub upgrade_body_budget: UpgradeBodyBudget,
    /// Client connections waiting for a request head, all together
    /// (`--max-pending-connections`).
    pub waiting_connections: Arc<WaitingConnections>,
    /// Whether HTTP/2 clients may open WebSockets as streams (RFC 8441 extended CONNECT,
    /// `--http2-websockets`).
    pub http2_websockets: bool,
    /// TLS for the main listener; plain HTTP when absent.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The domain under which each cluster has its host name, `NAME.SUFFIX`
    /// (`--cluster-host-suffix`); `None`: the host is not read.
    pub cluster_host_suffix: Option<HostSuffix>,
    /// Prometheus metrics served on the admin listener.
    pub metrics: Metrics,
    /// Running streaming sessions: admission (`--max-sessions`) and drain signals.
    pub sessions: Arc<Sessions>,
    /// Where session audit events go (`--audit-log`); `None`: no audit.
    pub audit: Option<Arc<AuditLog>>,
    /// Recordings of exec and attach sessions (`--record`); `None`: off.
    pub recordings: Option<Arc<Recordings>>,
    /// Client certificates refused at the handshake are logged a few times, not each time.
    pub refused_certificate_log: LogThrottle,
    /// Kubelet sessions through `nodes/{node}/proxy` (`--node-proxy-sessions`).
    pub node_proxy_sessions: NodeProxySessions,
    /// The other replicas, asked by the sessions API's `?allReplicas=true` (`--peers`).
    pub peers: Option<crate::proxy::upstream::peers::Peers>,
    /// Whether `GET /apis` lists the sessions API's group (`--sessions-discovery`).
    pub sessions_discovery: bool,
}

impl Default for Shared {
    /// State with default limits.
    fn default() -> Self {
        let metrics = Metrics::new();
        let memory_budget = MemoryBudget::new(
            DEFAULT_SESSION_MEMORY_BUDGET,
            session_lane_limits(32 * 1024 * 1024),
        );
        metrics.watch_session_memory(memory_budget.clone());
        Shared {
            session_limits: SessionLimits::default(),
            max_message_size: 32 * 1024 * 1024,
            memory_budget,
            upstream_ping_interval: Some(Duration::from_secs(5)),
            upstream_ping_timeout: Some(Duration::from_secs(30)),
            client_keepalive: Some(Keepalive {
                interval: Duration::from_secs(30),
                timeout: Some(Duration::from_secs(30)),
            }),
            stream_idle_timeout: Some(Duration::from_secs(4 * 3600)),
            tcp_keepalive: Some(Duration::from_secs(30)),
            handshake_timeout: Duration::from_secs(30),
            request_header_timeout: Duration::from_secs(30),
            idle_connection_timeout: Duration::from_secs(90),
            response_write_timeout: Some(
                crate::proxy::client::write_timeout::DEFAULT_RESPONSE_WRITE_TIMEOUT,
            ),
            trust_forwarded_for: false,
            max_request_header_bytes: 64 * 1024,
            upgrade_body_budget: UpgradeBodyBudget::new(16 * 1024 * 1024),
            waiting_connections: WaitingConnections::new(DEFAULT_MAX_PENDING as usize),
            http2_websockets: true,
            tls: None,
            cluster_host_suffix: None,
            metrics,
            sessions: Sessions::new(None),
            audit: None,
            recordings: None,
            refused_certificate_log: LogThrottle::default(),
            node_proxy_sessions: NodeProxySessions::default(),
            peers: None,
            sessions_discovery: true,
        }
    }
}

impl ProxyState {
    /// The headers a streaming request sends upstream: the client's, forwarded as the
    /// `--trust-forwarded-for` setting says, with the proxy's own credentials for `stream`'s
    /// caller (the auth mode's).
    pub fn upstream_headers(&self, client: &HeaderMap, stream: &StreamRequest) -> HeaderMap {
        let mut headers = upstream_headers(client, stream.peer, self.trust_forwarded_for);
        self.cluster.auth.apply(&stream.caller, &mut headers);
        headers
    }
}

impl std::fmt::Debug for ProxyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyState")
            .field("cluster", &self.cluster)
            .field("shared", &self.shared)
            .finish()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("tls", &self.tls.is_some())
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}
