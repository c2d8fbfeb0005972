//! Command-line interface. Every flag can also be set from the environment
//! (`KUBE_WS_PROXY_<FLAG>`); a flag on the command line wins over the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::audit::recording::RecordPolicy;
pub use crate::proxy::auth::AuthMode;
use crate::proxy::upstream_source::UpstreamFlags;
pub use crate::proxy::upstream_streaming::UpstreamStreaming;

/// kube-ws-proxy gives every Kubernetes cluster WebSocket streaming: it terminates kubectl's
/// WebSocket exec/attach (v5.channel.k8s.io) and port-forward (SPDY/3.1+portforward.k8s.io)
/// connections and re-originates them as SPDY/3.1 towards API servers that only speak SPDY.
/// Everything else is reverse-proxied unchanged.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ws-proxy",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands besides the default (serving).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a simulated SPDY-only cluster and the proxy in front of it, write a kubeconfig and
    /// print kubectl commands to try.
    Demo(DemoArgs),
    /// Run only the simulated SPDY-only cluster (an old API server + kubelet on loopback).
    /// Boxed: its many flags would make every `Command` large.
    SimCluster(Box<SimArgs>),
}

/// Flags of the proxy itself.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the main listener: the Kubernetes API as clients see it.
    #[arg(long, env = "KUBE_WS_PROXY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Address of the admin listener serving /healthz and /readyz. Separate from the main
    /// listener because /healthz there belongs to the upstream API server.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_ADMIN_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    pub admin_listen: SocketAddr,

    /// Most connections the admin listener serves at once (probes, scrapes); beyond it a new
    /// connection is closed as soon as it is accepted. The admin listener also has the main
    /// listener's `--request-header-timeout`, `--idle-connection-timeout` and
    /// `--max-request-header-bytes`, so silent connections to it cannot take the descriptors
    /// the main listener needs.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_ADMIN_MAX_CONNECTIONS",
        default_value_t = crate::proxy::admin::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub admin_max_connections: u32,

    /// YAML file with any of these flags as `flag-name: value` (lists for repeated values).
    /// Precedence: command line, then environment, then this file, then the defaults.
    #[arg(long, env = "KUBE_WS_PROXY_CONFIG")]
    pub config: Option<PathBuf>,

    /// URL of the upstream API server (or kubelet), e.g. https://10.0.0.1:6443. One of
    /// `--upstream`, `--kubeconfig` and `--in-cluster` is required.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM", conflicts_with_all = ["kubeconfig", "in_cluster"])]
    pub upstream: Option<String>,

    /// Take the upstream (server, CA, TLS server name) and the proxy's own credentials (client
    /// certificate, token, token file) from this kubeconfig.
    #[arg(long, env = "KUBE_WS_PROXY_KUBECONFIG", conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,

    /// Context of `--kubeconfig` to use instead of its current context.
    #[arg(long, env = "KUBE_WS_PROXY_CONTEXT", requires = "kubeconfig")]
    pub context: Option<String>,

    /// Run against the cluster the proxy's pod is in: KUBERNETES_SERVICE_HOST/PORT, the
    /// service-account CA, and its token (re-read when the kubelet rotates it).
    #[arg(long, env = "KUBE_WS_PROXY_IN_CLUSTER")]
    pub in_cluster: bool,

    /// Where `--in-cluster` finds `token` and `ca.crt`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_SERVICE_ACCOUNT_DIR",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount"
    )]
    pub service_account_dir: PathBuf,

    /// PEM file with the CA certificates that sign the upstream's serving certificate.
    /// Without it, the system's web PKI roots are used.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<PathBuf>,

    /// Do not verify the upstream's TLS certificate. Insecure: for experiments only.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_INSECURE_SKIP_TLS_VERIFY")]
    pub upstream_insecure_skip_tls_verify: bool,

    /// The proxy's own bearer token for the upstream, read from this file and re-read when it
    /// changes. Used in impersonate mode and for TokenReviews; never in passthrough mode.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_TOKEN_FILE")]
    pub upstream_token_file: Option<PathBuf>,

    /// The proxy's own client certificate for the upstream (PEM). Used in impersonate mode and
    /// for TokenReviews; never in passthrough mode.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_CLIENT_CERT_FILE",
        requires = "upstream_client_key_file"
    )]
    pub upstream_client_cert_file: Option<PathBuf>,

    /// Private key of `--upstream-client-cert-file` (PEM).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_UPSTREAM_CLIENT_KEY_FILE",
        requires = "upstream_client_cert_file"
    )]
    pub upstream_client_key_file: Option<PathBuf>,

    /// Who the caller is. `passthrough`: the caller's credentials go upstream unchanged.
    /// `impersonate`: the proxy authenticates the caller (client certificate or TokenReview) and
    /// impersonates it with its own credentials. `front-proxy`: the proxy authenticates the
    /// caller and asserts it with X-Remote-* headers over its front-proxy client certificate.
    #[arg(long, env = "KUBE_WS_PROXY_AUTH_MODE", value_enum, default_value_t = AuthMode::Passthrough)]
    pub auth_mode: AuthMode,

    /// How v5 exec/attach and the port-forward tunnel go upstream. `spdy`: translated to SPDY
    /// (clusters before 1.31, paths that carry SPDY). `websocket`: passed through unchanged, for
    /// clusters that serve them (1.31+ with TranslateStreamCloseWebsocketRequests and
    /// PortForwardWebsockets). `auto`: WebSocket first, SPDY when the upstream refuses the
    /// upgrade the way an old cluster does; what worked is remembered for 10 minutes. SPDY
    /// clients (kubectl ≤ 1.30) are relayed, or translated to WebSocket under `websocket`, and
    /// under `auto` once the path refuses SPDY.
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_STREAMING", value_enum, default_value_t = UpstreamStreaming::Auto)]
    pub upstream_streaming: UpstreamStreaming,

    /// Front-proxy client certificate (PEM), signed by the API server's
    /// `--requestheader-client-ca-file` CA; required in front-proxy mode.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_CLIENT_CERT_FILE",
        requires = "front_proxy_client_key_file"
    )]
    pub front_proxy_client_cert_file: Option<PathBuf>,

    /// Private key of `--front-proxy-client-cert-file` (PEM).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_FRONT_PROXY_CLIENT_KEY_FILE",
        requires = "front_proxy_client_cert_file"
    )]
    pub front_proxy_client_key_file: Option<PathBuf>,

    /// Header carrying the user name in front-proxy mode (the API server's
    /// `--requestheader-username-headers`).
    #[arg(long, env = "KUBE_WS_PROXY_FRONT_PROXY_USERNAME_HEADER", default_value = "X-Remote-User", value_parser = parse_header_name)]
    pub front_proxy_username_header: http::HeaderName,

    /// Header carrying the groups in front-proxy mode (`--requestheader-group-headers`).
    #[arg(long, env = "KUBE_WS_PROXY_FRONT_PROXY_GROUP_HEADER", default_value = "X-Remote-Group", value_parser = parse_header_name)]
    pub front_proxy_group_header: http::HeaderName,

    /// Prefix of the extra-attribute headers in front-proxy mode
    /// (`--requestheader-extra-headers-prefix`).
    #[arg(long, env = "KUBE_WS_PROXY_FRONT_PROXY_EXTRA_HEADER_PREFIX", default_value = "X-Remote-Extra-", value_parser = parse_header_name)]
    pub front_proxy_extra_header_prefix: http::HeaderName,

    /// How long a TokenReview answer is reused for the same token (rejections: at most 2 s).
    #[arg(long, env = "KUBE_WS_PROXY_AUTHENTICATION_CACHE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub authentication_cache_ttl: Duration,

    /// Largest WebSocket message accepted from a client, in bytes (the reference server
    /// closes the connection above 32 MiB).
    #[arg(long, env = "KUBE_WS_PROXY_MAX_MESSAGE_SIZE", default_value_t = 32 * 1024 * 1024)]
    pub max_message_size: usize,

    /// How often translated sessions send an SPDY PING upstream, so idle sessions survive
    /// middleboxes between the proxy and the cluster (0: never).
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_PING_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub upstream_ping_interval: Duration,

    /// How long after a ping was due the upstream of a translated session may stay silent
    /// before the session is ended with a Status saying the upstream stopped answering
    /// (0: never).
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_PING_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub upstream_ping_timeout: Duration,

    /// How often WebSocket sessions (translated, port-forward tunnels, and relayed ones:
    /// pass-through and legacy protocols, between the upstream's frames) send a ping to the
    /// client, so gateways that cut idle connections see traffic (browsers never ping on their
    /// own). 0: never.
    #[arg(long, env = "KUBE_WS_PROXY_CLIENT_PING_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub client_ping_interval: Duration,

    /// How long after a ping was due a client may stay silent before it counts as gone: its
    /// session ends and the upstream streams are reset (0: never).
    #[arg(long, env = "KUBE_WS_PROXY_CLIENT_PING_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub client_ping_timeout: Duration,

    /// A streaming session (exec, attach, port-forward, relayed or translated) that carries no
    /// data either way for this long is ended; pings do not count. Followed logs are exempt,
    /// as in the kubelet's `--streaming-connection-idle-timeout`, the model. 0: never.
    #[arg(long, env = "KUBE_WS_PROXY_STREAM_IDLE_TIMEOUT", default_value = "4h", value_parser = parse_duration)]
    pub stream_idle_timeout: Duration,

    /// Write an audit event (a JSON line) when each streaming session starts and ends: exec,
    /// attach, cp, port-forward and followed logs, on every path. A file path, or `-` for
    /// stdout. Off by default.
    #[arg(long, env = "KUBE_WS_PROXY_AUDIT_LOG")]
    pub audit_log: Option<String>,

    /// Rotate the audit log file before it grows past this many bytes (suffixes Ki, Mi, Gi).
    #[arg(long, env = "KUBE_WS_PROXY_AUDIT_LOG_MAX_SIZE", default_value = "100Mi", value_parser = parse_bytes)]
    pub audit_log_max_size: u64,

    /// Rotated audit log files to keep (`PATH.1` is the newest); 0: the file is emptied instead.
    #[arg(long, env = "KUBE_WS_PROXY_AUDIT_LOG_MAX_BACKUPS", default_value_t = 5)]
    pub audit_log_max_backups: usize,

    /// Record exec and attach sessions as asciicast v2 files in `--record-dir`: `off`,
    /// `best-effort` (a session whose recording cannot start or fails goes on), `required` (a
    /// session that cannot be recorded is refused, one whose recording fails is ended).
    #[arg(long, env = "KUBE_WS_PROXY_RECORD", value_enum, default_value_t = RecordPolicy::Off)]
    pub record: RecordPolicy,

    /// Where recordings go, one file per session (`<UTC start>_<session id>.cast`).
    #[arg(long, env = "KUBE_WS_PROXY_RECORD_DIR")]
    pub record_dir: Option<PathBuf>,

    /// Record what clients type too (input events). Off by default: stdin can hold passwords.
    #[arg(long, env = "KUBE_WS_PROXY_RECORD_STDIN")]
    pub record_stdin: bool,

    /// Free space `--record-dir`'s filesystem must keep, in bytes (`64Mi`): a session whose
    /// recording would start below it is refused under `--record=required` and goes on
    /// unrecorded under `best-effort`, so a nearly full disk is found before a session starts
    /// rather than in its middle. `0` turns the check off.
    #[arg(long, env = "KUBE_WS_PROXY_RECORD_MIN_FREE", default_value = "64Mi", value_parser = parse_bytes_or_zero)]
    pub record_min_free: u64,

    /// TCP keepalive on client and upstream sockets: how long a connection may carry nothing
    /// before the first probe; probes follow every third of it, and a peer that answers none of
    /// three is dropped (after about twice this). The only liveness check byte relays have.
    /// 0: off.
    #[arg(long, env = "KUBE_WS_PROXY_TCP_KEEPALIVE", default_value = "30s", value_parser = parse_duration)]
    pub tcp_keepalive: Duration,

    /// How long a session's final status and Close may take to reach a client that stopped
    /// reading, and then how long to wait for the client's Close before the connection is
    /// dropped (reading on prevents truncated output). On relays: how long one direction may
    /// go on after the other ended.
    #[arg(long, env = "KUBE_WS_PROXY_CLOSE_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub close_drain_timeout: Duration,

    /// Most streaming sessions (exec, attach, port-forward, relayed upgrades) running at once;
    /// beyond it new ones get 429 with a Kubernetes Status and Retry-After. Unlimited if unset.
    #[arg(long, env = "KUBE_WS_PROXY_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,

    /// On SIGTERM: how long running sessions may continue (the listener is closed and /readyz
    /// unready at once); after it, each is ended with a Status on its error channel and Close,
    /// relays are cut, and the process exits 0. Keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "KUBE_WS_PROXY_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// How often memory the proxy has freed is given back to the operating system (glibc's
    /// `malloc_trim`), so RSS follows the sessions running rather than the last burst of them.
    /// 0: never (the allocator then gives memory back only when it sees fit).
    #[arg(long, env = "KUBE_WS_PROXY_MEMORY_TRIM_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub memory_trim_interval: Duration,

    /// PEM certificate chain for TLS on the main listener. Re-read when the file changes
    /// (rotation without restart). Without it the main listener speaks plain HTTP.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key for `--tls-cert-file`.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,

    /// PEM CA bundle: client certificates signed by it are accepted on the TLS listener (and
    /// identify the caller in impersonate and front-proxy modes: CN is the user, O the groups).
    /// Connections without a client certificate are still accepted; untrusted ones are not.
    #[arg(long, env = "KUBE_WS_PROXY_CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub client_ca_file: Option<PathBuf>,

    /// Longest time to dial the upstream (TCP and TLS).
    #[arg(long, env = "KUBE_WS_PROXY_UPSTREAM_DIAL_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub upstream_dial_timeout: Duration,

    /// Longest wait for the upstream's answer to an upgrade (SPDY or relayed, and the exec
    /// streams it opens), for a TokenReview, for the body of a client's upgrade request, and for
    /// a client's WebSocket upgrade to complete after the proxy accepted it.
    #[arg(long, env = "KUBE_WS_PROXY_HANDSHAKE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// Longest time from a client's connection (TLS handshake included) to its first complete
    /// request head, and for every later request head; slower connections are closed.
    #[arg(long, env = "KUBE_WS_PROXY_REQUEST_HEADER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_header_timeout: Duration,

    /// How long a client connection (HTTP/1.1 keep-alive or HTTP/2) with no request in flight
    /// stays open. A watch or followed log is a request in flight, however quiet.
    #[arg(long, env = "KUBE_WS_PROXY_IDLE_CONNECTION_TIMEOUT", default_value = "90s", value_parser = parse_duration)]
    pub idle_connection_timeout: Duration,

    /// Let HTTP/2 clients (browsers, HTTP/2-only gateways) open WebSockets as streams of one
    /// TLS connection (RFC 8441 extended CONNECT, advertised in the HTTP/2 SETTINGS), on the
    /// same paths, subprotocols, authentication and limits as HTTP/1.1 upgrades; each session
    /// counts against `--max-sessions`. `false`: HTTP/2 clients open their WebSockets over
    /// HTTP/1.1 connections, as before.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_HTTP2_WEBSOCKETS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub http2_websockets: bool,

    /// The proxy sits behind a proxy or load balancer it trusts that sets `X-Forwarded-For`:
    /// keep the client's `X-Forwarded-For` and append the peer's address to it, keep its
    /// `X-Real-Ip` and `Forwarded`, and charge TokenReviews to the last address in
    /// `X-Forwarded-For`. Without it (the default), a caller's own `X-Forwarded-For` is
    /// replaced by its address and its `X-Real-Ip` and `Forwarded` are removed, so it cannot
    /// choose what the API server records as the request's source.
    #[arg(long, env = "KUBE_WS_PROXY_TRUST_X_FORWARDED_FOR")]
    pub trust_x_forwarded_for: bool,

    /// TokenReviews one caller address may cause per second, sustained (impersonate and
    /// front-proxy modes). Cached tokens cost nothing; beyond it callers get 429.
    #[arg(long, env = "KUBE_WS_PROXY_TOKEN_REVIEW_RATE", default_value_t = 10.0)]
    pub token_review_rate: f64,

    /// TokenReviews one caller address may cause in a burst above `--token-review-rate`.
    #[arg(long, env = "KUBE_WS_PROXY_TOKEN_REVIEW_BURST", default_value_t = 50)]
    pub token_review_burst: u32,

    /// TokenReviews of one caller address in flight at once.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_TOKEN_REVIEW_MAX_IN_FLIGHT",
        default_value_t = 8
    )]
    pub token_review_max_in_flight: usize,

    /// Largest request head (request line and headers) accepted from a client, in bytes;
    /// larger ones are refused with 431. At least 8192.
    #[arg(long, env = "KUBE_WS_PROXY_MAX_REQUEST_HEADER_BYTES", default_value_t = 64 * 1024)]
    pub max_request_header_bytes: usize,

    /// Most bytes of upgrade request bodies held at once, all callers together (one body is at
    /// most 1 MiB; kubectl sends none). An upgrade whose body would go past it is refused with
    /// 503.
    #[arg(long, env = "KUBE_WS_PROXY_UPGRADE_BODY_BUDGET", default_value_t = 16 * 1024 * 1024)]
    pub upgrade_body_budget: usize,

    /// Most client connections waiting for a request head at once: from the accept (TLS
    /// handshake included) to the first complete head, and while idle between requests. Each
    /// may hold an unfinished head of up to `--max-request-header-bytes` before anyone knows
    /// who sent it; beyond the cap the connection that has waited longest is closed.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_MAX_PENDING_CONNECTIONS",
        default_value_t = crate::proxy::waiting_connections::DEFAULT_MAX_PENDING,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_pending_connections: u32,

    /// Log format.
    #[arg(long, env = "KUBE_WS_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Flags of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address of the proxy in the demo.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Where to write the demo kubeconfig.
    #[arg(long, default_value = "kube-ws-proxy-demo.kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Streaming protocols of the simulated cluster: `spdy-only`, `new`, `websocket-only`
    /// (see `sim-cluster --streaming`).
    #[arg(long, default_value = "spdy-only")]
    pub sim_streaming: crate::sim::SimStreaming,
}

/// Flags of `sim-cluster`. Authentication flags are named like kube-apiserver's; with any of
/// `--require-token`, `--token-user`, `--client-ca-file` or `--requestheader-client-ca-file`
/// every request must authenticate (else 401).
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Loopback address of the simulated cluster.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Require a bearer token on every request; this one authenticates as user `sim-user`.
    #[arg(long)]
    pub require_token: Option<String>,
    /// A bearer token and its user: `TOKEN=NAME[:GROUP,GROUP...]`. Repeatable.
    #[arg(long = "token-user", value_name = "TOKEN=NAME[:GROUPS]")]
    pub token_users: Vec<crate::sim::SimUser>,
    /// A user allowed to impersonate anyone (Impersonate-* headers). Repeatable.
    #[arg(long = "impersonator", value_name = "NAME")]
    pub impersonators: Vec<String>,
    /// PEM serving certificate chain: serve HTTPS.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key for `--tls-cert-file`.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// PEM CA bundle: client certificates it signs authenticate (user = CN, groups = O).
    #[arg(long, requires = "tls_cert_file")]
    pub client_ca_file: Option<PathBuf>,
    /// PEM CA bundle of front proxies: a client certificate it signs makes the
    /// request-header user headers count.
    #[arg(long, requires = "tls_cert_file")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names a front-proxy certificate may have (comma list); empty: any.
    #[arg(long, value_delimiter = ',', requires = "requestheader_client_ca_file")]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers naming the user behind a front proxy (comma list); the first non-empty counts.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying the groups behind a front proxy (comma list).
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes behind a front proxy (comma list).
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Which streaming protocols the cluster speaks: `spdy-only` (an old cluster), `new` (a
    /// 1.31+ API server that also serves v5 exec/attach and the port-forward tunnel itself) or
    /// `websocket-only` (`new` behind a path that answers SPDY upgrades with 400).
    #[arg(long, default_value = "spdy-only")]
    pub streaming: crate::sim::SimStreaming,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses an HTTP header name (case-insensitive; stored lowercase).
pub fn parse_header_name(s: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(s.trim().as_bytes())
        .map_err(|_| format!("invalid header name {s:?}"))
}

/// `None` for a zero duration (a setting turned off).
pub fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl ServeArgs {
    /// The flags that locate the upstream, for [`resolve`](crate::proxy::upstream_source::resolve).
    pub fn upstream_flags(&self) -> UpstreamFlags {
        UpstreamFlags {
            upstream: self.upstream.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            in_cluster: self.in_cluster,
            service_account_dir: self.service_account_dir.clone(),
            upstream_ca_file: self.upstream_ca_file.clone(),
            upstream_insecure_skip_tls_verify: self.upstream_insecure_skip_tls_verify,
            upstream_token_file: self.upstream_token_file.clone(),
            upstream_client_cert_file: self.upstream_client_cert_file.clone(),
            upstream_client_key_file: self.upstream_client_key_file.clone(),
        }
    }
}

/// Parses a byte count: `1048576`, `512Ki`, `100Mi`, `1Gi`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, factor) = match s.find(|c: char| !c.is_ascii_digit()) {
        None => (s, 1),
        Some(i) => {
            let factor = match &s[i..] {
                "Ki" => 1 << 10,
                "Mi" => 1 << 20,
                "Gi" => 1 << 30,
                other => return Err(format!("unknown size unit {other:?} (use Ki, Mi or Gi)")),
            };
            (&s[..i], factor)
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    n.checked_mul(factor)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?} is not a positive byte count"))
}

/// Parses a byte count as [`parse_bytes`] does, or `0` (a limit turned off).
pub fn parse_bytes_or_zero(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        other => parse_bytes(other),
    }
}

/// Parses `500ms`, `5s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("512Ki").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("100Mi").unwrap(), 100 << 20);
        assert_eq!(parse_bytes("2Gi").unwrap(), 2 << 30);
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("10MB").is_err());
        assert!(parse_bytes("Mi").is_err());
    }

    #[test]
    fn sim_cluster_flags() {
        let cli = Cli::try_parse_from([
            "kube-ws-proxy",
            "sim-cluster",
            "--tls-cert-file",
            "c.pem",
            "--tls-private-key-file",
            "k.pem",
            "--requestheader-client-ca-file",
            "fp.pem",
            "--requestheader-allowed-names",
            "front-proxy,aggregator",
            "--token-user",
            "t1=alice:dev,ops",
            "--token-user",
            "t2=bob",
            "--impersonator",
            "alice",
        ])
        .unwrap();
        let Some(Command::SimCluster(a)) = cli.command else {
            panic!("not sim-cluster");
        };
        assert_eq!(a.requestheader_allowed_names, ["front-proxy", "aggregator"]);
        assert_eq!(a.requestheader_username_headers, ["X-Remote-User"]);
        assert_eq!(a.requestheader_extra_headers_prefix, ["X-Remote-Extra-"]);
        assert_eq!(a.token_users.len(), 2);
        assert_eq!(a.token_users[0].groups, ["dev", "ops"]);
        assert_eq!(a.impersonators, ["alice"]);
        assert!(
            Cli::try_parse_from(["kube-ws-proxy", "sim-cluster", "--client-ca-file", "x"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["kube-ws-proxy", "sim-cluster", "--token-user", "x"]).is_err()
        );
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
