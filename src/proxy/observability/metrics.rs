//! The proxy's Prometheus metrics, served at `/metrics` on the admin listener. Every label takes
//! values from a fixed set (the enums below, the standard HTTP methods, a fixed list of status
//! codes with the rest counted by class, the configured clusters' names): never pod names,
//! users, paths or whatever number or name a peer sends, so neither a busy proxy nor a hostile
//! client or upstream can grow its series without bound.
//!
//! Families that count sessions or upstream requests carry a `cluster` label ([`ClusterLabel`]):
//! the cluster the request was routed to. A request routed nowhere (a refused target, an unknown
//! cluster) is counted with an empty `cluster`, which Prometheus reads as no label at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::audit::recording::RecordingCounters;
use crate::audit::upload::{UploadCounters, UploadKind};
use crate::audit::AuditCounters;
use crate::proxy::wire::client_stream::HandshakeForm;
use crate::session_memory::{Limit, MemoryBudget};

/// The `cluster` label of a configured cluster: its name, or `default` for the unnamed upstream
/// of `--upstream`/`--kubeconfig`/`--in-cluster`. Made once per configured cluster, never from
/// what a request says, so the label's values are the configuration's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLabel(Arc<str>);

impl ClusterLabel {
    /// The label of the cluster called `name`.
    pub fn new(name: &str) -> ClusterLabel {
        ClusterLabel(name.into())
    }

    /// The label value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The `cluster` label of what was counted before any cluster was chosen (a refused target, an
/// unknown name): empty, which Prometheus reads as no label.
const UNROUTED: &str = "";

/// What kind of streaming session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    Exec,
    Attach,
    PortForwardTunnel,
    WebSocketRelay,
    SpdyRelay,
    /// v5 exec/attach or the port-forward tunnel passed through to an upstream that serves
    /// them (`--upstream-streaming`).
    PassThrough,
    /// The kubelet's `run` through `nodes/{node}/proxy` (`--node-proxy-sessions=audit`).
    KubeletRun,
}

impl SessionKind {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            SessionKind::Exec => "exec",
            SessionKind::Attach => "attach",
            SessionKind::PortForwardTunnel => "portforward_tunnel",
            SessionKind::WebSocketRelay => "websocket_relay",
            SessionKind::SpdyRelay => "spdy_relay",
            SessionKind::PassThrough => "websocket_pass_through",
            SessionKind::KubeletRun => "kubelet_run",
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOutcome {
    Success,
    NonZeroExit,
    UpstreamError,
    ClientGone,
    /// The client stopped answering keepalive pings.
    ClientUnresponsive,
    /// The upstream stopped answering keepalive pings.
    UpstreamUnresponsive,
    /// No data either way for `--stream-idle-timeout`.
    IdleTimeout,
    /// The session's recording failed under `--record=required`.
    RecordingFailed,
    Drained,
    /// An operator ended it (the sessions API).
    Terminated,
}

impl SessionOutcome {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            SessionOutcome::Success => "success",
            SessionOutcome::NonZeroExit => "non_zero_exit",
            SessionOutcome::UpstreamError => "upstream_error",
            SessionOutcome::ClientGone => "client_gone",
            SessionOutcome::ClientUnresponsive => "client_unresponsive",
            SessionOutcome::UpstreamUnresponsive => "upstream_unresponsive",
            SessionOutcome::IdleTimeout => "idle_timeout",
            SessionOutcome::RecordingFailed => "recording_failed",
            SessionOutcome::Drained => "drained",
            SessionOutcome::Terminated => "terminated",
        }
    }
}

/// Why a client's handshake was refused before any session started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeRejection {
    BadRequest,
    TooManySessions,
    Draining,
    /// The proxy holds as many upgrade request bodies as `--upgrade-body-budget` allows (503
    /// with `Retry-After`): the request was well-formed, the proxy busy.
    Busy,
    /// The caller's address had spent its budget of refused sessions (429 with `Retry-After`,
    /// `--audit-refusal-burst`): refused without asking the upstream.
    RefusedSessions,
    /// A kubelet session through `nodes/{node}/proxy` under `--node-proxy-sessions=refuse`
    /// (403).
    NodeProxySession,
    /// A request naming no configured cluster (`/clusters/NAME/` with an unknown name, or no
    /// prefix where every cluster is named): 404.
    UnknownCluster,
    /// A request whose host names another cluster than the TLS server name (SNI) of its
    /// connection: 421.
    Misdirected,
}

impl HandshakeRejection {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeRejection::BadRequest => "bad_request",
            HandshakeRejection::TooManySessions => "too_many_sessions",
            HandshakeRejection::Draining => "draining",
            HandshakeRejection::Busy => "busy",
            HandshakeRejection::RefusedSessions => "refused_sessions",
            HandshakeRejection::NodeProxySession => "node_proxy_session",
            HandshakeRejection::UnknownCluster => "unknown_cluster",
            HandshakeRejection::Misdirected => "misdirected",
        }
    }
}

/// Why the proxy closed a client connection on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionShed {
    /// No complete request head within `--request-header-timeout` of the accept.
    RequestHeaderTimeout,
    /// No request in flight for `--idle-connection-timeout`.
    IdleTimeout,
    /// The TLS handshake failed.
    TlsHandshakeFailed,
    /// An admin connection beyond `--admin-max-connections` while every admitted one had a
    /// request in flight, closed as soon as accepted.
    AdminConnectionLimit,
    /// The admin connection idle longest, closed to make room for a new one when
    /// `--admin-max-connections` were open.
    AdminIdleShed,
    /// The connection that had waited longest for a request head, shed to keep the waiting
    /// ones within `--max-pending-connections`.
    PendingConnectionLimit,
    /// A plain response whose client took nothing of it for `--response-write-timeout`: its
    /// HTTP/1.1 connection closed, or its HTTP/2 stream cut.
    ResponseWriteTimeout,
}

impl ConnectionShed {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionShed::RequestHeaderTimeout => "request_header_timeout",
            ConnectionShed::IdleTimeout => "idle_timeout",
            ConnectionShed::TlsHandshakeFailed => "tls_handshake_failed",
            ConnectionShed::AdminConnectionLimit => "admin_connection_limit",
            ConnectionShed::AdminIdleShed => "admin_idle_shed",
            ConnectionShed::PendingConnectionLimit => "pending_connection_limit",
            ConnectionShed::ResponseWriteTimeout => "response_write_timeout",
        }
    }
}

/// All metric families of one proxy.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    sessions: SessionFamilies,
    refusals: RefusalFamilies,
    requests: RequestFamilies,
    handler_panics: IntCounter,
    certificate_reloads: IntCounterVec,
    /// 1 until a changed pair is refused, then 0 until one is served.
    certificate_last_reload_ok: IntGauge,
    tasks_alive: IntGauge,
    audit: AuditCounters,
    recording: RecordingCounters,
    upload: UploadCounters,
    memory: MemoryFamilies,
    upstream_ready: IntGaugeVec,
    config: ConfigFamilies,
}

/// Reloads of the configuration (`--config`) and the generation being served.
#[derive(Debug, Clone)]
struct ConfigFamilies {
    reloads: IntCounterVec,
    generation: IntGauge,
    /// 1 until a reload fails, then 0 until one succeeds: a refused file stays refused until
    /// it changes, which a counter's rate would forget.
    last_ok: IntGauge,
}

/// What sessions hold of the session memory budget (`--session-memory-budget`), read from it
/// when the metrics are asked for, and the sessions it ended, counted by their cluster's lanes
/// ([`Metrics::memory_ends`]).
#[derive(Debug, Clone)]
struct MemoryFamilies {
    budget: IntGauge,
    borrowed: IntGauge,
    held: IntGauge,
    ended: IntCounterVec,
    source: Arc<Mutex<Option<Arc<MemoryBudget>>>>,
}

/// The streaming sessions: running, finished, their bytes and duration, how they came in.
#[derive(Debug, Clone)]
struct SessionFamilies {
    active: IntGaugeVec,
    total: IntCounterVec,
    bytes: IntCounterVec,
    admitted: IntCounterVec,
    duration: HistogramVec,
}

/// What was refused or cut: by the upstream, at the handshake, by authentication, and client
/// connections the proxy closed.
#[derive(Debug, Clone)]
struct RefusalFamilies {
    upstream_upgrade_failures: IntCounterVec,
    handshake_rejections: IntCounterVec,
    auth_rejections: IntCounterVec,
    connections_shed: IntCounterVec,
}

/// Plain (non-streaming) requests.
#[derive(Debug, Clone)]
struct RequestFamilies {
    total: IntCounterVec,
    duration: HistogramVec,
}

/// Makes families and registers each on one registry.
struct Register<'r>(&'r Registry);

impl Register<'_> {
    fn add<M: prometheus::core::Collector + Clone + 'static>(&self, metric: M) -> M {
        self.0
            .register(Box::new(metric.clone()))
            .expect("unique metric");
        metric
    }

    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn plain_counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn plain_gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid metric"))
    }

    fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.add(HistogramVec::new(opts, labels).expect("valid metric"))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family on a fresh registry.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = Register(&registry);
        let metrics = Metrics {
            tasks_alive: r.plain_gauge(
                "kube_ws_proxy_runtime_tasks_alive",
                "Tasks alive on the proxy's async runtime (every connection and session holds a \
                 few): after load it returns to its idle level unless tasks leak.",
            ),
            sessions: SessionFamilies::register(&r),
            refusals: RefusalFamilies::register(&r),
            requests: RequestFamilies::register(&r),
            handler_panics: r.plain_counter(
                "kube_ws_proxy_handler_panics_total",
                "Requests whose handler panicked (answered 500; a bug: please report it).",
            ),
            certificate_reloads: r.counter(
                "kube_ws_proxy_serving_certificate_reloads_total",
                "Changes of the main listener's certificate files, by result: reloaded, or \
                 failed (unreadable, or a key that is not the certificate's: the previous pair \
                 is still served).",
                &["result"],
            ),
            certificate_last_reload_ok: r.plain_gauge(
                "kube_ws_proxy_serving_certificate_last_reload_successful",
                "Whether the main listener's last look at changed certificate files served \
                 them: 1 (also before any change), or 0 (the previous pair is still served).",
            ),
            audit: audit_counters(&r),
            recording: recording_counters(&r),
            upload: upload_counters(&r),
            memory: MemoryFamilies::register(&r),
            upstream_ready: r.gauge(
                "kube_ws_proxy_upstream_ready",
                "Whether the cluster's API server accepted the last readiness check's connection \
                 (TCP, and TLS when it is https): 1 or 0. Checked every few seconds and on every \
                 /readyz probe.",
                &["cluster"],
            ),
            config: ConfigFamilies::register(&r),
            registry,
        };
        metrics.certificate_last_reload_ok.set(1);
        metrics
    }

    /// Reports `budget` (the proxy's: the last one given).
    pub fn watch_session_memory(&self, budget: Arc<MemoryBudget>) {
        *self.memory.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(budget);
    }

    /// The recordings' counters.
    pub fn recording_counters(&self) -> RecordingCounters {
        self.recording.clone()
    }

    /// The uploads' counters (`--record-upload`).
    pub fn upload_counters(&self) -> UploadCounters {
        self.upload.clone()
    }

    /// The audit log's counters.
    pub fn audit_counters(&self) -> AuditCounters {
        self.audit.clone()
    }

    /// Starts the series of a configured `cluster` that must exist before their first event
    /// (a counter that appears at 1 shows no increase to `rate` or `increase`): its recording
    /// failures and recorded bytes, and its sessions ended by memory. Called for every cluster
    /// of a configuration that is put in service.
    pub fn cluster_configured(&self, cluster: &ClusterLabel) {
        let c = cluster.as_str();
        self.recording.failures.with_label_values(&[c]);
        self.recording.recorded_bytes.with_label_values(&[c]);
        for limit in [Limit::Session, Limit::Budget] {
            self.memory.ended.with_label_values(&[c, limit.label()]);
        }
    }

    /// Sets `cluster`'s readiness (`kube_ws_proxy_upstream_ready`).
    pub fn upstream_ready(&self, cluster: &ClusterLabel, ready: bool) {
        self.upstream_ready
            .with_label_values(&[cluster.as_str()])
            .set(i64::from(ready));
    }

    /// Keeps the readiness of the clusters `configured` says are, and drops the others' (no
    /// longer configured: they show neither ready nor not ready).
    pub fn retain_upstream_ready(&self, configured: impl Fn(&str) -> bool) {
        use prometheus::core::Collector;
        let shown: Vec<String> = self
            .upstream_ready
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .flat_map(|series| series.get_label())
            .filter(|label| label.name() == "cluster")
            .map(|label| label.value().to_owned())
            .collect();
        for gone in shown.iter().filter(|c| !configured(c)) {
            let _ = self.upstream_ready.remove_label_values(&[gone]);
        }
    }

    /// What a session of `cluster` tells its memory budget handle: each session its lanes end
    /// (`kube_ws_proxy_sessions_ended_by_memory_total`), by the limit that ended it.
    pub fn memory_ends(&self, cluster: &ClusterLabel) -> impl Fn(Limit) + Send + Sync + 'static {
        let ended = &self.memory.ended;
        let c = cluster.as_str();
        let session = ended.with_label_values(&[c, Limit::Session.label()]);
        let budget = ended.with_label_values(&[c, Limit::Budget.label()]);
        move |limit| match limit {
            Limit::Session => session.inc(),
            Limit::Budget => budget.inc(),
        }
    }

    /// Counts a session of `cluster` admitted (by how its client asked for it) and running as
    /// `kind` until the returned guard is finished or dropped. Admitted and running move
    /// together, and every guard ends in `sessions_total` exactly once, so that at every moment
    /// `sessions_admitted_total = sessions_total + sessions_active`, whatever the session's end.
    pub fn session_admitted(
        &self,
        cluster: &ClusterLabel,
        form: HandshakeForm,
        kind: SessionKind,
    ) -> SessionGuard {
        let c = cluster.as_str();
        self.sessions
            .active
            .with_label_values(&[c, kind.label()])
            .inc();
        self.sessions
            .admitted
            .with_label_values(&[c, form.http_version()])
            .inc();
        SessionGuard {
            metrics: self.clone(),
            cluster: cluster.clone(),
            kind,
            started: Instant::now(),
            finished: false,
        }
    }

    /// Counts an upstream refusal of an upgrade by `cluster` (`code` 0: no HTTP answer).
    pub fn upstream_upgrade_failure(&self, cluster: &ClusterLabel, code: u16) {
        self.refusals
            .upstream_upgrade_failures
            .with_label_values(&[cluster.as_str(), code_label(code)])
            .inc();
    }

    /// Counts a handshake to `cluster` the proxy refused.
    pub fn handshake_rejected(&self, cluster: &ClusterLabel, reason: HandshakeRejection) {
        self.refusals
            .handshake_rejections
            .with_label_values(&[cluster.as_str(), reason.label()])
            .inc();
    }

    /// Counts a request refused before it was routed to any cluster (a target that is refused
    /// or names no cluster), with an empty `cluster`: nothing a request names becomes a label.
    pub fn unrouted_rejected(&self, reason: HandshakeRejection) {
        self.refusals
            .handshake_rejections
            .with_label_values(&[UNROUTED, reason.label()])
            .inc();
    }

    /// Counts a request to `cluster` refused by authentication; `reason` is one of
    /// [`AUTH_REJECTION_REASONS`] (anything else is counted as `other`).
    pub fn auth_rejected(&self, cluster: &ClusterLabel, reason: &'static str) {
        // The reason comes from `Rejection::label`; checked here so that the label set stays
        // fixed whatever a caller passes.
        let reason = AUTH_REJECTION_REASONS
            .iter()
            .copied()
            .find(|known| *known == reason)
            .unwrap_or("other");
        self.refusals
            .auth_rejections
            .with_label_values(&[cluster.as_str(), reason])
            .inc();
    }

    /// Counts a client connection the proxy closed on its own.
    pub fn connection_shed(&self, reason: ConnectionShed) {
        self.refusals
            .connections_shed
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Counts a plain request proxied to `cluster`.
    pub fn request(
        &self,
        cluster: &ClusterLabel,
        method: &http::Method,
        code: u16,
        elapsed: Duration,
    ) {
        let (c, method) = (cluster.as_str(), method_label(method));
        self.requests
            .total
            .with_label_values(&[c, method, code_label(code)])
            .inc();
        self.requests
            .duration
            .with_label_values(&[c, method])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a request whose handler panicked.
    pub fn handler_panicked(&self) {
        self.handler_panics.inc();
    }

    /// Counts a look at changed serving certificate files: `reloaded` (now served) or not (the
    /// previous pair still is).
    pub fn serving_certificate_reload(&self, reloaded: bool) {
        let result = if reloaded { "reloaded" } else { "failed" };
        self.certificate_reloads.with_label_values(&[result]).inc();
        self.certificate_last_reload_ok.set(i64::from(reloaded));
    }

    /// Counts a reload of the configuration: `ok` (its clusters now serve new requests) or
    /// failed (refused: the previous configuration still serves).
    pub fn config_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.config.reloads.with_label_values(&[result]).inc();
        self.config.last_ok.set(i64::from(ok));
    }

    /// Says which generation of the configuration serves new requests.
    pub fn config_generation(&self, generation: u64) {
        self.config
            .generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> Vec<u8> {
        // Read when asked rather than kept up to date: the runtime counts its tasks anyway.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.tasks_alive
                .set(i64::try_from(runtime.metrics().num_alive_tasks()).unwrap_or(i64::MAX));
        }
        self.memory.refresh();
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl SessionFamilies {
    fn register(r: &Register<'_>) -> Self {
        SessionFamilies {
            active: r.gauge(
                "kube_ws_proxy_sessions_active",
                "Streaming sessions running now, by cluster and kind.",
                &["cluster", "kind"],
            ),
            total: r.counter(
                "kube_ws_proxy_sessions_total",
                "Finished streaming sessions by cluster, kind and outcome.",
                &["cluster", "kind", "outcome"],
            ),
            bytes: r.counter(
                "kube_ws_proxy_session_bytes_total",
                "Payload bytes of streaming sessions by cluster, kind and direction (up: client \
                 to upstream, down: upstream to client).",
                &["cluster", "kind", "direction"],
            ),
            admitted: r.counter(
                "kube_ws_proxy_sessions_admitted_total",
                "Streaming sessions admitted, by cluster and the HTTP version of the client's \
                 handshake (1.1: an upgrade with its own connection; 2: an extended CONNECT, one \
                 stream of a shared connection).",
                &["cluster", "http_version"],
            ),
            duration: r.histogram(
                "kube_ws_proxy_session_duration_seconds",
                "Duration of finished streaming sessions, by cluster and kind.",
                &["cluster", "kind"],
                vec![
                    0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
                ],
            ),
        }
    }
}

impl MemoryFamilies {
    fn register(r: &Register<'_>) -> Self {
        MemoryFamilies {
            budget: r.plain_gauge(
                "kube_ws_proxy_session_memory_budget_bytes",
                "What streaming sessions may hold beyond their own floors, all together \
                 (--session-memory-budget).",
            ),
            borrowed: r.plain_gauge(
                "kube_ws_proxy_session_memory_borrowed_bytes",
                "Of the session memory budget, what sessions hold now.",
            ),
            held: r.plain_gauge(
                "kube_ws_proxy_session_memory_held_bytes",
                "What streaming sessions hold now of what they read and have not passed on, \
                 their floors included.",
            ),
            ended: r.counter(
                "kube_ws_proxy_sessions_ended_by_memory_total",
                "Streaming sessions ended because a message or frame they had to hold whole was \
                 past their own memory limit (session) or the budget could not lend it (budget), \
                 by cluster.",
                &["cluster", "limit"],
            ),
            source: Arc::default(),
        }
    }

    /// Reads the budget, if there is one (its ended sessions are counted as they end).
    fn refresh(&self) {
        let Some(budget) = self
            .source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return;
        };
        let bytes = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.budget.set(bytes(budget.limit()));
        self.borrowed.set(bytes(budget.in_use()));
        self.held.set(bytes(budget.held()));
    }
}

impl RefusalFamilies {
    fn register(r: &Register<'_>) -> Self {
        RefusalFamilies {
            upstream_upgrade_failures: r.counter(
                "kube_ws_proxy_upstream_upgrade_failures_total",
                "Upstream refusals of an upgrade by cluster and HTTP status (0: no HTTP answer).",
                &["cluster", "code"],
            ),
            handshake_rejections: r.counter(
                "kube_ws_proxy_handshake_rejections_total",
                "Client handshakes refused by the proxy itself, by cluster (empty: refused before \
                 routing) and reason.",
                &["cluster", "reason"],
            ),
            auth_rejections: r.counter(
                "kube_ws_proxy_auth_rejections_total",
                "Requests refused by caller authentication (impersonate and front-proxy modes, \
                 and passthrough callers the upstream does not know), by cluster and reason.",
                &["cluster", "reason"],
            ),
            connections_shed: r.counter(
                "kube_ws_proxy_client_connections_closed_total",
                "Client connections the proxy closed on its own, by reason.",
                &["reason"],
            ),
        }
    }
}

impl ConfigFamilies {
    fn register(r: &Register<'_>) -> Self {
        let config = ConfigFamilies {
            reloads: r.counter(
                "kube_ws_proxy_config_reloads_total",
                "Reloads of the --config file (on a change of it, or SIGHUP), by result: ok, or \
                 failed (refused: the previous configuration still serves).",
                &["result"],
            ),
            generation: r.plain_gauge(
                "kube_ws_proxy_config_generation",
                "The generation of the configuration serving new requests: 1 at start, one \
                 more at each reload that succeeded.",
            ),
            last_ok: r.plain_gauge(
                "kube_ws_proxy_config_last_reload_successful",
                "Whether the last reload of the --config file succeeded: 1 (also before any), \
                 or 0 (the file was refused and the previous configuration still serves).",
            ),
        };
        for result in ["ok", "failed"] {
            config.reloads.with_label_values(&[result]);
        }
        config.generation.set(1);
        config.last_ok.set(1);
        config
    }
}

impl RequestFamilies {
    fn register(r: &Register<'_>) -> Self {
        RequestFamilies {
            total: r.counter(
                "kube_ws_proxy_http_requests_total",
                "Plain (non-streaming) requests proxied, by cluster, method and status code.",
                &["cluster", "method", "code"],
            ),
            duration: r.histogram(
                "kube_ws_proxy_http_request_duration_seconds",
                "Time to the upstream's response head for plain requests, by cluster and method.",
                &["cluster", "method"],
                prometheus::DEFAULT_BUCKETS.to_vec(),
            ),
        }
    }
}

/// The audit log's families (`--audit-log`).
fn audit_counters(r: &Register<'_>) -> AuditCounters {
    AuditCounters {
        written: r.plain_counter(
            "kube_ws_proxy_audit_events_total",
            "Audit events written (--audit-log).",
        ),
        dropped: r.plain_counter(
            "kube_ws_proxy_audit_events_dropped_total",
            "Audit events dropped because the audit log's queue was full.",
        ),
        write_failures: r.plain_counter(
            "kube_ws_proxy_audit_write_failures_total",
            "Writes and flushes of the audit log that failed (disk full, file gone).",
        ),
        lost: r.plain_counter(
            "kube_ws_proxy_audit_events_lost_total",
            "Audit events missing from the log because their write failed; the log \
             goes on with whole lines.",
        ),
    }
}

/// The recordings' families (`--record`).
fn recording_counters(r: &Register<'_>) -> RecordingCounters {
    RecordingCounters {
        recorded_bytes: r.counter(
            "kube_ws_proxy_recorded_bytes_total",
            "Session bytes written to recordings (--record), by cluster.",
            &["cluster"],
        ),
        failures: r.counter(
            "kube_ws_proxy_recording_failures_total",
            "Recordings that could not start or could not be written to the end, by cluster.",
            &["cluster"],
        ),
        writer_rested: r.add(
            prometheus::Counter::new(
                "kube_ws_proxy_recording_writer_rested_seconds_total",
                "Seconds the recordings' writer rested after its writes because someone was \
                 typing on a recorded terminal session.",
            )
            .expect("a valid counter"),
        ),
    }
}

/// The uploads' families (`--record-upload`, `--audit-upload`); the pending gauges start at
/// 0 for both kinds, so that alerts on them have a series to read whatever is configured.
fn upload_counters(r: &Register<'_>) -> UploadCounters {
    let counters = UploadCounters {
        uploads: r.counter(
            "kube_ws_proxy_uploads_total",
            "Objects stored (--record-upload, --audit-upload), by kind (recording, audit).",
            &["kind"],
        ),
        failures: r.counter(
            "kube_ws_proxy_upload_failures_total",
            "Upload attempts that failed and will be retried, by reason (connect, timeout, \
             status_4xx, status_5xx, request, file).",
            &["reason"],
        ),
        bytes: r.plain_counter(
            "kube_ws_proxy_upload_bytes_total",
            "Bytes stored in the upload target.",
        ),
        pending_files: r.gauge(
            "kube_ws_proxy_upload_pending_files",
            "Closed files in the spools waiting for their upload, by kind (recording, audit).",
            &["kind"],
        ),
        pending_bytes: r.gauge(
            "kube_ws_proxy_upload_pending_bytes",
            "Bytes of the closed files waiting for their upload, by kind.",
            &["kind"],
        ),
        oldest_pending_seconds: r.gauge(
            "kube_ws_proxy_upload_oldest_pending_seconds",
            "How long the oldest file waiting for its upload has waited (0: none waits), by kind.",
            &["kind"],
        ),
    };
    for kind in [UploadKind::Recording, UploadKind::Audit] {
        for gauge in [
            &counters.pending_files,
            &counters.pending_bytes,
            &counters.oldest_pending_seconds,
        ] {
            gauge.with_label_values(&[kind.label()]).set(0);
        }
    }
    counters
}

/// Every value of the `reason` label of `kube_ws_proxy_auth_rejections_total` (besides
/// `other`, which no caller should cause).
pub const AUTH_REJECTION_REASONS: [&str; 6] = [
    "unauthenticated",
    // Passthrough with the audit log: the upstream's SelfSubjectReview did not authenticate
    // the caller's credentials, so the proxy refused its session before starting it.
    "upstream_unauthenticated",
    "impersonation_headers",
    "authentication_unavailable",
    "ambiguous_client_certificate",
    "token_review_rate_limited",
];

/// Status codes that keep their own `code` label value: those Kubernetes and the proxy
/// answer with, and `0` (no HTTP answer at all).
const NAMED_CODES: [(u16, &str); 31] = [
    (0, "0"),
    (101, "101"),
    (200, "200"),
    (201, "201"),
    (202, "202"),
    (204, "204"),
    (206, "206"),
    (301, "301"),
    (302, "302"),
    (304, "304"),
    (307, "307"),
    (308, "308"),
    (400, "400"),
    (401, "401"),
    (403, "403"),
    (404, "404"),
    (405, "405"),
    (406, "406"),
    (409, "409"),
    (410, "410"),
    (413, "413"),
    (415, "415"),
    (422, "422"),
    (429, "429"),
    (431, "431"),
    (500, "500"),
    (501, "501"),
    (502, "502"),
    (503, "503"),
    (504, "504"),
    (505, "505"),
];

/// The `code` label of a status: a known code as itself, any other by its class (`1xx` …
/// `5xx`), and what is no HTTP status at all (600–999, which hyper accepts from an upstream)
/// `other`. An upstream can then add at most a handful of series, not one per number.
pub fn code_label(code: u16) -> &'static str {
    if let Some((_, label)) = NAMED_CODES.iter().find(|(known, _)| *known == code) {
        return label;
    }
    match code {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// Standard methods keep their name; anything else is `other` (a bounded label set).
fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// A running session's place in the metrics.
#[derive(Debug)]
pub struct SessionGuard {
    metrics: Metrics,
    cluster: ClusterLabel,
    kind: SessionKind,
    started: Instant,
    finished: bool,
}

impl SessionGuard {
    /// The session turned out to be of `kind` (`--upstream-streaming auto` decides the path on
    /// the upstream's answer): it runs, and will finish, as that kind.
    pub fn relabel(&mut self, kind: SessionKind) {
        if kind == self.kind {
            return;
        }
        let (active, c) = (&self.metrics.sessions.active, self.cluster.as_str());
        active.with_label_values(&[c, kind.label()]).inc();
        active.with_label_values(&[c, self.kind.label()]).dec();
        self.kind = kind;
    }

    /// The kind it runs as.
    pub fn kind(&self) -> SessionKind {
        self.kind
    }

    /// Records the finished session: outcome, bytes each way, duration.
    pub fn finish(mut self, outcome: SessionOutcome, bytes_up: u64, bytes_down: u64) {
        let m = &self.metrics;
        let (c, kind) = (self.cluster.as_str(), self.kind.label());
        m.sessions
            .total
            .with_label_values(&[c, kind, outcome.label()])
            .inc();
        m.sessions
            .bytes
            .with_label_values(&[c, kind, "up"])
            .inc_by(bytes_up);
        m.sessions
            .bytes
            .with_label_values(&[c, kind, "down"])
            .inc_by(bytes_down);
        m.sessions
            .duration
            .with_label_values(&[c, kind])
            .observe(self.started.elapsed().as_secs_f64());
        self.finished = true;
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let (sessions, c) = (&self.metrics.sessions, self.cluster.as_str());
        sessions
            .active
            .with_label_values(&[c, self.kind.label()])
            .dec();
        if !self.finished {
            // Ended without an outcome: an early upstream failure (or a panic): still counted.
            sessions
                .total
                .with_label_values(&[c, self.kind.label(), SessionOutcome::UpstreamError.label()])
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::upload::{FailureReason, UploadKind};
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn a_status_code_label_is_one_of_a_few_dozen_whatever_the_number() {
        let labels: BTreeSet<&str> = (0..=1000).chain([u16::MAX]).map(code_label).collect();
        let mut fixed: BTreeSet<&str> = NAMED_CODES.iter().map(|(_, l)| *l).collect();
        fixed.extend(["1xx", "2xx", "3xx", "4xx", "5xx", "other"]);
        assert_eq!(labels, fixed);
        assert!(labels.len() <= 40, "{labels:?}");
        for (code, label) in NAMED_CODES {
            assert_eq!(label, code.to_string());
            assert_eq!(code_label(code), label);
        }
        assert_eq!(code_label(418), "4xx");
        assert_eq!(code_label(599), "5xx");
        assert_eq!(code_label(600), "other");
        assert_eq!(code_label(999), "other");
        assert_eq!(code_label(42), "other");
    }

    /// Every label value in the rendered text, by label name (histograms' `le` left out).
    fn label_values(text: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((_, rest)) = line.split_once('{') else {
                continue;
            };
            let (labels, _) = rest.split_once('}').expect("closed label set");
            for pair in labels.split(',') {
                let (name, value) = pair.split_once('=').expect("name=value");
                if name != "le" {
                    seen.entry(name.to_owned())
                        .or_default()
                        .insert(value.trim_matches('"').to_owned());
                }
            }
        }
        seen
    }

    const KINDS: [SessionKind; 7] = [
        SessionKind::Exec,
        SessionKind::Attach,
        SessionKind::PortForwardTunnel,
        SessionKind::WebSocketRelay,
        SessionKind::SpdyRelay,
        SessionKind::PassThrough,
        SessionKind::KubeletRun,
    ];
    const OUTCOMES: [SessionOutcome; 10] = [
        SessionOutcome::Success,
        SessionOutcome::NonZeroExit,
        SessionOutcome::UpstreamError,
        SessionOutcome::ClientGone,
        SessionOutcome::ClientUnresponsive,
        SessionOutcome::UpstreamUnresponsive,
        SessionOutcome::IdleTimeout,
        SessionOutcome::RecordingFailed,
        SessionOutcome::Drained,
        SessionOutcome::Terminated,
    ];

    /// The configured clusters of these tests: the unnamed upstream and a named one.
    const CLUSTERS: [&str; 2] = ["default", "prod-eu"];

    /// Drives every way a label can be set with every value its source can take (all status
    /// codes 0–1000, odd methods, unknown reasons), for every configured cluster.
    fn set_every_label(m: &Metrics) {
        m.serving_certificate_reload(true);
        m.serving_certificate_reload(false);
        m.watch_session_memory(MemoryBudget::new(
            1,
            crate::session_memory::LaneLimits { floor: 1, cap: 1 },
        ));
        for reason in [
            HandshakeRejection::BadRequest,
            HandshakeRejection::UnknownCluster,
            HandshakeRejection::Misdirected,
        ] {
            m.unrouted_rejected(reason);
        }
        for cluster in CLUSTERS.map(ClusterLabel::new) {
            set_every_cluster_label(m, &cluster);
        }
        for reason in [
            ConnectionShed::RequestHeaderTimeout,
            ConnectionShed::IdleTimeout,
            ConnectionShed::TlsHandshakeFailed,
            ConnectionShed::AdminConnectionLimit,
            ConnectionShed::AdminIdleShed,
            ConnectionShed::PendingConnectionLimit,
            ConnectionShed::ResponseWriteTimeout,
        ] {
            m.connection_shed(reason);
        }
        let upload = m.upload_counters();
        for kind in UploadKind::ALL {
            upload.uploads.with_label_values(&[kind.label()]).inc();
        }
        for reason in FailureReason::ALL {
            upload.failures.with_label_values(&[reason.label()]).inc();
        }
    }

    /// [`set_every_label`] for the families with a `cluster`.
    fn set_every_cluster_label(m: &Metrics, cluster: &ClusterLabel) {
        m.cluster_configured(cluster);
        m.upstream_ready(cluster, true);
        let ended = m.memory_ends(cluster);
        ended(Limit::Session);
        ended(Limit::Budget);
        for kind in KINDS {
            for outcome in OUTCOMES {
                for form in [HandshakeForm::Http1Upgrade, HandshakeForm::ExtendedConnect] {
                    m.session_admitted(cluster, form, kind)
                        .finish(outcome, 1, 1);
                }
            }
        }
        for reason in [
            HandshakeRejection::BadRequest,
            HandshakeRejection::TooManySessions,
            HandshakeRejection::Draining,
            HandshakeRejection::Busy,
            HandshakeRejection::RefusedSessions,
            HandshakeRejection::NodeProxySession,
            HandshakeRejection::UnknownCluster,
            HandshakeRejection::Misdirected,
        ] {
            m.handshake_rejected(cluster, reason);
        }
        for reason in AUTH_REJECTION_REASONS.iter().copied().chain(["made_up"]) {
            m.auth_rejected(cluster, reason);
        }
        let methods = [
            "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "BREW", "X",
        ]
        .map(|m| http::Method::from_bytes(m.as_bytes()).unwrap());
        for code in 0..=1000 {
            m.upstream_upgrade_failure(cluster, code);
            for method in &methods {
                m.request(cluster, method, code, Duration::from_millis(1));
            }
        }
    }

    /// Each label's fixed set of values.
    fn allowed_label_values() -> BTreeMap<String, BTreeSet<String>> {
        let set = |values: &[&str]| {
            values
                .iter()
                .map(|v| v.to_string())
                .collect::<BTreeSet<_>>()
        };
        let mut codes: Vec<&str> = NAMED_CODES.iter().map(|(_, l)| *l).collect();
        codes.extend(["1xx", "2xx", "3xx", "4xx", "5xx", "other"]);
        let mut reasons = vec![
            "bad_request",
            "too_many_sessions",
            "draining",
            "busy",
            "refused_sessions",
            "node_proxy_session",
            "unknown_cluster",
            "misdirected",
            "request_header_timeout",
            "idle_timeout",
            "tls_handshake_failed",
            "admin_connection_limit",
            "admin_idle_shed",
            "pending_connection_limit",
            "response_write_timeout",
            "other",
        ];
        reasons.extend(AUTH_REJECTION_REASONS);
        reasons.extend(FailureReason::ALL.map(FailureReason::label));
        let mut kinds: Vec<&str> = KINDS.map(SessionKind::label).to_vec();
        kinds.extend(UploadKind::ALL.map(UploadKind::label));
        // The configured names, and nothing (counted before routing).
        let mut clusters = CLUSTERS.to_vec();
        clusters.push(UNROUTED);
        [
            ("cluster", set(&clusters)),
            ("kind", set(&kinds)),
            ("outcome", set(&OUTCOMES.map(SessionOutcome::label))),
            ("direction", set(&["up", "down"])),
            ("http_version", set(&["1.1", "2"])),
            ("result", set(&["reloaded", "ok", "failed"])),
            ("limit", set(&["session", "budget"])),
            ("reason", set(&reasons)),
            ("code", set(&codes)),
            (
                "method",
                set(&[
                    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other",
                ]),
            ),
        ]
        .into_iter()
        .map(|(name, values)| (name.to_owned(), values))
        .collect()
    }

    /// Sets every label with every value its source can take and checks each label stays in
    /// its set.
    #[test]
    fn every_label_comes_from_a_fixed_set() {
        let m = Metrics::new();
        set_every_label(&m);
        let text = String::from_utf8(m.render()).unwrap();
        let seen = label_values(&text);
        let allowed = allowed_label_values();
        // Every label the families use is one this test knows, and stays within its set.
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            allowed.keys().collect::<Vec<_>>(),
            "a label this test does not know: give it a fixed set and list it here"
        );
        for (name, values) in &seen {
            assert!(
                values.is_subset(&allowed[name]),
                "label {name}: {:?} outside the fixed set",
                values.difference(&allowed[name]).collect::<Vec<_>>()
            );
        }
        // 1,001 status codes times 9 methods make at most a few hundred series per cluster.
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        assert!(series < 1500 * CLUSTERS.len(), "{series} series");
    }

    #[tokio::test]
    async fn the_session_memory_families_read_the_budget() {
        let m = Metrics::new();
        let budget = MemoryBudget::new(
            1000,
            crate::session_memory::LaneLimits {
                floor: 100,
                cap: 2000,
            },
        );
        m.watch_session_memory(budget.clone());
        let (a, b) = (ClusterLabel::new("a"), ClusterLabel::new("b"));
        m.cluster_configured(&b);
        // A session of cluster a takes its lanes from a handle that counts its ends as a's.
        let lane = budget.counting(m.memory_ends(&a)).lane();
        let held = lane.try_take(400).unwrap();
        let _ = lane.none().grow_to(5000).await;
        for _ in 0..2 {
            let text = String::from_utf8(m.render()).unwrap();
            for want in [
                "kube_ws_proxy_session_memory_budget_bytes 1000",
                "kube_ws_proxy_session_memory_borrowed_bytes 300",
                "kube_ws_proxy_session_memory_held_bytes 400",
                r#"kube_ws_proxy_sessions_ended_by_memory_total{cluster="a",limit="session"} 1"#,
                r#"kube_ws_proxy_sessions_ended_by_memory_total{cluster="a",limit="budget"} 0"#,
                r#"kube_ws_proxy_sessions_ended_by_memory_total{cluster="b",limit="session"} 0"#,
            ] {
                assert!(text.contains(want), "missing {want} in\n{text}");
            }
        }
        drop(held);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("kube_ws_proxy_session_memory_held_bytes 0"));
    }

    #[test]
    fn families_render_and_move() {
        let m = Metrics::new();
        let (eu, us) = (ClusterLabel::new("prod-eu"), ClusterLabel::new("prod-us"));
        let g = m.session_admitted(&eu, HandshakeForm::ExtendedConnect, SessionKind::Exec);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains(r#"kube_ws_proxy_sessions_active{cluster="prod-eu",kind="exec"} 1"#),
            "{text}"
        );
        g.finish(SessionOutcome::NonZeroExit, 5, 7);
        m.upstream_upgrade_failure(&us, 403);
        m.handshake_rejected(&eu, HandshakeRejection::TooManySessions);
        m.unrouted_rejected(HandshakeRejection::UnknownCluster);
        m.auth_rejected(&us, "unauthenticated");
        m.request(&us, &http::Method::GET, 200, Duration::from_millis(3));
        m.request(
            &eu,
            &http::Method::from_bytes(b"BREW").unwrap(),
            404,
            Duration::from_millis(3),
        );
        m.upstream_ready(&eu, true);
        m.upstream_ready(&us, false);
        let text = String::from_utf8(m.render()).unwrap();
        for want in [
            r#"kube_ws_proxy_sessions_active{cluster="prod-eu",kind="exec"} 0"#,
            r#"kube_ws_proxy_sessions_total{cluster="prod-eu",kind="exec",outcome="non_zero_exit"} 1"#,
            r#"kube_ws_proxy_session_bytes_total{cluster="prod-eu",direction="up",kind="exec"} 5"#,
            r#"kube_ws_proxy_session_bytes_total{cluster="prod-eu",direction="down",kind="exec"} 7"#,
            r#"kube_ws_proxy_upstream_upgrade_failures_total{cluster="prod-us",code="403"} 1"#,
            r#"kube_ws_proxy_sessions_admitted_total{cluster="prod-eu",http_version="2"} 1"#,
            r#"kube_ws_proxy_handshake_rejections_total{cluster="prod-eu",reason="too_many_sessions"} 1"#,
            r#"kube_ws_proxy_handshake_rejections_total{cluster="",reason="unknown_cluster"} 1"#,
            r#"kube_ws_proxy_auth_rejections_total{cluster="prod-us",reason="unauthenticated"} 1"#,
            r#"kube_ws_proxy_http_requests_total{cluster="prod-us",code="200",method="GET"} 1"#,
            r#"kube_ws_proxy_http_requests_total{cluster="prod-eu",code="404",method="other"} 1"#,
            r#"kube_ws_proxy_http_request_duration_seconds_count{cluster="prod-us",method="GET"} 1"#,
            r#"kube_ws_proxy_session_duration_seconds_count{cluster="prod-eu",kind="exec"} 1"#,
            r#"kube_ws_proxy_upstream_ready{cluster="prod-eu"} 1"#,
            r#"kube_ws_proxy_upstream_ready{cluster="prod-us"} 0"#,
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        // A cluster no longer configured shows no readiness at all.
        m.retain_upstream_ready(|c| c == "prod-eu");
        let text = String::from_utf8(m.render()).unwrap();
        assert!(!text.contains(r#"kube_ws_proxy_upstream_ready{cluster="prod-us"}"#));
        assert!(text.contains(r#"kube_ws_proxy_upstream_ready{cluster="prod-eu"} 1"#));
    }

    #[test]
    fn last_reload_gauges_stay_down_until_a_reload_succeeds() {
        let m = Metrics::new();
        let gauges = |m: &Metrics| {
            let text = String::from_utf8(m.render()).unwrap();
            [
                "kube_ws_proxy_config_last_reload_successful",
                "kube_ws_proxy_serving_certificate_last_reload_successful",
            ]
            .map(|family| family_sum(&text, family))
        };
        assert_eq!(gauges(&m), [1, 1], "nothing reloaded yet");
        m.config_reload(false);
        m.serving_certificate_reload(false);
        assert_eq!(gauges(&m), [0, 0]);
        m.config_reload(false);
        assert_eq!(gauges(&m), [0, 0]);
        m.config_reload(true);
        m.serving_certificate_reload(true);
        assert_eq!(gauges(&m), [1, 1]);
    }

    /// The sum of every series of `family` (its counter or gauge values, all labels).
    fn family_sum(text: &str, family: &str) -> i64 {
        text.lines()
            .filter(|l| {
                l.strip_prefix(family)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as i64)
            .sum()
    }

    /// `sessions_admitted_total = sessions_total + sessions_active`, read from the rendered text.
    fn identity(m: &Metrics) -> (i64, i64, i64) {
        let text = String::from_utf8(m.render()).unwrap();
        (
            family_sum(&text, "kube_ws_proxy_sessions_admitted_total"),
            family_sum(&text, "kube_ws_proxy_sessions_total"),
            family_sum(&text, "kube_ws_proxy_sessions_active"),
        )
    }

    #[test]
    fn admitted_is_always_finished_plus_active_whatever_the_end() {
        let m = Metrics::new();
        let (a, b) = (ClusterLabel::new("a"), ClusterLabel::new("b"));
        let running = m.session_admitted(&a, HandshakeForm::Http1Upgrade, SessionKind::PassThrough);
        let mut relabelled =
            m.session_admitted(&b, HandshakeForm::ExtendedConnect, SessionKind::PassThrough);
        let (admitted, total, active) = identity(&m);
        assert_eq!((admitted, total, active), (2, 0, 2));
        // A path decided on the upstream's answer moves the running session to its kind.
        relabelled.relabel(SessionKind::Exec);
        assert_eq!(relabelled.kind(), SessionKind::Exec);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains(r#"kube_ws_proxy_sessions_active{cluster="b",kind="exec"} 1"#));
        assert!(text.contains(
            r#"kube_ws_proxy_sessions_active{cluster="a",kind="websocket_pass_through"} 1"#
        ));
        assert!(text.contains(
            r#"kube_ws_proxy_sessions_active{cluster="b",kind="websocket_pass_through"} 0"#
        ));
        relabelled.finish(SessionOutcome::ClientGone, 0, 0);
        // Dropped without an outcome (a panic): still counted once.
        drop(m.session_admitted(&a, HandshakeForm::Http1Upgrade, SessionKind::SpdyRelay));
        let (admitted, total, active) = identity(&m);
        assert_eq!((admitted, total, active), (3, 2, 1));
        drop(running);
        let (admitted, total, active) = identity(&m);
        assert_eq!(admitted, total + active);
        assert_eq!(active, 0);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains(
            r#"kube_ws_proxy_sessions_total{cluster="b",kind="exec",outcome="client_gone"} 1"#
        ));
    }
}
