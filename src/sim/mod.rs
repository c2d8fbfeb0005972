//! A simulated **Kubernetes cluster** on loopback: by default what an old (1.28-era) SPDY-only
//! API server plus kubelet look like to kubectl and to the proxy; with
//! [`SimConfig::streaming`] a 1.31+ API server that serves v5 and the port-forward tunnel
//! itself ([`SimStreaming::New`]), or that behind a path that refuses SPDY
//! ([`SimStreaming::WebSocketOnly`]). Used by integration tests and by `kube-ws-proxy demo`.
//!
//! # Streaming modes ([`SimStreaming`])
//!
//! * `SpdyOnly` (default): as described below; v5 and tunnel offers are refused the way an old
//!   cluster refuses them (bare 403 from the kubelet's WebSocket handshake; 400
//!   `query parameter "port" is required` from its legacy port-forward handler).
//! * `New`: additionally, a WebSocket exec/attach offering `v5.channel.k8s.io` is served as
//!   kube-apiserver's translator serves it: v5 chosen wherever it is in the offer, ready
//!   message, stdin/stdout/stderr/resize channels, the CLOSE signal `FF 00` ends the process's
//!   stdin (`FF 04` ends resizing, a malformed one ends the session), JSON Status on channel 3,
//!   Close 1000; a kubelet error (`error500-*`) comes inside the WebSocket as an InternalError
//!   Status. A port-forward WebSocket offering `SPDY/3.1+portforward.k8s.io` is the tunnel:
//!   accepted with that subprotocol, then the same SPDY port-forward server runs over the
//!   messages' bytes. [`SimEvent::SessionStarted`] names the protocol each session used.
//! * `WebSocketOnly`: `New`, but every `Upgrade: SPDY/3.1` request is answered
//!   `400 Bad Request` (text/plain) before authentication, as a gateway that drops SPDY does.
//!
//! # What it serves
//!
//! * Plain HTTP, or HTTPS with [`SimConfig::tls`] (rustls; ALPN `h2` for plain API calls and
//!   `http/1.1`, which every upgrade below uses).
//! * Discovery and reads, as JSON: `/version`, `/api`, `/apis`, `/api/v1`, namespaces, pods
//!   (any pod name is a Running pod with containers `main` and `sidecar`; lists show `sim-pod`
//!   plus every pod touched so far), `/healthz`, `/readyz`, `/livez`. Server-side printing
//!   (`as=Table`) for pods and namespaces. Unknown paths → 404 Status.
//! * `authentication.k8s.io/v1` (listed in `/apis`): `POST tokenreviews` answers (201) whether
//!   `spec.token` is a known token and whose, and counts the reviews
//!   ([`SimCluster::token_reviews`]); `POST selfsubjectreviews` answers (201) with the caller's
//!   effective identity (`kubectl auth whoami`). Any authenticated caller may create both (no
//!   RBAC here).
//! * `authorization.k8s.io/v1`: `POST subjectaccessreviews` (only by
//!   [`SimConfig::access_reviewers`]) and `POST selfsubjectaccessreviews` (anyone), answered
//!   from [`SimConfig::access_policy`] and recorded ([`SimCluster::access_reviews`];
//!   src/sim/access.rs).
//! * `pods/{pod}/exec` and `/attach` over **SPDY/3.1** (versions v4, v3, v2, v1 — never v5) and
//!   over the **legacy WebSocket** protocols an old kubelet serves (`v4.channel.k8s.io`,
//!   `v4.base64.channel.k8s.io`, `channel.k8s.io`, `base64.channel.k8s.io`, none). In the
//!   default `SpdyOnly` mode `v5` and `SPDY/3.1+…` WebSocket offers get a bare 403, so
//!   kubectl ≥ 1.29 falls back to SPDY.
//!   Exec runs the command as a **real local process** in a per-pod scratch directory
//!   (`<scratch>/<namespace>/<pod>`; relative paths in `kubectl cp` land there, absolute paths
//!   are the host's). `tty=true` uses a pseudo-terminal that follows resize events.
//!   Attach bridges to one long-running process per (namespace, pod, container) that answers
//!   each input line `l` with `attached: l`.
//! * `pods/{pod}/portforward` over SPDY (`portforward.k8s.io`) and legacy WebSocket
//!   (`ports=`, `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, none): dials `127.0.0.1:<port>`.
//! * `nodes/sim-node/proxy/{exec,attach,portForward,run}/...`: the kubelet's own API, as the
//!   API server's node proxy reaches it (src/sim/kubelet.rs): the same exec, attach and
//!   port-forward over SPDY and the legacy WebSocket protocols, with the kubelet's paths and
//!   options, and `run` (a POST that runs a command to its end and answers its output).
//! * `pods/{pod}/log`: plain (chunked) and WebSocket (`binary.k8s.io`, `base64.binary.k8s.io`);
//!   lines `log line N`, N = 1..=10, and with `follow=true` one more line every 200 ms up to 300;
//!   `limitBytes` ends a plain log after that many bytes.
//! * `pods?watch=true` (namespaced or not): a watch, `ADDED` then `MODIFIED` events of the pods
//!   (src/sim/watch.rs).
//!
//! # Authentication and impersonation
//!
//! Without any authenticator configured every request is `system:anonymous`
//! (`system:unauthenticated`). With one (`require_bearer_token`, `users`, a client CA in
//! `tls`, or `front_proxy`) each request is authenticated like kube-apiserver does it, first
//! match wins, and otherwise answered 401 (a Status) on every path:
//!
//! 1. **Request-header** ([`SimFrontProxy`]): a client certificate that verifies against the
//!    front-proxy CA (whose CN is allowed) plus a user header (`X-Remote-User`): groups from
//!    `X-Remote-Group`, extras from `X-Remote-Extra-<key>`. Without the user header it does not
//!    apply. `X-Remote-*` headers on any other connection are never trusted.
//! 2. **x509**: a client certificate of the client CA: user = CN, groups = O values. Client
//!    certificates are optional; one of an unknown CA fails the TLS handshake.
//! 3. **Bearer token** (`Authorization` or the WebSocket bearer subprotocol entry): a
//!    [`SimUser`], or `require_bearer_token` (user `sim-user`).
//!
//! Every authenticated user is also in `system:authenticated`. Then `Impersonate-User`,
//! `-Group` and `-Extra-<key>`: allowed for the users in `impersonators` (the identity becomes
//! the impersonated one), else 403 with kube-apiserver's wording; groups or extras without a
//! user are a 400. Each [`SeenRequest`] records the effective user, the caller as
//! authenticated, the authenticator and whether it was impersonated. Exec'd processes get
//! `SIM_USER` and `SIM_GROUPS` (comma-joined) of the effective identity; `forbidden-*` pods name
//! it in their 403.
//!
//! # A slow cluster
//!
//! [`SimConfig::delays`] holds streaming requests (after the API server's checks, before
//! anything starts) and reviews for a while before they are answered, so that a test can hang
//! up while the proxy waits on each.
//!
//! # Fault-injection pods (by name prefix, on exec, attach, portforward and log)
//!
//! * `forbidden-*`: 403 Forbidden JSON Status before any upgrade.
//! * `error500-*`: 500 `text/plain` "container runtime is not responding" (a kubelet error).
//! * `denied-*` (exec, attach, portforward): 403 Forbidden JSON Status from an admission
//!   webhook, its message longer than 64 KiB and ending with `end of denial`.
//!
//! A path with a `%` not followed by two hex digits (`%zz`) is answered as Go's `net/http`
//! answers a request line it cannot parse: `400`, `text/plain`, body `400 Bad Request`,
//! connection closed (before authentication; on any path, streaming ones included).
//! * `dying-*`: the upgrade and the streams succeed, the command runs, and right after its
//!   first output chunk (exec/attach) or the first bytes from the local port (port-forward) the
//!   TCP connection is shut down abruptly: no status, no GOAWAY, no WebSocket Close.
//!
//! # Failures of the command itself
//!
//! Exit code N ≠ 0 → `NonZeroExitCode` with the kubelet's wording (PROTOCOL.md §1.6). A command
//! that cannot be started is reported like containerd/runc do: Failure, reason `InternalError`,
//! code 500, message `Internal error occurred: error executing command in container: failed to
//! exec in container: ... exec: "<cmd>": executable file not found in $PATH: unknown`
//! (kubectl prints it and exits 1).

mod access;
mod authn;
mod exec;
mod http;
mod identity;
mod impersonation;
mod kill;
mod kubelet;
mod logs;
mod objects;
mod peer_cert;
mod portforward;
mod process;
mod query;
mod resize;
mod response;
mod reviews;
mod spdy;
mod status;
mod streaming;
mod subprotocols;
mod tls;
mod tunnel;
mod watch;
mod websocket;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use access::{SeenAccessReview, SimAccessRule, SimReviewKind, SimSubject};
pub use authn::SimFrontProxy;
pub use identity::{
    AuthenticatedBy, SimIdentity, SimUser, SimUserParseError, ANONYMOUS_USER, AUTHENTICATED_GROUP,
    REQUIRED_TOKEN_USER, UNAUTHENTICATED_GROUP,
};
pub use objects::{CONTAINERS, NODE_NAME};
pub use streaming::{SimStreaming, SimStreamingParseError};
pub use tls::{SimTls, SimTlsError};

/// How many requests and events are kept for inspection (oldest dropped first).
const RECORD_LIMIT: usize = 10_000;

/// Configuration of a [`SimCluster`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Where to listen; must be a loopback address. Port 0 picks a free port.
    pub listen: SocketAddr,
    /// Root of the per-pod working directories. `None`: a fresh directory under the system
    /// temp dir, removed again by [`SimCluster::shutdown`].
    pub scratch_dir: Option<PathBuf>,
    /// A bearer token (`Authorization: Bearer <token>` or the WebSocket bearer subprotocol
    /// entry) that authenticates as user `sim-user`. Turns authentication on.
    pub require_bearer_token: Option<String>,
    /// Serve HTTPS instead of HTTP; with a client CA, client certificates authenticate.
    pub tls: Option<SimTls>,
    /// Bearer tokens and the users they stand for. Turns authentication on when not empty.
    pub users: Vec<SimUser>,
    /// Users allowed to impersonate anyone (`Impersonate-*` headers); everyone else gets 403.
    pub impersonators: Vec<String>,
    /// What SubjectAccessReviews and SelfSubjectAccessReviews allow (default: nothing, but
    /// to `system:masters`).
    pub access_policy: Vec<SimAccessRule>,
    /// Users allowed to create SubjectAccessReviews; everyone else gets 403.
    pub access_reviewers: Vec<String>,
    /// Request-header (front-proxy) authentication; needs `tls`. Turns authentication on.
    pub front_proxy: Option<SimFrontProxy>,
    /// Which streaming protocols the cluster speaks (default: an old SPDY-only cluster).
    pub streaming: SimStreaming,
    /// How long an exec's command waits, once its streams are set up, before it starts: a
    /// random time between half of this and this. A container runtime takes 10–20 ms to start
    /// a process in a container, so the default is 20 ms: a client that reads its connection
    /// before it is ready for the output (kubectl ≤ 1.33's WebSocket executor) meets the same
    /// race here as against a real cluster. Zero starts it at once (benchmarks).
    pub exec_start_delay: Duration,
    /// How long a slow cluster takes before it answers (default: no delay), for tests that
    /// hang up while the proxy waits on it.
    pub delays: SimDelays,
}

/// How long the simulated cluster holds requests before it answers them: a slow API server or
/// kubelet. Zero (the default) answers at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimDelays {
    /// Every streaming request (an exec, attach or port-forward upgrade, a log), after the
    /// API server's checks and before anything of it starts or is answered.
    pub streaming: Duration,
    /// Every TokenReview, SelfSubjectReview and access review.
    pub reviews: Duration,
}

/// [`SimConfig::exec_start_delay`]'s default.
pub const EXEC_START_DELAY: Duration = Duration::from_millis(20);

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            scratch_dir: None,
            require_bearer_token: None,
            tls: None,
            users: Vec::new(),
            impersonators: Vec::new(),
            access_policy: Vec::new(),
            access_reviewers: Vec::new(),
            front_proxy: None,
            streaming: SimStreaming::SpdyOnly,
            delays: SimDelays::default(),
            exec_start_delay: EXEC_START_DELAY,
        }
    }
}

/// Why a [`SimCluster`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimStartError {
    #[error("the simulated cluster only listens on loopback addresses, not {0}")]
    NotLoopback(SocketAddr),
    #[error("front-proxy authentication needs TLS (SimConfig::tls)")]
    FrontProxyWithoutTls,
    #[error(transparent)]
    Tls(#[from] SimTlsError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// One HTTP request as the simulated cluster received it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// All headers, names lowercase, in arrival order (`authorization` included).
    pub headers: Vec<(String, String)>,
    /// Who the request acted as (the impersonated user, if any); `None` when it was refused
    /// (401, or impersonation refused with 400/403).
    pub user: Option<SimIdentity>,
    /// The authenticator that accepted the caller; `None` for a 401.
    pub authenticated_by: Option<AuthenticatedBy>,
    /// The caller as authenticated, before impersonation; `None` for a 401.
    pub authenticated_user: Option<SimIdentity>,
    /// Whether `user` is an impersonated identity.
    pub impersonated: bool,
}

impl SeenRequest {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether this was an upgrade request (SPDY or WebSocket).
    pub fn is_upgrade(&self) -> bool {
        self.header("upgrade").is_some()
    }
}

/// Which streaming subresource a session served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionKind {
    Exec,
    Attach,
    PortForward,
    Log,
}

/// How a session was carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Spdy,
    WebSocket,
    /// A plain HTTP response (logs without WebSocket).
    Http,
}

/// Something that happened inside the simulated cluster, for tests to assert on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEvent {
    /// A streaming session was upgraded (or a log stream started).
    SessionStarted {
        session: u64,
        kind: SessionKind,
        transport: Transport,
        /// Negotiated protocol: the SPDY `X-Stream-Protocol-Version` (`v4.channel.k8s.io`,
        /// `portforward.k8s.io`) or the WebSocket subprotocol (`v5.channel.k8s.io`,
        /// `SPDY/3.1+portforward.k8s.io`, `v4.channel.k8s.io`, `""` for none).
        protocol: String,
        namespace: String,
        pod: String,
    },
    /// A process was started for an exec, or an attach connected to its container process.
    ProcessStarted {
        session: u64,
        container: String,
        command: Vec<String>,
        tty: bool,
    },
    /// The session's stdin ended (SPDY FIN/RST on `stdin`) and the process's stdin was closed
    /// (pipes) or sent Ctrl-D (tty), or the session was cancelled (its connection went) while
    /// its stdin was open: the process's input closed with it. Attach: the session stopped
    /// feeding the container.
    StdinClosed { session: u64 },
    /// The exec'd process ended (exit code) or could not be started (`None`).
    ProcessExited {
        session: u64,
        exit_code: Option<i32>,
    },
    /// A port-forward connection to the local port was attempted.
    PortForwardDialed { session: u64, port: u16, ok: bool },
    /// A forwarded connection finished.
    PortForwardClosed {
        session: u64,
        port: u16,
        bytes_to_pod: u64,
        bytes_from_pod: u64,
    },
    /// The session is over. `reason`: `completed`, `client gone`, `dying pod`,
    /// `stream creation timeout`, `shutdown` or an error text.
    SessionEnded { session: u64, reason: String },
}

/// State shared by every connection of one simulated cluster.
pub(crate) struct Inner {
    pub config: SimConfig,
    pub addr: SocketAddr,
    pub started: SystemTime,
    pub scratch: PathBuf,
    pub shutdown: CancellationToken,
    tls: Option<tls::TlsServing>,
    token_reviews: AtomicUsize,
    next_session: AtomicU64,
    records: Mutex<Records>,
    notify: Notify,
    pub attach: Mutex<HashMap<(String, String, String), Arc<exec::AttachProc>>>,
}

#[derive(Default)]
struct Records {
    requests: VecDeque<SeenRequest>,
    access_reviews: VecDeque<SeenAccessReview>,
    events: VecDeque<SimEvent>,
    pods: BTreeSet<(String, String)>,
    namespaces: BTreeSet<String>,
}

impl Inner {
    fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count_token_review(&self) {
        self.token_reviews.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_access_review(&self, r: SeenAccessReview) {
        let mut rec = self.records();
        if rec.access_reviews.len() >= RECORD_LIMIT {
            rec.access_reviews.pop_front();
        }
        rec.access_reviews.push_back(r);
    }

    pub(crate) fn next_session(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn record_request(&self, r: SeenRequest) {
        let mut rec = self.records();
        if rec.requests.len() >= RECORD_LIMIT {
            rec.requests.pop_front();
        }
        rec.requests.push_back(r);
    }

    pub(crate) fn event(&self, e: SimEvent) {
        tracing::debug!(event = ?e, "sim event");
        {
            let mut rec = self.records();
            if rec.events.len() >= RECORD_LIMIT {
                rec.events.pop_front();
            }
            rec.events.push_back(e);
        }
        self.notify.notify_waiters();
    }

    /// Remembers a pod (and its namespace) so that lists show it.
    pub(crate) fn touch_pod(&self, namespace: &str, pod: &str) {
        let mut rec = self.records();
        if rec.pods.len() < RECORD_LIMIT {
            rec.pods.insert((namespace.to_string(), pod.to_string()));
        }
        if rec.namespaces.len() < RECORD_LIMIT {
            rec.namespaces.insert(namespace.to_string());
        }
    }

    pub(crate) fn touch_namespace(&self, namespace: &str) {
        let mut rec = self.records();
        if rec.namespaces.len() < RECORD_LIMIT {
            rec.namespaces.insert(namespace.to_string());
        }
    }

    /// Pods to list: `sim-pod` in every listed namespace plus every pod touched so far.
    pub(crate) fn pods(&self, namespace: Option<&str>) -> Vec<(String, String)> {
        let rec = self.records();
        let mut set: BTreeSet<(String, String)> = rec.pods.clone();
        let namespaces: Vec<String> = match namespace {
            Some(ns) => vec![ns.to_string()],
            None => Self::namespace_set(&rec).into_iter().collect(),
        };
        for ns in namespaces {
            set.insert((ns, "sim-pod".to_string()));
        }
        set.into_iter()
            .filter(|(ns, _)| namespace.is_none_or(|want| want == ns))
            .collect()
    }

    pub(crate) fn namespaces(&self) -> Vec<String> {
        Self::namespace_set(&self.records()).into_iter().collect()
    }

    fn namespace_set(rec: &Records) -> BTreeSet<String> {
        let mut set = rec.namespaces.clone();
        for ns in ["default", "kube-node-lease", "kube-public", "kube-system"] {
            set.insert(ns.to_string());
        }
        set
    }

    /// The working directory of a pod's processes (created on demand).
    pub(crate) fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        self.scratch.join(namespace).join(pod)
    }
}

/// A running simulated cluster. Dropping it stops it too (without waiting); prefer
/// [`SimCluster::shutdown`].
pub struct SimCluster {
    inner: Arc<Inner>,
    accept: Option<JoinHandle<()>>,
    owns_scratch: bool,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("addr", &self.inner.addr)
            .field("scratch", &self.inner.scratch)
            .finish()
    }
}

static SCRATCH_COUNTER: AtomicU64 = AtomicU64::new(0);

impl SimCluster {
    /// Binds the listener and starts serving. Fails for a non-loopback `listen` address and
    /// for unusable TLS material.
    pub async fn start(config: SimConfig) -> Result<SimCluster, SimStartError> {
        if !config.listen.ip().is_loopback() {
            return Err(SimStartError::NotLoopback(config.listen));
        }
        let tls = match &config.tls {
            Some(t) => Some(tls::serving(
                t,
                config
                    .front_proxy
                    .as_ref()
                    .map(|f| f.requestheader_client_ca_pem.as_str()),
            )?),
            None if config.front_proxy.is_some() => {
                return Err(SimStartError::FrontProxyWithoutTls)
            }
            None => None,
        };
        let (scratch, owns_scratch) = match &config.scratch_dir {
            Some(dir) => (dir.clone(), false),
            None => {
                let nanos = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0);
                let name = format!(
                    "kube-ws-proxy-sim-{}-{}-{nanos:08x}",
                    std::process::id(),
                    SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed)
                );
                (std::env::temp_dir().join(name), true)
            }
        };
        std::fs::create_dir_all(&scratch)?;
        let scratch = scratch.canonicalize().unwrap_or(scratch);
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            config,
            addr,
            started: SystemTime::now(),
            scratch,
            shutdown: CancellationToken::new(),
            tls,
            token_reviews: AtomicUsize::new(0),
            next_session: AtomicU64::new(0),
            records: Mutex::new(Records::default()),
            notify: Notify::new(),
            attach: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn(http::accept_loop(inner.clone(), listener));
        tracing::info!(%addr, scratch = %inner.scratch.display(), streaming = %inner.config.streaming, "simulated cluster listening");
        Ok(SimCluster {
            inner,
            accept: Some(accept),
            owns_scratch,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:<port>`, or `https://…` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// Which streaming protocols this cluster speaks.
    pub fn streaming(&self) -> SimStreaming {
        self.inner.config.streaming
    }

    /// How many TokenReviews were answered so far.
    pub fn token_reviews(&self) -> usize {
        self.inner.token_reviews.load(Ordering::Relaxed)
    }

    /// Root of the per-pod working directories.
    pub fn scratch_dir(&self) -> &Path {
        &self.inner.scratch
    }

    /// Working directory of the processes of one pod (exists once something ran there).
    pub fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        self.inner.pod_dir(namespace, pod)
    }

    /// A kubeconfig (YAML) pointing at this cluster, with the required bearer token (else the
    /// first configured user's token, if any). With TLS the serving chain is the
    /// `certificate-authority-data` (Go's verifier accepts a pool member as the anchor).
    pub fn kubeconfig(&self) -> String {
        let config = &self.inner.config;
        let token = config
            .require_bearer_token
            .as_deref()
            .or_else(|| config.users.first().map(|u| u.token.as_str()));
        let user = match token {
            Some(t) => format!(
                "    token: \"{}\"\n",
                t.replace('\\', "\\\\").replace('"', "\\\"")
            ),
            None => "    {}\n".to_string(),
        };
        let ca = match &config.tls {
            Some(t) => {
                use base64::Engine;
                format!(
                    "    certificate-authority-data: {}\n",
                    base64::engine::general_purpose::STANDARD.encode(&t.cert_chain_pem)
                )
            }
            None => String::new(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n{}contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n  user:\n{}",
            self.url(),
            ca,
            user
        )
    }

    /// Every request received so far (oldest first, at most the last 10 000).
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.inner.records().requests.iter().cloned().collect()
    }

    /// Every access review answered so far (oldest first, at most the last 10 000); refused
    /// ones (403, 400) are not among them.
    pub fn access_reviews(&self) -> Vec<SeenAccessReview> {
        self.inner
            .records()
            .access_reviews
            .iter()
            .cloned()
            .collect()
    }

    /// Every event so far (oldest first, at most the last 10 000).
    pub fn events(&self) -> Vec<SimEvent> {
        self.inner.records().events.iter().cloned().collect()
    }

    /// Waits until an event matching `pred` has been recorded (including earlier ones) and
    /// returns it; `None` after `timeout`.
    pub async fn wait_for_event(
        &self,
        timeout: Duration,
        pred: impl Fn(&SimEvent) -> bool,
    ) -> Option<SimEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.inner.records().events.iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Stops accepting, ends every session (killing their processes) and the attach targets,
    /// and removes the scratch directory if the cluster created it.
    pub async fn shutdown(mut self) {
        self.inner.shutdown.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
            let _ = accept.await;
        }
        // Sessions notice the token at once; give them a moment to kill and reap.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while tokio::time::Instant::now() < deadline && !self.inner.attach_all_gone() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if self.owns_scratch {
            let _ = tokio::fs::remove_dir_all(&self.inner.scratch).await;
            self.owns_scratch = false;
        }
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.inner.shutdown.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        // A cluster dropped without `shutdown` (a test's end, a panic) must not leave its pods'
        // files behind: a test run starts hundreds of clusters, some with hundreds of MiB each.
        // Processes still running there lose only their directory entry, not open files.
        if self.owns_scratch {
            let _ = std::fs::remove_dir_all(&self.inner.scratch);
        }
    }
}
